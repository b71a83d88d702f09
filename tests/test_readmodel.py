"""The read model: the build folded once on the follower side, read by every view, with one rule
for folding repeated phases."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rich.console import Console

from conftest import trace_params
from trt_otel import BuildMonitor, ManualClock, Outcome, PhaseStatus
from trt_otel.app.cli import main
from trt_otel.builder.simulator import Driver, generate_plan, load_trace
from trt_otel.core.eta import estimate
from trt_otel.core.events import Event, PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.core.gaps import MIN_GAP_NS, Gap
from trt_otel.core.journal_reader import read_journal
from trt_otel.core.log import EventLog
from trt_otel.core.readmodel import (
    PHASE_EVENTS_CLOSING,
    PHASE_EVENTS_NONE,
    ReadModel,
    SiblingGroup,
    TreeNode,
)
from trt_otel.core.state import BuildState, Phase
from trt_otel.views.console import render_build
from trt_otel.views.spans import SpanProjection
from trt_otel.views.status import status_document


def recorded(plan_or_trace: Any, *, cancel_at: int | None = None) -> list[Event]:
    """The events of a driven build, in virtual time; cancelled at callback ``cancel_at``."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    plan = list(plan_or_trace)
    if cancel_at is not None:
        Driver(speed=1.0, sleep=clock.advance).run(monitor, plan[:cancel_at])
        monitor.cancel("enough", source="user")
        Driver(speed=1.0, sleep=clock.advance).run(monitor, plan[cancel_at:])
    else:
        Driver(speed=1.0, sleep=clock.advance).run(monitor, plan)
    monitor.end()
    return monitor.log.recent()


def console_nodes(model: ReadModel) -> list[tuple[int, str, int]]:
    """(depth, name, count) of every line of the terminal's tree, in order."""
    out = io.StringIO()
    Console(file=out, width=400, force_terminal=False, color_system=None).print(render_build(model))
    nodes = []
    for line in out.getvalue().splitlines()[1:]:
        # A group (xN), an open phase's bar (3/6), a closed one's count ((5 of 6 steps)).
        shape = r"(?: ×(\d+)| (?:━|╺|─)*\s*\d+/\d+| \(\d+(?: of \d+)? steps?\))"
        match = re.match(r"^([ │├└─]*)[✓✗▶] (.+?)" + shape, line)
        if match is not None:
            depth = len(match.group(1)) // 4 - 1  # the header is the root of the tree
            nodes.append((depth, match.group(2), int(match.group(3) or 1)))
    return nodes


def tree_nodes(model: ReadModel) -> list[tuple[int, str, int, str, int, float]]:
    """Every node the terminal's tree draws, in its order (depth first), with what its line
    says: (depth, name, count, status, steps, progress)."""
    nodes: list[tuple[int, str, int, str, int, float]] = []
    stack: list[tuple[TreeNode, int]] = [(node, 0) for node in reversed(model.tree())]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, SiblingGroup):
            nodes.append((depth, node.name, node.count, "group", 0, 1.0))
            continue
        progress = model.state.phase_progress(node.id)
        nodes.append((depth, node.name, 1, node.status.value, node.steps_completed, progress))
        stack.extend((child, depth + 1) for child in reversed(model.tree(node.id)))
    return nodes


def status_nodes(document: dict[str, Any]) -> list[tuple[int, str, int]]:
    nodes: list[tuple[int, str, int]] = []

    def walk(children: list[dict[str, Any]], depth: int) -> None:
        for child in children:
            nodes.append((depth, child["name"], child.get("count", 1)))
            walk(child.get("children", []), depth + 1)

    walk(document["phases"], 0)
    return nodes


def model_of(events: Sequence[Event]) -> ReadModel:
    model = ReadModel()
    model.handle(events)
    return model


@pytest.mark.parametrize("trace", trace_params())
@pytest.mark.parametrize("cancelled", [False, True], ids=["finished", "cancelled"])
def test_the_terminal_and_status_fold_a_real_build_alike(trace: Path, cancelled: bool) -> None:
    """A recorded TensorRT build (hundreds of phases, most of them repeated): the terminal
    and /status show the same nodes, folded alike."""
    callbacks = load_trace(trace)
    events = recorded(callbacks, cancel_at=len(callbacks) // 2 if cancelled else None)
    model = model_of(events)
    now = events[-1].mono_ns
    document = msgspec.to_builtins(status_document(model, model.estimate_locked(now), now))
    terminal, status = console_nodes(model), status_nodes(document)
    assert terminal == status
    assert any(count > 1 for _, _, count in status), "repeated phases are folded"
    assert len(model.state.phases) < 2 * len(status), "what no view shows is forgotten"
    statuses = re.findall(r"'status': '(\w+)'", repr(document["phases"]))
    assert ("aborted" in statuses) == cancelled, "aborted phases are shown, each on its own"


def test_the_rule_folds_finished_siblings_of_a_name_once_there_are_two() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("root", None, 3)
    monitor.phase_start("timing", "root", 1)
    monitor.phase_finish("timing")
    model = model_of(monitor.log.recent())
    root = model.state.roots[0]
    assert [type(n) for n in model.tree(root)] == [Phase], "one is shown as itself"
    monitor.phase_start("timing", "root", 1)
    monitor.phase_finish("timing")
    monitor.phase_start("other", "root", 1)
    monitor.phase_start("timing", "root", 1)  # open: shown on its own, after the group
    model = model_of(monitor.log.recent())
    nodes = model.tree(root)
    assert isinstance(nodes[0], SiblingGroup) and nodes[0].count == 2
    assert [n.name for n in nodes] == ["timing", "other", "timing"]
    assert isinstance(nodes[2], Phase) and nodes[2].is_open


def quiet(event: Event, cancelled: bool) -> bool:
    return isinstance(event, StepCompleted) and not cancelled


def test_subscribers_see_the_model_after_each_event_and_what_it_closed() -> None:
    """Every event but the quiet steps is told on its own, after the fold, with what it
    closed; quiet steps are told by the next event, or, ending the batch, by their last."""
    events = recorded(generate_plan(3))
    reference = ReadModel()
    expected: list[tuple[str, int]] = []
    for event in events:
        if quiet(event, reference.state.cancel is not None):
            reference.apply(event)
            continue
        reference.apply(event)
        expected.append(("event", event.seq))
    assert len(expected) < len(events) * 0.7, "many steps are quiet"

    model = ReadModel()
    seen: list[tuple[str, int, int, list[int]]] = []

    class Probe:
        name = "probe"

        def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
            seen.append(("event", event.seq, model.state.last_seq, [p.id for p in closed]))

        def on_steps(self, last: StepCompleted) -> None:
            seen.append(("steps", last.seq, model.state.last_seq, []))

        def close(self) -> None:
            seen.append(("close", -1, -1, []))

    model.subscribe(Probe())
    model.handle(events)
    model.close()
    assert [(kind, seq) for kind, seq, _, _ in seen[:-1]] == expected
    assert all(seq == last for _, seq, last, _ in seen[:-1]), "told after the fold"
    assert seen[-1] == ("close", -1, -1, [])
    closed_ids = [phase_id for _, _, _, ids in seen for phase_id in ids]
    started = [e.seq for e in events if isinstance(e, PhaseStarted)]
    assert sorted(closed_ids) == started, "every phase closed exactly once"


class Told:
    """A subscriber that notes the seq of what it is told: each event, or the last of a run of
    quiet steps."""

    name = "told"

    def __init__(self) -> None:
        self.seqs: list[int] = []

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        self.seqs.append(event.seq)

    def on_steps(self, last: StepCompleted) -> None:
        self.seqs.append(last.seq)

    def close(self) -> None:
        pass


class ToldClosing(Told):
    phase_events = PHASE_EVENTS_CLOSING


class ToldNone(Told):
    phase_events = PHASE_EVENTS_NONE


def test_a_subscriber_is_told_of_the_phase_events_it_asks_for_and_of_the_builds_first() -> None:
    """A subscriber that draws nothing from a phase's start or finish of its own is told of
    those that close a phase (``closing``: the span export) or of none (the log records); the
    build's first event is told to every subscriber, whatever it is (a log without its
    ``build_start``: the projections name its build after it)."""
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("Building engine", None, 2)
    monitor.phase_start("Tactic", "Building engine", 1)
    monitor.phase_finish("Tactic")
    monitor.phase_start("Tactic", "Building engine", 1)
    monitor.phase_start("Tactic", "Building engine", 1)  # supersedes the open one: closes it
    monitor.log_message("WARNING", "slow")
    monitor.phase_finish("Building engine")  # closes its open child with it
    monitor.end()
    events = [e for e in monitor.log.recent() if type(e).__name__ != "BuildStarted"]
    every, closing, none = Told(), ToldClosing(), ToldNone()
    model = ReadModel()
    for subscriber in (every, closing, none):
        model.subscribe(subscriber)
    model.handle(events)
    reference = ReadModel()
    closes = {e.seq for e in events if reference.apply(e)}
    phase_events = {e.seq for e in events if isinstance(e, PhaseStarted | PhaseFinished)}
    first = events[0].seq
    told_every = [e.seq for e in events if not quiet(e, False)]
    assert every.seqs == told_every
    assert {e.seq for e in events if isinstance(e, PhaseStarted)} & closes, "one supersedes"
    assert closing.seqs == [
        seq for seq in told_every if seq not in phase_events or seq in closes or seq == first
    ]
    assert none.seqs == [seq for seq in told_every if seq not in phase_events or seq == first]
    assert first in phase_events and first not in closes, "a log without its start"
    assert set(every.seqs) - set(closing.seqs), "the closing subscriber was told less"


def test_quiet_steps_at_the_end_of_a_batch_are_told_then() -> None:
    events = recorded(generate_plan(3))
    model = ReadModel()
    probe = Told()
    model.subscribe(probe)
    first_step = next(i for i, e in enumerate(events) if isinstance(e, StepCompleted))
    model.handle(events[: first_step + 1])
    assert probe.seqs[-1] == events[first_step].seq, "the batch's last quiet step, at its end"


def test_as_the_logs_fold_quiet_steps_ending_a_replayed_frame_are_told_at_its_end() -> None:
    """In a supervisor the model is the log's own fold: a frame of callbacks replayed at
    once ends with its last quiet step told, before the next frame comes."""
    from trt_otel.capture.worker import RecordingMonitor

    class Flag:
        value = 0

    recorder = RecordingMonitor(Flag(), None)
    Driver(speed=0).run(recorder, generate_plan(3))
    records = list(recorder.records)
    last_step = max(i for i, r in enumerate(records[: len(records) // 2]) if r[0] == "step")
    model = ReadModel()
    told = Told()
    model.subscribe(told)
    monitor = BuildMonitor(model=model)
    monitor.start()
    monitor.record(records[: last_step + 1])
    (last,) = [e for e in monitor.log.recent() if isinstance(e, StepCompleted)][-1:]
    assert told.seqs[-1] == last.seq, "the frame's last quiet step, at its end"


def test_a_failing_subscriber_is_counted_and_the_others_go_on() -> None:
    events = recorded(generate_plan(3))
    model = ReadModel()

    class Broken:
        name = "broken"

        def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
            raise RuntimeError("bug")

        def on_steps(self, last: StepCompleted) -> None:
            raise RuntimeError("bug")

        def close(self) -> None:
            pass

    model.subscribe(Broken())
    told = Told()
    model.subscribe(told)
    model.handle(events)
    counted = told.seqs
    assert counted and counted == sorted(counted) and counted[-1] == events[-1].seq
    assert model.subscriber_errors["broken"] == (len(counted), "RuntimeError: bug")


def test_the_span_projection_ends_an_unfinished_log_without_changing_the_model() -> None:
    events = recorded(generate_plan(3))
    unfinished = events[: len(events) // 2]
    projection = SpanProjection()
    for event in unfinished:
        projection.apply(event)
    state = projection.model.state
    open_before = dict(state.open_by_name)
    statuses = {pid: p.status for pid, p in state.phases.items()}
    assert open_before
    spans = projection.finish()
    assert dict(state.open_by_name) == open_before
    assert {pid: p.status for pid, p in state.phases.items()} == statuses
    aborted = [s for s in spans[:-1] if s.attributes["trt.phase.status"] == "aborted"]
    assert len(aborted) == len(open_before)
    assert all(
        s.attributes["trt.phase.close_reason"] == "the log ended before the build did"
        for s in aborted
    )


def test_the_model_estimates_from_its_own_fold() -> None:
    events = recorded(generate_plan(13))
    half = events[: len(events) // 2]
    model = model_of(half)
    state = BuildState()
    for event in half:
        state.apply(event)
    now = half[-1].mono_ns
    assert model.estimate(now).build == estimate(state, model.boundaries, now, None).build


@pytest.mark.parametrize(
    "in_process",
    [
        pytest.param(False, id="supervised", marks=pytest.mark.e2e),
        pytest.param(True, id="in-process"),
    ],
)
def test_the_build_state_is_folded_once_for_every_view(
    in_process: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Console, /status, the ETA, spans and metrics all on. As the command runs a build (in a
    worker process), the supervisor replays the callbacks through the read model's own fold:
    one fold of the state. A monitor on TensorRT's own threads keeps its fold there, and the
    read model folds for every view: two. The live page's timeline (``/timeline.svg``, with the
    HTTP view) draws from the read model: no fold of its own. Each sees every event."""
    from prometheus_server import free_port

    folded: dict[int, int] = {}
    apply, step = BuildState.apply, BuildState.step

    def counted(state: BuildState) -> None:
        folded[id(state)] = folded.get(id(state), 0) + 1

    def counting(self: BuildState, event: Event) -> None:
        if type(event) is not StepCompleted:  # a step is counted by step(), which it calls
            counted(self)
        apply(self, event)

    def counting_step(self: BuildState, event: StepCompleted) -> None:
        counted(self)
        step(self, event)

    monkeypatch.setattr(BuildState, "apply", counting)
    monkeypatch.setattr(BuildState, "step", counting_step)
    journal = tmp_path / "j.jsonl"
    code = main(
        [
            "demo", "--speed", "0", "--no-gpu", "--no-progress",
            "--journal", str(journal), "--http-port", "0",
            "--cancel-token", "t", "--prometheus-port", "0", "--prometheus-linger", "0",
            "--otlp-endpoint", f"http://127.0.0.1:{free_port()}", "--otlp-flush-timeout", "0.1",
            *(["--in-process"] if in_process else []),
        ]
    )  # fmt: skip
    assert code == 0
    assert "build success" in capsys.readouterr().err
    events = len(read_journal(journal).events)
    assert list(folded.values()) == [events] * (2 if in_process else 1)


def test_the_progress_of_a_phase_is_its_steps_done_and_its_open_childs_share() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    state = monitor.state
    monitor.phase_start("Building engine", None, 4)
    assert state.progress_ratio() == 0.0
    monitor.step_complete("Building engine", 0)  # step 0 done: one of four
    root = state.roots[0]
    assert state.phase_progress(root) == 0.25
    monitor.phase_start("Timing tactics", "Building engine", 2)
    monitor.step_complete("Timing tactics", 0)
    assert state.phase_progress(state.open_by_name["Timing tactics"]) == 0.5
    assert state.phase_progress(root) == (1 + 0.5) / 4
    assert state.progress_ratio() == (1 + 0.5) / 4
    monitor.phase_finish("Timing tactics")
    assert state.phase_progress(root) == 0.25, "a finished child is counted by its parent's step"


@pytest.mark.parametrize("trace", trace_params())
def test_forgetting_closed_phases_changes_nothing_a_view_shows(trace: Path) -> None:
    """The model forgets the closed phases no view shows: at every phase boundary of a real
    build, four times over, the terminal and /status show what a model that forgets nothing
    shows, while the phases it keeps stay as few as in one build."""
    callbacks = list(load_trace(trace))
    events = recorded(callbacks[:1] + callbacks[1:-2] * 4 + callbacks[-2:])
    forgetting, remembering = ReadModel(), ReadModel(forget_closed=False)
    kept = []
    boundaries = 0
    for event in events:
        forgetting.handle([event])
        remembering.handle([event])
        if isinstance(event, PhaseStarted | PhaseFinished):
            # What the terminal draws from, at every boundary; the drawing itself (a few
            # milliseconds each) at every 50th and at the end.
            assert tree_nodes(forgetting) == tree_nodes(remembering), event
            if boundaries % 50 == 0:
                assert console_nodes(forgetting) == console_nodes(remembering), event
            boundaries += 1
            kept.append(len(forgetting.state.phases))
    assert console_nodes(forgetting) == console_nodes(remembering)
    now = events[-1].mono_ns
    documents = [
        status_document(m, m.estimate_locked(now), now).phases for m in (forgetting, remembering)
    ]
    assert documents[0] == documents[1]
    assert max(kept) < 100 < len(remembering.state.phases) / 10


def test_forgotten_roots_still_count_in_the_progress() -> None:
    """Finished roots of one name (a phase whose parent is not open is a root): the fold that
    forgets them shows the progress of the one that does not."""
    monitor = BuildMonitor(clock=ManualClock())
    for _ in range(3):
        monitor.phase_start("Timing tactics", "Building engine", 1)  # no such parent open
        monitor.phase_finish("Timing tactics")
    monitor.phase_start("Building engine", None, 4)
    events = monitor.log.recent()
    forgetting, remembering = model_of(events), ReadModel(forget_closed=False)
    remembering.handle(events)
    assert len(forgetting.state.roots) < len(remembering.state.roots), "forgotten"
    assert remembering.state.progress_ratio() == 3 / 4
    assert forgetting.state.progress_ratio() == 3 / 4


def test_an_aborted_phase_is_not_counted_into_its_finished_siblings() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("root", None, 3)
    for _ in range(2):
        monitor.phase_start("timing", "root", 1)
        monitor.phase_finish("timing")
    monitor.phase_start("timing", "root", 1)
    monitor.end(Outcome.FAILURE, "out of memory")  # aborts the third
    model = model_of(monitor.log.recent())
    nodes = model.tree(model.state.roots[0])
    assert isinstance(nodes[0], SiblingGroup) and nodes[0].count == 2, "only finished ones count"
    assert isinstance(nodes[1], Phase) and nodes[1].status is PhaseStatus.ABORTED
    assert len(nodes) == 2


def test_a_group_keeps_the_total_and_the_longest_of_its_phases() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.phase_start("root", None, 1)
    for seconds in (1.0, 3.0, 2.0):
        monitor.phase_start("timing", "root", 1)
        clock.advance(seconds)
        monitor.phase_finish("timing")
    model = model_of(monitor.log.recent())
    (group,) = model.tree(model.state.roots[0])
    assert isinstance(group, SiblingGroup)
    second = 1_000_000_000
    assert (group.count, group.total_ns, group.longest_ns) == (3, 6 * second, 3 * second)
    # And /status says them in seconds, each in its place.
    now = monitor.log.recent()[-1].mono_ns
    document = msgspec.to_builtins(status_document(model, model.estimate_locked(now), now))
    (node,) = document["phases"][0]["children"]
    assert (node["kind"], node["count"], node["elapsed_s"], node["longest_s"]) == (
        "group",
        3,
        6.0,
        3.0,
    )


def test_a_model_that_is_the_logs_fold_counts_every_event_it_folded() -> None:
    """Its health, in a follower's terms, has handled every event of the log (seq from 0)."""
    model = ReadModel()
    log = EventLog()
    model.fold_of(log)
    monitor = BuildMonitor(log=log)
    Driver(speed=0).run(monitor, generate_plan(2))
    monitor.end()
    assert model.health().handled == len(log.recent()) == log.next_seq


class Failing:
    """A subscriber whose every call fails."""

    name = "failing"

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        raise RuntimeError("bug")

    def on_steps(self, last: StepCompleted) -> None:
        raise RuntimeError("bug")

    def close(self) -> None:
        pass


def test_a_failing_subscriber_is_warned_of_at_its_first_error_and_each_error_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = recorded(generate_plan(3))
    model = ReadModel()
    model.subscribe(Failing())
    with caplog.at_level(logging.WARNING, logger="trt_otel.core.readmodel"):
        model.handle(events[:1])
        assert [record.getMessage() for record in caplog.records] == [
            "trt-otel failing failed (RuntimeError: bug); the build goes on, further errors "
            "are only counted"
        ], "warned at the first error"
        model.handle(events[1:])
    assert len(caplog.records) == 1, "and only then"
    failures, _ = model.subscriber_errors["failing"]
    assert failures > 1
    assert model.health().errors == failures, "every failure, not every failing subscriber"


def test_quiet_steps_folded_one_at_a_time_are_told_when_the_log_ends() -> None:
    """Events folded one by one (:meth:`ReadModel.fold`): the quiet steps the log ends with
    are told at its close, not lost."""
    events = recorded(generate_plan(3))
    first_step = next(i for i, e in enumerate(events) if isinstance(e, StepCompleted))
    model = ReadModel()
    told = Told()
    model.subscribe(told)
    for event in events[: first_step + 1]:
        model.fold(event)
    assert told.seqs[-1] < events[first_step].seq, "a quiet step is not told on its own"
    model.close()
    assert told.seqs[-1] == events[first_step].seq


def test_a_second_build_in_one_log_is_folded_without_the_firsts_phases() -> None:
    """A log of several builds (``trt-otel run``): the second build's one finished phase is
    shown on its own, not folded with the first build's phases of that name."""
    log = EventLog(clock=ManualClock())
    first = BuildMonitor(log=log)
    for _ in range(2):
        first.phase_start("Measuring tactic time", None, 1)
        first.phase_finish("Measuring tactic time")
    first.end()
    second = BuildMonitor(log=log)
    second.phase_start("Measuring tactic time", None, 1)
    second.phase_finish("Measuring tactic time")
    second.end()
    model = model_of(log.recent())
    (node,) = model.tree()
    assert isinstance(node, Phase), node
    assert node.name == "Measuring tactic time"


def test_an_ended_builds_elapsed_time_stops_at_its_end() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("root", None, 1)
    clock.advance(5)
    monitor.phase_finish("root")
    monitor.end()
    model = model_of(monitor.log.recent())
    later = monitor.log.recent()[-1].mono_ns + 3_600 * 10**9  # an hour after the end
    document = msgspec.to_builtins(status_document(model, model.estimate_locked(later), later))
    assert document["elapsed_s"] == 5.0


def test_a_step_a_second_after_the_last_callback_ends_a_gap_as_any_callback_does() -> None:
    """Steps are folded on their own quick path: one that comes exactly a second after the
    previous callback still ends a silent window (the bound of a gap kept is inclusive), and one
    that comes sooner ends none."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    began = clock.mono_ns()
    clock.advance(MIN_GAP_NS / 1e9)
    monitor.step_complete("Building engine", 0)
    clock.advance(MIN_GAP_NS / 1e9 - 0.001)
    monitor.step_complete("Building engine", 1)
    model = model_of(monitor.log.recent())
    assert model.gaps.kept == [Gap(began, began + MIN_GAP_NS, "Building engine")]
