"""The timeline's rows, folded as phases close from the read model's forgetting fold, equal
the rows read off the whole phase tree of a fold that forgets nothing, for any sequence of
callbacks: TensorRT's skipped steps, early finishes, reused names, a parent's step while a child
is open, silent windows, memory samples; at the end and at any moment of a running build."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trt_otel import BuildMonitor, ManualClock
from trt_otel.core.events import Event, ProcessSample
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState, PhaseStatus
from trt_otel.views.report.model import BuildRecorder, report_of, silence_threshold_s
from trt_otel.views.report.rows import MAX_ROWS, RowFold

NAMES = ["Building engine", "Timing tactics", "Measuring tactic time", "Optimizing graph"]
NAME = st.sampled_from(NAMES)
CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), NAME, st.one_of(st.none(), NAME), st.integers(1, 6)),
        st.tuples(st.just("step"), NAME, st.integers(0, 6)),
        st.tuples(st.just("finish"), NAME),
        st.tuples(st.just("wait"), st.sampled_from([0.001, 0.2, 1.5, 4.0, 12.0])),
        st.tuples(st.just("sample"), st.integers(1, 10**9)),
    ),
    max_size=80,
)


def build(calls: list[tuple[Any, ...]], *, end: bool = True) -> list[Event]:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    for call in calls:
        clock.advance(0.01)
        if call[0] == "start":
            monitor.phase_start(call[1], call[2], call[3])
        elif call[0] == "step":
            monitor.step_complete(call[1], call[2])
        elif call[0] == "finish":
            monitor.phase_finish(call[1])
        elif call[0] == "wait":
            clock.advance(call[1])
        else:
            monitor.sample(ProcessSample, pid=1, status="running", rss_bytes=call[1])
    if end:
        monitor.end()
    return monitor.log.recent()


def tree_rows(
    events: list[Event], now_ns: int | None = None
) -> dict[tuple[str, ...], tuple[Any, ...]]:
    """The rows of the whole tree, walked: every phase of a fold that forgets nothing, its
    self time from all its children, its silent time from the windows of the whole build."""
    state = BuildState()
    progress: list[int] = []
    rss: list[tuple[int, int]] = []
    for event in events:
        if event.type in ("build_start", "phase_start", "step", "phase_finish", "build_end"):
            progress.append(event.mono_ns)
        if isinstance(event, ProcessSample) and event.rss_bytes is not None:
            rss.append((event.mono_ns, event.rss_bytes))
        state.apply(event)
    assert state.start_mono_ns is not None
    origin = state.start_mono_ns
    end_ns = state.end_mono_ns
    if end_ns is None:
        end_ns = max(events[-1].mono_ns, now_ns or 0)
        progress.append(end_ns)
    gaps = [(a, b) for a, b in itertools.pairwise(progress) if b - a >= 1e9]
    threshold = silence_threshold_s((end_ns - origin) / 1e9) * 1e9
    windows = [(a, b) for a, b in gaps if b - a >= threshold]
    rows: dict[tuple[str, ...], list[Any]] = {}
    paths: dict[int, tuple[str, ...]] = {}
    for phase in state.walk():
        path = (*(paths[phase.parent_id] if phase.parent_id is not None else ()), phase.name)
        paths[phase.id] = path
        finish = phase.finish_mono_ns if phase.finish_mono_ns is not None else end_ns
        covered = union(
            (state.phases[c].start_mono_ns, state.phases[c].finish_mono_ns or end_ns)
            for c in phase.children
        )
        silent = sum(max(0, min(finish, b) - max(phase.start_mono_ns, a)) for a, b in windows)
        low = bisect.bisect_left(rss, (phase.start_mono_ns, -1))
        high = bisect.bisect_right(rss, (finish, 2**63))
        peak = max((v for _, v in rss[low:high]), default=None)
        row = rows.setdefault(path, [0, 0, 0, 0, 0, 0, None])
        row[0] += 1
        row[1] += finish - phase.start_mono_ns
        row[2] += max(0, finish - phase.start_mono_ns - covered)
        row[3] += silent
        row[4] += phase.steps_completed
        row[5] += phase.status is PhaseStatus.ABORTED
        if peak is not None:
            row[6] = max(row[6] or 0, peak)
    return {path: _rounded(values) for path, values in rows.items()}


def tree_silences(events: list[Event], now_ns: int | None = None) -> list[tuple[Any, ...]]:
    """The silent windows, each with the deepest phase of the whole tree open through it."""
    state = BuildState()
    progress: list[int] = []
    for event in events:
        if event.type in ("build_start", "phase_start", "step", "phase_finish", "build_end"):
            progress.append(event.mono_ns)
        state.apply(event)
    assert state.start_mono_ns is not None
    end_ns = state.end_mono_ns
    if end_ns is None:
        end_ns = max(events[-1].mono_ns, now_ns or 0)
        progress.append(end_ns)
    threshold = silence_threshold_s((end_ns - state.start_mono_ns) / 1e9) * 1e9
    found = []
    for a, b in itertools.pairwise(progress):
        if b - a >= threshold and b - a >= 1e9:
            covering = [
                p
                for p in state.phases.values()
                if p.start_mono_ns <= a and (p.finish_mono_ns is None or p.finish_mono_ns >= b)
            ]
            deepest = max(covering, key=lambda p: (p.depth, -p.id), default=None)
            found.append(((a - state.start_mono_ns) / 1e9, (b - a) / 1e9, deepest and deepest.name))
    return found


def silences_of(report: Any) -> list[tuple[Any, ...]]:
    return [(s.start_s, s.length_s, s.phase) for s in report.silences]


def union(intervals: Iterable[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def _rounded(values: list[Any]) -> tuple[Any, ...]:
    count, total, own, silent, steps, aborted, peak = values
    return (count, total / 1e9, own / 1e9, silent / 1e9, steps, aborted, peak)


def folded_rows(report_rows: Any) -> dict[tuple[str, ...], tuple[Any, ...]]:
    return {
        row.path: (
            row.count,
            row.total_s,
            row.self_s,
            row.silent_s,
            row.steps,
            row.aborted,
            row.peak_rss_bytes,
        )
        for row in report_rows
    }


@settings(max_examples=300, deadline=None)
@given(calls=CALLS)
def test_the_rows_of_a_finished_build_are_those_of_its_whole_tree(
    calls: list[tuple[Any, ...]],
) -> None:
    events = build(calls)
    report = report_of(events)
    assert folded_rows(report.rows) == tree_rows(events)
    assert silences_of(report) == tree_silences(events)
    for row in report.rows:  # a row's parent is the row of its path's parent
        if row.parent is None:
            assert row.depth == 0
        else:
            assert report.rows[row.parent].path == row.path[:-1]
            assert row.index in report.rows[row.parent].children


@settings(max_examples=200, deadline=None)
@given(calls=CALLS, later_s=st.sampled_from([0.0, 2.0, 30.0]))
def test_the_rows_of_a_running_build_are_those_of_its_whole_tree_up_to_now(
    calls: list[tuple[Any, ...]], later_s: float
) -> None:
    """A build still running, drawn ``later_s`` after its last event (its current silence
    drawn with it); drawing it changes nothing the next drawing shows."""
    events = build(calls, end=False)
    model = ReadModel()
    recorder = BuildRecorder(model)
    model.subscribe(recorder)
    model.handle(events)
    now = events[-1].mono_ns + int(later_s * 1e9)
    assert folded_rows(recorder.report(now).rows) == tree_rows(events, now)
    assert silences_of(recorder.report(now)) == tree_silences(events, now)
    assert folded_rows(recorder.report(now).rows) == tree_rows(events, now)


def test_a_log_of_several_builds_is_drawn_as_its_latest_build() -> None:
    """``trt-otel run`` records one build after another on one log, and the live page's
    recorder follows the one read model: each build's start begins its rows afresh."""
    first = build([("start", "Building engine", None, 1), ("finish", "Building engine")])
    monitor = BuildMonitor()
    monitor.start()
    monitor.phase_start("Optimizing graph", None, 1)
    monitor.phase_finish("Optimizing graph")
    monitor.end()
    model = ReadModel()
    recorder = BuildRecorder(model)
    model.subscribe(recorder)
    model.handle(first)
    model.handle(monitor.log.recent())
    assert [row.label for row in recorder.report().rows] == ["Optimizing graph"]


def test_the_fold_keeps_its_rows_and_the_open_phases_only() -> None:
    """A phase dense build of 20,000 phases: once it ends, nothing of a phase is kept but its
    row; the read model forgot them too."""
    calls: list[tuple[Any, ...]] = [("start", "Building engine", None, 2)]
    for _ in range(5000):
        calls += [("start", "Timing tactics", "Building engine", 3),
                  ("start", "Measuring tactic time", "Timing tactics", 1),
                  ("step", "Measuring tactic time", 0),
                  ("finish", "Measuring tactic time"),
                  ("start", "Measuring tactic time", "Timing tactics", 1),
                  ("finish", "Measuring tactic time"),
                  ("finish", "Timing tactics")]  # fmt: skip
    model = ReadModel()
    recorder = BuildRecorder(model)
    model.subscribe(recorder)
    model.handle(build(calls))
    rows: RowFold = recorder._rows
    assert rows._open == {}
    assert len(model.state.phases) < 10
    report = recorder.report()
    assert [(r.label, r.count) for r in report.rows] == [
        ("Building engine", 1),
        ("Building engine > Timing tactics", 5000),
        ("Building engine > Timing tactics > Measuring tactic time", 10000),
    ]
    assert report.rows[2].steps == 5000


def test_paths_past_the_row_bound_are_counted_not_drawn() -> None:
    names = [f"phase {i}" for i in range(MAX_ROWS + 20)]
    calls: list[tuple[Any, ...]] = [("start", "root", None, 1)]
    for name in names:
        calls += [("start", name, "root", 1), ("start", "child", name, 1), ("finish", "child"),
                  ("finish", name)]  # fmt: skip
    report = report_of(build(calls))
    assert len(report.rows) == MAX_ROWS
    # The root, then two rows a name: the 150th name's row is the last, its child's path is
    # left out, and so is each later name's (their children are under a path left out).
    drawn_names = MAX_ROWS // 2
    assert report.rows[-1].label == f"root > phase {drawn_names - 1}"
    assert report.rows_left_out == 1 + len(names) - drawn_names


def test_a_long_name_is_drawn_clipped_and_names_alike_so_far_share_its_row() -> None:
    """A journal's name can be megabytes: a row's name is its first 199 characters and an
    ellipsis, and two names that differ only past them are one row."""
    first, second = "x" * 199 + "first" * 50, "x" * 199 + "second"
    calls: list[tuple[Any, ...]] = [("start", "root", None, 1)]
    for name in (first, second):
        calls += [("start", name, "root", 1), ("finish", name)]
    (root, row) = report_of(build(calls)).rows
    assert row.path == ("root", "x" * 199 + "…")
    assert (row.count, row.parent) == (2, root.index)


def test_children_open_at_once_are_covered_once() -> None:
    """Two children open at once (as on two builder threads): the parent's self time counts
    their overlap once."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("root", None, 1)
    clock.advance(1)
    monitor.phase_start("a", "root", 1)
    clock.advance(1)
    monitor.phase_start("b", "root", 1)
    clock.advance(1)
    monitor.phase_finish("a")
    clock.advance(1)
    monitor.phase_finish("b")
    clock.advance(1)
    monitor.phase_finish("root")
    monitor.end()
    events = monitor.log.recent()
    rows = {row.label: row for row in report_of(events).rows}
    assert rows["root"].self_s == pytest.approx(2.0)
    assert folded_rows(rows.values()) == tree_rows(events)


def test_a_child_closed_between_two_open_siblings_is_not_covered_twice() -> None:
    """``a`` opens, ``c`` runs inside it, ``b`` opens, ``d`` closes: ``c``'s time may still be
    overlapped by ``a`` (open, started before it), so it is not folded away with ``d``'s."""
    calls: list[tuple[Any, ...]] = [("start", "root", None, 1)]
    calls += [("start", "a", "root", 1), ("wait", 1.0), ("start", "c", "root", 1),
              ("wait", 1.0), ("finish", "c"), ("start", "b", "root", 1), ("start", "d", "root", 1),
              ("wait", 1.0), ("finish", "d"), ("finish", "a"), ("finish", "b"),
              ("wait", 1.0), ("finish", "root")]  # fmt: skip
    events = build(calls)
    rows = {row.label: row for row in report_of(events).rows}
    assert folded_rows(rows.values()) == tree_rows(events)
    assert rows["root"].self_s == pytest.approx(1.03)  # before "a", and after "b"


def test_the_timeline_image_draws_each_row_below_the_last_and_inside_the_picture() -> None:
    """The live page's image runs no script (which lays the page's rows out again), so where
    the server puts each row is where it is seen: one row height apart, from the axis down,
    the last inside the picture."""
    from xml.etree import ElementTree

    from trt_otel.views.report.html import timeline_svg

    calls: list[tuple[Any, ...]] = [
        ("start", "Building engine", None, 2),
        ("start", "Optimizing graph", "Building engine", 1),
        ("step", "Optimizing graph", 0),
        ("finish", "Optimizing graph"),
        ("start", "Timing tactics", "Building engine", 1),
        ("wait", 1.5),
        ("finish", "Timing tactics"),
        ("finish", "Building engine"),
    ]
    svg = ElementTree.fromstring(timeline_svg(report_of(build(calls))))
    namespace = "{http://www.w3.org/2000/svg}"
    top, row_h = int(svg.attrib["data-top"]), int(svg.attrib["data-row-h"])
    rows = [g for g in svg.iter(f"{namespace}g") if g.attrib.get("class") == "row"]
    assert len(rows) == 3
    ys = [float(re.findall(r"^translate\(0,([\d.]+)\)$", g.attrib["transform"])[0]) for g in rows]
    assert ys == [top + index * row_h for index in range(3)]
    assert ys[-1] + row_h <= float(svg.attrib["height"])


def test_a_silence_of_ten_seconds_is_a_silent_window_however_long_the_build() -> None:
    """A silent window is a tenth of the build at least, but 10 s is always one (what the
    terminal calls silent): in a build of over three minutes, a 12 s silence is one and the
    4 s pauses between its steps are not."""
    calls: list[tuple[Any, ...]] = [("start", "Building engine", None, 50)]
    for step in range(47):
        calls += [("wait", 4.0), ("step", "Building engine", step)]
    calls += [("wait", 12.0), ("step", "Building engine", 47), ("finish", "Building engine")]
    report = report_of(build(calls))
    assert report.duration_s > 190
    assert [(round(s.length_s), s.phase) for s in report.silences] == [(12, "Building engine")]
