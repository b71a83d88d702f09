"""When a build is expected to end, with what that rests on: the projection a deadline decides by.

An ETA (:mod:`trt_otel.core.eta`) is for people: a best guess that may be rough. A projection is
for a decision that throws work away, so it says how sure it is:

- **history**: the earlier builds of the same build (``--history``, matched by
  :func:`~trt_otel.core.eta.same_build`) that passed the last phase boundary this build passed:
  how long they still took from there, scaled by this build's pace so far. Their spread is kept:
  ``earliest_s`` is where the fastest of them would put this build's end.
- **progress**: only once half of the build's steps are done (TensorRT decides later phases' steps
  as it goes and times its tactics inside one step, so an earlier ratio says little), as
  ``elapsed / ratio``. It has no spread of its own and runs late (at half its steps a simulated
  build has spent some 80% of its time), so its ``earliest_s`` counts only
  :data:`PROGRESS_EARLIEST` of the time it says is left.

With neither there is no projection: a deadline is then a timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

from trt_otel.core.durations import format_duration
from trt_otel.core.eta import START, BoundaryTracker, History
from trt_otel.core.state import BuildState

TRUSTED_PROGRESS = 0.5
"""The share of a build's steps that must be done before its progress alone projects its end."""
MIN_PROGRESS_ELAPSED_S = 5.0
"""...and the time it must have run (a few seconds of steps say little of an hour)."""
PROGRESS_EARLIEST = 0.15
"""The share of the time progress says is left that its earliest end counts: measured on
simulated builds at three paces (tests/test_deadline.py), the earliest end then stays under 1.07
times the real one, inside the deadline's 10% margin."""


@dataclass(frozen=True, slots=True)
class Projection:
    """Seconds from the build's start to its expected end, and to the earliest end that what
    it rests on allows."""

    expected_s: float
    earliest_s: float
    basis: str
    """``history`` or ``progress``."""
    evidence: str
    """What it rests on, for a reason: ``5 earlier builds: 38m-44m``."""

    def describe(self) -> str:
        """``expected to end at 41m (5 earlier builds: 38m-44m)``."""
        return f"expected to end at {format_duration(self.expected_s)} ({self.evidence})"


def before_start(history: History | None) -> Projection | None:
    """A build's projection before it starts: its history's durations, as they were."""
    totals = history.totals() if history is not None else None
    if history is None or totals is None:
        return None
    fastest, median, slowest = totals
    return Projection(median, fastest, "history", _builds(len(history.builds), fastest, slowest))


def project(
    state: BuildState, tracker: BoundaryTracker, now_mono_ns: int, history: History | None
) -> Projection | None:
    """The projection of an open build at ``now_mono_ns``, or None where nothing trustworthy
    says when it will end."""
    if state.start_mono_ns is None or state.outcome is not None:
        return None
    elapsed_s = (now_mono_ns - state.start_mono_ns) / 1e9
    if history is not None:
        projected = _from_history(history, tracker, elapsed_s)
        if projected is not None:
            return projected
    return _from_progress(state.progress_ratio(), elapsed_s)


def _from_history(
    history: History, tracker: BoundaryTracker, elapsed_s: float
) -> Projection | None:
    boundary_s = tracker.boundaries.get(tracker.last, 0) / 1e9
    spread = history.remaining_spread(tracker.last, boundary_s)
    if spread is None:
        return None
    since_boundary_s = elapsed_s - boundary_s
    expected = elapsed_s + max(0.0, spread.median_s - since_boundary_s)
    earliest = elapsed_s + max(0.0, spread.fastest_s - since_boundary_s)
    totals = history.totals()
    assert totals is not None  # a build passed the boundary
    evidence = _builds(len(history.builds), totals[0], totals[2])
    if tracker.last != START and abs(spread.scale - 1.0) >= 0.1:
        evidence += f"; this one at {spread.scale:.1f}x their time so far"
    return Projection(expected, earliest, "history", evidence)


def _from_progress(ratio: float, elapsed_s: float) -> Projection | None:
    if ratio < TRUSTED_PROGRESS or ratio >= 1.0 or elapsed_s < MIN_PROGRESS_ELAPSED_S:
        return None
    expected = elapsed_s / ratio
    earliest = elapsed_s + (expected - elapsed_s) * PROGRESS_EARLIEST
    evidence = f"{ratio:.0%} of its steps done in {format_duration(elapsed_s)}"
    return Projection(expected, earliest, "progress", evidence)


def _builds(count: int, fastest_s: float, slowest_s: float) -> str:
    took = (
        format_duration(fastest_s)
        if format_duration(fastest_s) == format_duration(slowest_s)
        else f"{format_duration(fastest_s)}-{format_duration(slowest_s)}"
    )
    return f"{count} earlier build{'s' if count != 1 else ''}: {took}"
