"""The gaps between a build's callbacks (:mod:`trt_otel.core.gaps`): which are kept, which are
left out once the bound is reached, and how much of a phase each covers."""

from __future__ import annotations

from trt_otel import BuildMonitor, ManualClock
from trt_otel.core.gaps import MAX_GAPS, MIN_GAP_NS, Gaps, deepest_open
from trt_otel.core.state import BuildState

S = 1_000_000_000


def progress(gaps: Gaps, state: BuildState, *times_ns: int, last_ns: int | None = None) -> int:
    """Progress events at ``times_ns``, after one at ``last_ns``; the last one's time."""
    for at in times_ns:
        gaps.progressed(last_ns, at, state)
        last_ns = at
    assert last_ns is not None
    return last_ns


def test_a_gap_of_a_second_is_kept_and_a_shorter_one_is_not() -> None:
    gaps, state = Gaps(), BuildState()
    # A callback within the second (short), then one exactly a second later:
    progress(gaps, state, 0, MIN_GAP_NS - 1, 2 * MIN_GAP_NS - 1)
    assert [(g.start_ns, g.end_ns) for g in gaps.kept] == [(MIN_GAP_NS - 1, 2 * MIN_GAP_NS - 1)]


def test_past_the_bound_the_longest_gaps_are_kept_in_time_order() -> None:
    """One gap more than the bound, each a little longer than the last but one that is the
    shortest of all: that one is left out, and a later gap shorter than every kept one is
    not kept."""
    gaps, state = Gaps(), BuildState()
    at = progress(gaps, state, 0)
    lengths = [10 * S + i for i in range(MAX_GAPS)]
    lengths[5] = 2 * S  # the shortest
    for length in [*lengths, 3 * S, 11 * S + MAX_GAPS]:
        at = progress(gaps, state, at + length, last_ns=at)
    kept = [gap.length_ns for gap in gaps.kept]
    assert len(kept) == MAX_GAPS
    assert 2 * S not in kept and 3 * S not in kept
    assert kept[-1] == 11 * S + MAX_GAPS, "the longest, last, is kept"
    assert kept[:5] == lengths[:5] and kept[5] == lengths[6]
    starts = [gap.start_ns for gap in gaps.kept]
    assert starts == sorted(starts)
    first = gaps.kept[0]
    progress(gaps, state, at + first.length_ns, last_ns=at)  # as the shortest kept: not kept
    assert gaps.kept[0] == first and len(gaps.kept) == MAX_GAPS


def test_the_overlap_of_a_phase_with_each_gap() -> None:
    gaps, state = Gaps(), BuildState()
    progress(gaps, state, 0, 2 * S, 3 * S, 7 * S)  # gaps 0-2 s and 3-7 s (2-3 s too: a second)
    overlaps = [(g.start_ns // S, part // S) for g, part in gaps.overlapping(1 * S, 5 * S)]
    assert overlaps == [(0, 1), (2, 1), (3, 2)]
    assert [(g.start_ns // S, part // S) for g, part in gaps.overlapping(1 * S, 3 * S)] == [
        (0, 1),
        (2, 1),
    ], "a gap that begins as the phase ends is not in it"
    assert gaps.overlapping(7 * S, 9 * S) == []


def test_a_gap_with_two_phases_open_at_the_deepest_level_is_in_the_first_started() -> None:
    """Two children of one phase open at once (two threads): the gap ending now is in the one
    that started first, however many open after it at the same depth."""
    clock = ManualClock()
    monitor = BuildMonitor(backend="none", clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    monitor.phase_start("Timing tactics", "Building engine", 1)
    monitor.phase_start("Optimizing graph", "Building engine", 1)
    assert deepest_open(monitor.state) == "Timing tactics"
    gaps = Gaps()
    gaps.progressed(0, 2 * S, monitor.state)
    assert [gap.phase for gap in gaps.kept] == ["Timing tactics"]
    monitor.close()
