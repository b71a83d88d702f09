"""The gaps between a build's callbacks: where its silent windows were, folded by the read model.

TensorRT can go minutes without calling back. Every gap of at least :data:`MIN_GAP_NS` between
two progress events (the build's start and end, a phase's start, step or finish) is kept, with
the innermost phase open through it, as a candidate silent window: how long a gap must be to
count as silent depends on the build's length, which is known only when it is drawn. The longest
:data:`MAX_GAPS` are kept, in time order, so a crafted journal of a million gaps costs no more
than a real build.

A pure fold of the events' times (no clock): a journal replayed gives the same gaps as the live
build.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from trt_otel.core.state import BuildState

MIN_GAP_NS = 1_000_000_000
"""Gaps between callbacks kept as candidate silent windows."""
MAX_GAPS = 200


@dataclass(frozen=True, slots=True)
class Gap:
    """A time with no callback, on the clock of the process that recorded the build."""

    start_ns: int
    end_ns: int
    phase: str | None
    """The innermost phase open through it (None: no phase was open)."""

    @property
    def length_ns(self) -> int:
        return self.end_ns - self.start_ns


class Gaps:
    """The longest gaps of one build, in time order, and its first event's time. (Its latest
    progress is its state's: :attr:`~trt_otel.core.state.BuildState.last_progress_mono_ns`.)"""

    __slots__ = ("_ends", "_kept", "first_ns", "latest_end_ns")

    def __init__(self) -> None:
        self._kept: list[Gap] = []
        self._ends: list[int] = []
        """``end_ns`` of each kept gap, for the gaps that overlap a phase."""
        self.first_ns: int | None = None
        """The ``mono_ns`` of the build's first event (its origin where it has no start)."""
        self.latest_end_ns = -1
        """The latest kept gap's end (-1: none): no gap overlaps what starts at or after it."""

    def seen(self, mono_ns: int) -> None:
        """Any event of the build."""
        if self.first_ns is None:
            self.first_ns = mono_ns

    def progressed(self, last_ns: int | None, mono_ns: int, state: BuildState) -> None:
        """A progress event at ``mono_ns``, the build's previous one at ``last_ns`` (None: it
        is the first); ``state`` as it was before it was folded (so its open phases are those
        open through the gap it ends). A caller may leave out a progress event that follows
        the previous one by less than :data:`MIN_GAP_NS` (most steps): it ends no gap."""
        if last_ns is None:
            if self.first_ns is None:  # a step first: the read model folds it unseen
                self.first_ns = mono_ns
        elif mono_ns - last_ns >= MIN_GAP_NS:
            self._keep(Gap(last_ns, mono_ns, deepest_open(state)))

    def _keep(self, gap: Gap) -> None:
        kept = self._kept
        if len(kept) >= MAX_GAPS:
            shortest = min(range(len(kept)), key=lambda i: kept[i].length_ns)
            if gap.length_ns <= kept[shortest].length_ns:
                return
            del kept[shortest]
            del self._ends[shortest]
        kept.append(gap)  # gaps come in time order: the list stays sorted
        self._ends.append(gap.end_ns)
        self.latest_end_ns = gap.end_ns

    @property
    def kept(self) -> list[Gap]:
        """The gaps kept, in time order (a copy)."""
        return list(self._kept)

    def overlapping(self, start_ns: int, end_ns: int) -> list[tuple[Gap, int]]:
        """The kept gaps that overlap ``[start_ns, end_ns]``, each with how much of it."""
        ends = self._ends
        if not ends or ends[-1] <= start_ns:  # most phases: none since it began (ends ascend)
            return []
        found = []
        for gap in self._kept[bisect.bisect_right(ends, start_ns) :]:
            if gap.start_ns >= end_ns:
                break
            found.append((gap, min(end_ns, gap.end_ns) - max(start_ns, gap.start_ns)))
        return found


def deepest_open(state: BuildState) -> str | None:
    """The deepest open phase (the first started of the deepest, where threads nest alike)."""
    best = None
    phases = state.phases
    for phase_id in state.open_by_name.values():
        phase = phases[phase_id]
        if best is None or phase.depth > best.depth:
            best = phase
    return None if best is None else best.name
