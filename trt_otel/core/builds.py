"""The builds of one log, one after another: where every fold of a build's state cuts.

A log, and so a journal, can hold several builds: ``trt-otel run`` records every engine its
program builds, and a retry ladder (``--retry``) records each attempt as a build of its own,
each from its ``build_start`` with an id of its own. A :class:`~trt_otel.core.state.BuildState`
folds one build; whatever folds a log that may hold several cuts it here, the same way
everywhere: a new build begins at each ``build_start`` after the first, and what comes before
the first (a log line) is the first build's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from trt_otel.core.events import BuildStarted, Event

Fold = TypeVar("Fold")


def builds_of(events: Iterable[Event]) -> list[list[Event]]:
    """A log's events, one list per build, in order."""
    builds: list[list[Event]] = [[]]
    cut = BuildCut()
    for event in events:
        if cut.begins_another(event):
            builds.append([])
        builds[-1].append(event)
    return [build for build in builds if build]


class BuildCut:
    """Says which events begin another build of a log, seen in order."""

    __slots__ = ("number",)

    def __init__(self) -> None:
        self.number = 0
        """The build the latest event belongs to: 1 from the first ``build_start`` (0 before)."""

    def begins_another(self, event: Event) -> bool:
        """Whether ``event`` begins a build after the first (and so ends the one before)."""
        if type(event) is not BuildStarted:
            return False
        self.number += 1
        return self.number > 1


class PerBuild(Generic[Fold]):
    """One fold per build of a log: :attr:`current` is the latest build's, a fresh one (made by
    ``new``) from each ``build_start`` after the first. Earlier builds' folds are let go: a
    caller that keeps something of them takes it in ``on_next`` first."""

    __slots__ = ("_cut", "_new", "_on_next", "current")

    def __init__(self, new: Callable[[], Fold], on_next: Callable[[Fold], None] | None = None):
        self._new = new
        self._on_next = on_next
        self._cut = BuildCut()
        self.current = new()

    @property
    def number(self) -> int:
        """The current build's number in the log: 1 from the first ``build_start``."""
        return self._cut.number

    def fold_for(self, event: Event) -> Fold:
        """The fold ``event`` goes into, begun afresh if it begins another build."""
        if self._cut.begins_another(event):
            if self._on_next is not None:
                self._on_next(self.current)
            self.current = self._new()
        return self.current
