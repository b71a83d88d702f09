"""A deadline: the build must end within a time, and is stopped as soon as it cannot.

A timeout waits for its limit to pass, and so spends all of it on a build that history already
says will miss. A :class:`Deadline` asks a projection (:mod:`trt_otel.core.projection`) when the
build will end, and decides by one rule, the **margin rule**:

    stop the build early only when even its *earliest* projected end (the fastest matching
    earlier build, scaled by this build's pace so far) is past the deadline by more than the
    margin (10% of the deadline by default).

The earliest end, not the expected one, and a margin on top: an early stop throws work away, so
it is taken only when the build would miss even if it went as well as the best of its history
did. A build the rule lets run still stops at the deadline itself, as a timeout would: the
deadline is never passed. With no projection (no history, too little progress) that is all it
does. A build whose history says before it starts that it cannot fit is refused
(:meth:`Deadline.before_start`): nothing is spent on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trt_otel.control import defaults
from trt_otel.control.policies import BuildView, Decision, Policy
from trt_otel.control.registry import DeadlineConfig, PolicyContext, required
from trt_otel.core.durations import format_duration
from trt_otel.core.eta import History
from trt_otel.core.events import CancelSource
from trt_otel.core.projection import Projection, before_start

DEFAULT_MARGIN = defaults.DEFAULT_MARGIN

Projector = Callable[[int], Projection | None]
"""The build's projection at a monotonic time (a read model's :meth:`project`)."""


class Deadline(Policy):
    """Stop the build once the margin rule says it cannot end within ``seconds`` (outcome
    ``timeout``), and at ``seconds`` in any case."""

    source = CancelSource.DEADLINE

    def __init__(
        self,
        seconds: float,
        *,
        margin: float = DEFAULT_MARGIN,
        project: Projector | None = None,
        at_start: Projection | None = None,
    ) -> None:
        """``project``: the build's projection while it runs; ``at_start``: what its history
        says before it starts (either None where there is none)."""
        if not seconds > 0:
            raise ValueError("a deadline must be later than 0s")
        if not 0 <= margin <= 10:
            raise ValueError("a deadline's margin is a share of it, from 0 to 10 (1000%)")
        self.limit_ns = round(seconds * 1e9)
        self.margin = margin
        self._project = project
        self._at_start = at_start

    def describe(self) -> str:
        limit = format_duration(self.limit_ns / 1e9)
        return f"deadline({limit}, margin {self.margin:.0%})"

    def cannot_fit(self, projection: Projection | None) -> bool:
        """The margin rule."""
        limit_s = self.limit_ns / 1e9
        return projection is not None and projection.earliest_s > limit_s * (1 + self.margin)

    def before_start(self) -> Decision | None:
        if not self.cannot_fit(self._at_start):
            return None
        assert self._at_start is not None
        return Decision(f"{self._said(self._at_start)}; not started", self.source, timeout=True)

    def check(self, view: BuildView) -> Decision | None:
        if view.start_mono_ns is None:
            return None
        elapsed_ns = view.now_mono_ns - view.start_mono_ns
        if elapsed_ns >= self.limit_ns:
            limit = format_duration(self.limit_ns / 1e9)
            return Decision(f"the build ran past its deadline of {limit}", self.source, True)
        projection = self._project(view.now_mono_ns) if self._project is not None else None
        if not self.cannot_fit(projection):
            return None
        assert projection is not None
        stopped = format_duration(elapsed_ns / 1e9)
        return Decision(f"{self._said(projection)}; stopped at {stopped}", self.source, True)

    def _said(self, projection: Projection) -> str:
        return f"{projection.describe()}, after the {format_duration(self.limit_ns / 1e9)} deadline"


FitAnswerWord = Literal["yes", "no", "maybe", "unknown"]


@dataclass(frozen=True, slots=True)
class Fit:
    """Whether a build would end within a deadline, from its history alone (nothing built)."""

    answer: FitAnswerWord
    """``yes`` (every earlier build did), ``no`` (the margin rule would refuse it), ``maybe``
    (some did, some did not), ``unknown`` (no earlier build)."""
    reason: str
    within: int
    """Earlier builds that ended within the deadline."""
    builds: int
    projection: Projection | None


def would_fit(history: History | None, seconds: float, *, margin: float = DEFAULT_MARGIN) -> Fit:
    """What ``--deadline seconds`` would make of a build with ``history``, before it starts."""
    limit = format_duration(seconds)
    projection = before_start(history)
    if history is None or projection is None:
        return Fit("unknown", "no earlier build of this model to go by", 0, 0, None)
    within = sum(1 for build in history.builds if build.total_s <= seconds)
    count = len(history.builds)
    said = f"{projection.describe()}; {within} of {count} ended within {limit}"
    deadline = Deadline(seconds, margin=margin, at_start=projection)
    if deadline.before_start() is not None:
        return Fit("no", f"{said}: --deadline {limit} would refuse it", within, count, projection)
    return Fit("yes" if within == count else "maybe", said, within, count, projection)


def make_deadline(config: DeadlineConfig, context: PolicyContext) -> Deadline:
    """A deadline projecting the build's end from ``context`` (without it, a timeout)."""
    return Deadline(
        required(config.deadline_s),
        margin=config.deadline_margin,
        project=context.project,
        at_start=before_start(context.history),
    )
