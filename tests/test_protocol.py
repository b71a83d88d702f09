"""Hand-written callback sequences: each ordering rule of real builds, and each protocol
departure the monitor must tolerate and record."""

from __future__ import annotations

import msgspec
import pytest

from trt_otel import AnomalyKind, BuildMonitor, ManualClock, Outcome, PhaseStatus
from trt_otel.builder.simulator import Callback, Driver
from trt_otel.core.events import Anomaly, CancelRequested
from trt_otel.core.state import BuildState


def start(name: str, parent: str | None, steps: int) -> Callback:
    return Callback("phase_start", name, parent=parent, num_steps=steps)


def step(name: str, index: int) -> Callback:
    return Callback("step_complete", name, step=index)


def finish(name: str) -> Callback:
    return Callback("phase_finish", name)


def run(plan: list[Callback]) -> BuildMonitor:
    monitor = BuildMonitor(clock=ManualClock())
    assert Driver(speed=0).run(monitor, plan).completed
    return monitor


def anomalies(monitor: BuildMonitor) -> list[AnomalyKind]:
    return [e.kind for e in monitor.log.recent() if isinstance(e, Anomaly)]


# Rules seen in real builds: none of them is an anomaly.
REAL_RULES = {
    "depth-first nesting, explicit step 0": [
        start("A", None, 2), step("A", 0), start("B", "A", 1), step("B", 0), finish("B"),
        step("A", 1), finish("A"),
    ],
    "parent steps after a child, in pairs": [
        start("A", None, 4), start("B", "A", 1), step("B", 0), finish("B"),
        step("A", 0), step("A", 1), start("C", "A", 1), step("C", 0), finish("C"),
        step("A", 2), step("A", 3), finish("A"),
    ],
    "skipped steps": [
        start("R", None, 9), *[step("R", s) for s in (0, 1, 2, 3, 6, 7, 8)], finish("R"),
    ],
    "early finish": [start("O", None, 33), *[step("O", s) for s in range(29)], finish("O")],
    "name reused sequentially and under different parents": [
        start("E", None, 3),
        start("M", "E", 4), *[step("M", s) for s in range(4)], finish("M"), step("E", 0),
        start("M", "E", 2), *[step("M", s) for s in range(2)], finish("M"), step("E", 1),
        start("X", "E", 1), start("M", "X", 1), step("M", 0), finish("M"), finish("X"),
        step("E", 2), finish("E"),
    ],
    "a parent steps while its child is open": [
        start("P", None, 5), step("P", 0), start("D", "P", 5), step("D", 0), step("P", 1),
        step("P", 2), step("D", 1), finish("D"), finish("P"),
    ],
}  # fmt: skip


@pytest.mark.parametrize("plan", REAL_RULES.values(), ids=REAL_RULES.keys())
def test_real_ordering_rules_fold_without_anomalies(plan: list[Callback]) -> None:
    monitor = run(plan)
    monitor.end()
    state = monitor.state
    assert anomalies(monitor) == []
    assert state.phases_started_total == sum(c.kind == "phase_start" for c in plan)
    assert state.steps_completed_total == sum(c.kind == "step_complete" for c in plan)
    assert all(p.status is PhaseStatus.FINISHED for p in state.phases.values())
    assert state.open_by_name == {}
    assert state.outcome is Outcome.SUCCESS


def test_reused_names_are_distinct_instances_with_the_right_parents() -> None:
    state = run(REAL_RULES["name reused sequentially and under different parents"]).state
    measuring = [p for p in state.phases.values() if p.name == "M"]
    assert [p.num_steps for p in measuring] == [4, 2, 1]
    assert [state.phases[p.parent_id].name for p in measuring if p.parent_id] == ["E", "E", "X"]
    assert [p.steps_completed for p in measuring] == [4, 2, 1]


def test_skipped_steps_and_early_finish_are_counted() -> None:
    reformat = run(REAL_RULES["skipped steps"]).state
    (phase,) = reformat.phases.values()
    assert (phase.steps_completed, phase.skipped_steps, phase.last_step) == (7, 2, 8)
    early = run(REAL_RULES["early finish"]).state
    (phase,) = early.phases.values()
    assert (phase.last_step, phase.num_steps, phase.status) == (28, 33, PhaseStatus.FINISHED)


def test_parent_step_while_child_open_counts_for_the_parent() -> None:
    state = run(REAL_RULES["a parent steps while its child is open"]).state
    parent = next(p for p in state.phases.values() if p.name == "P")
    child = next(p for p in state.phases.values() if p.name == "D")
    assert (parent.steps_completed, child.steps_completed) == (3, 2)


ANOMALIES = {
    "step for a phase that is not open": (
        [start("A", None, 2), step("Z", 0), finish("A")],
        [AnomalyKind.STEP_FOR_UNKNOWN_PHASE],
    ),
    "finish without a start": (
        [start("A", None, 1), finish("Z"), finish("A")],
        [AnomalyKind.FINISH_OF_UNKNOWN_PHASE],
    ),
    "name reused while open": (
        [start("A", None, 1), start("A", None, 2), finish("A")],
        [AnomalyKind.NAME_REUSED_WHILE_OPEN],
    ),
    "step == num_steps, as an old TensorRT reported": (
        [start("A", None, 2), step("A", 0), step("A", 1), step("A", 2), finish("A")],
        [AnomalyKind.STEP_OUT_OF_RANGE],
    ),
    "negative step": (
        [start("A", None, 2), step("A", -1), finish("A")],
        [AnomalyKind.STEP_OUT_OF_RANGE],
    ),
    "step repeated": (
        [start("A", None, 3), step("A", 1), step("A", 1), finish("A")],
        [AnomalyKind.STEP_NOT_INCREASING],
    ),
    "unknown parent": (
        [start("A", "nobody", 1), finish("A")],
        [AnomalyKind.UNKNOWN_PARENT],
    ),
    "finish with children open": (
        [start("A", None, 1), start("B", "A", 1), start("C", "B", 1), finish("A")],
        [AnomalyKind.FINISH_WITH_OPEN_CHILDREN],
    ),
}


@pytest.mark.parametrize(("plan", "expected"), ANOMALIES.values(), ids=ANOMALIES.keys())
def test_protocol_departures_are_tolerated_and_recorded(
    plan: list[Callback], expected: list[AnomalyKind]
) -> None:
    monitor = run(plan)
    monitor.end()
    assert anomalies(monitor) == expected
    state = monitor.state
    assert state.anomalies == {kind: 1 for kind in expected}
    assert state.open_by_name == {}
    assert all(not p.is_open for p in state.phases.values())


def test_a_workers_cancelled_build_ends_as_its_note_says() -> None:
    """The supervisor's note says whether its cancel is a timeout: the worker's build then
    ends as a timeout (exit 3 either way, but the journal, the spans and the retry ladder tell
    a timeout from a person's cancel); a note that cannot be read is a cancel still."""
    import ctypes

    from trt_otel.capture.worker import NOTE_BYTES, RecordingMonitor

    class Flag:
        value = 1  # the supervisor has asked for a stop

    for written, outcome in [
        (b'{"timeout": true, "reason": "timed out after 1s"}', Outcome.TIMEOUT),
        (b'{"timeout": false, "reason": "stop"}', Outcome.CANCELLATION),
        (b'{"timeout": tr', Outcome.CANCELLATION),
    ]:
        note = ctypes.create_string_buffer(NOTE_BYTES)
        note.value = written
        recorder = RecordingMonitor(Flag(), note)
        assert recorder.end() is outcome, written
        assert recorder.records[-1][:5] == ("end", *recorder.records[-1][1:4], outcome.value)


@pytest.mark.parametrize(
    ("plan", "expected"),
    [*ANOMALIES.values(), *((plan, []) for plan in REAL_RULES.values())],
    ids=[*ANOMALIES.keys(), *REAL_RULES.keys()],
)
def test_a_supervisor_replaying_its_workers_callbacks_finds_the_same(
    plan: list[Callback], expected: list[AnomalyKind]
) -> None:
    """The callbacks made in a build's worker, replayed by the supervisor a frame at once
    (most of them the short way, with nothing to check): the same events, anomalies and
    phases as the monitor finds on TensorRT's own thread. Neither monitor is started first:
    the first callback starts the build, replayed or not."""
    from trt_otel.capture.worker import RecordingMonitor
    from trt_otel.core.readmodel import ReadModel

    class Flag:
        value = 0

    recorder = RecordingMonitor(Flag(), None)
    assert Driver(speed=0).run(recorder, plan).completed
    recorder.end()
    supervising = BuildMonitor(model=ReadModel(forget_closed=False))
    supervising.record(recorder.records)
    direct = run(plan)
    direct.end()
    assert anomalies(supervising) == anomalies(direct) == expected
    assert [type(e) for e in supervising.log.recent()] == [type(e) for e in direct.log.recent()]
    assert {p.id: (p.name, p.parent_id, p.status, p.steps_completed, p.last_step)
            for p in supervising.state.phases.values()} == {
        p.id: (p.name, p.parent_id, p.status, p.steps_completed, p.last_step)
        for p in direct.state.phases.values()
    }  # fmt: skip


def test_a_reused_open_name_closes_the_old_instance() -> None:
    state = run(ANOMALIES["name reused while open"][0]).state
    old, new = state.phases.values()
    assert old.status is PhaseStatus.ABORTED and "superseded" in (old.close_reason or "")
    assert new.status is PhaseStatus.FINISHED and new.num_steps == 2


def test_an_unknown_parent_makes_a_root() -> None:
    state = run(ANOMALIES["unknown parent"][0]).state
    assert [state.phases[r].name for r in state.roots] == ["A"]


def test_finishing_a_parent_closes_open_children_innermost_first() -> None:
    state = run(ANOMALIES["finish with children open"][0]).state
    a, b, c = state.phases.values()
    assert a.status is PhaseStatus.FINISHED
    assert b.status is c.status is PhaseStatus.ABORTED
    assert c.close_reason == "its parent finished first"


def test_arguments_of_the_wrong_type_are_coerced_and_recorded() -> None:
    monitor = BuildMonitor()
    monitor.phase_start(b"bytes-name", None, "3")  # type: ignore[arg-type]
    assert monitor.step_complete(None, 0) is True  # type: ignore[arg-type]
    assert monitor.step_complete("b'bytes-name'", None) is True  # type: ignore[arg-type]
    monitor.phase_start("A", None, 0)
    kinds = anomalies(monitor)
    assert kinds.count(AnomalyKind.INVALID_ARGUMENT) == 5
    assert monitor.state.phases_started_total == 2


def test_callbacks_after_the_end_are_recorded_not_folded_into_a_new_build() -> None:
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 1)
    monitor.phase_finish("A")
    monitor.end()
    assert monitor.step_complete("A", 0) is True
    monitor.phase_start("B", None, 1)
    assert AnomalyKind.CALLBACK_OUTSIDE_BUILD in anomalies(monitor)
    assert monitor.state.outcome is Outcome.SUCCESS


def test_the_end_closes_open_phases_with_the_outcome() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("A", None, 3)
    monitor.phase_start("B", "A", 3)
    monitor.end(Outcome.FAILURE, "out of memory", "OutOfMemory")
    state = monitor.state
    assert [p.status for p in state.phases.values()] == [PhaseStatus.ABORTED] * 2
    assert all(p.close_reason == "build ended: failure" for p in state.phases.values())
    assert (state.outcome, state.outcome_detail, state.error_type) == (
        Outcome.FAILURE,
        "out of memory",
        "OutOfMemory",
    )
    assert monitor.end(Outcome.SUCCESS) is Outcome.FAILURE  # the first end stands


def test_a_later_cancel_does_not_overwrite_the_first() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("A", None, 3)
    monitor.cancel("first reason", source="timeout", timeout=True)
    events = monitor.log.recent()
    first = next(e for e in events if isinstance(e, CancelRequested))
    # A journal or a follower can carry a second cancel (a supervisor and its worker both
    # decided): the state keeps the first, as the monitor does.
    second = msgspec.structs.replace(
        first, seq=events[-1].seq + 1, reason="second reason", source="user", timeout=False
    )
    state = BuildState()
    for event in [*events, second]:
        state.apply(event)
    assert state.cancel is not None
    assert (state.cancel.reason, state.cancel.source) == ("first reason", "timeout")


def test_progress_counts_to_the_last_step_as_tensorrt_skips_steps() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("R", None, 9)
    for index in (0, 1, 2, 3, 6):
        monitor.step_complete("R", index)
    state = monitor.state
    root = state.roots[0]
    assert state.phases[root].steps_completed == 5
    assert state.phase_progress(root) == pytest.approx(7 / 9), "steps 4 and 5 were skipped, not due"


def test_the_end_closes_open_phases_innermost_first() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("A", None, 3)
    monitor.phase_start("B", "A", 3)
    monitor.phase_start("C", "B", 3)
    monitor.end(Outcome.FAILURE, "out of memory")
    closed: list[str] = []
    state = BuildState(on_close=lambda phase: closed.append(phase.name))
    for event in monitor.log.recent():
        state.apply(event)
    assert closed == ["C", "B", "A"]


def test_a_repeated_step_is_not_counted_as_skipped_steps() -> None:
    """Step 1 twice: step 0 was skipped, and the repeat neither skips nor undoes a step."""
    plan, _ = ANOMALIES["step repeated"]
    (phase,) = run(plan).state.phases.values()
    assert (phase.last_step, phase.skipped_steps, phase.steps_completed) == (1, 1, 2)


def test_only_a_timeout_is_given_the_error_type_timeout() -> None:
    succeeded = BuildMonitor(clock=ManualClock())
    succeeded.phase_start("A", None, 1)
    succeeded.end()
    assert (succeeded.state.outcome, succeeded.state.error_type) == (Outcome.SUCCESS, None)
    cancelled = BuildMonitor(clock=ManualClock())
    cancelled.cancel("enough", source="user")
    cancelled.end()
    assert (cancelled.state.outcome, cancelled.state.error_type) == (Outcome.CANCELLATION, None)
    timed_out = BuildMonitor(clock=ManualClock())
    timed_out.cancel("too long", source="timeout", timeout=True)
    timed_out.end()
    assert (timed_out.state.outcome, timed_out.state.error_type) == (Outcome.TIMEOUT, "timeout")


def test_walk_visits_each_phase_before_its_children_in_their_start_order() -> None:
    """walk() (the report's order): a phase, then each of its children in the order they
    started, with their own children, before the next root."""
    monitor = run(
        [
            start("A", None, 1), start("B", "A", 1), finish("B"), start("C", "A", 1),
            start("D", "C", 1), finish("D"), finish("C"), finish("A"),
            start("E", None, 1), finish("E"),
        ]
    )  # fmt: skip
    walked = [(phase.name, phase.depth) for phase in monitor.state.walk()]
    assert walked == [("A", 0), ("B", 1), ("C", 1), ("D", 2), ("E", 0)]


def test_an_end_given_its_own_detail_keeps_it_after_a_cancel() -> None:
    """A cancelled build that failed for a reason of its own says that reason; one that just
    stopped says the cancel's."""
    failed = BuildMonitor(clock=ManualClock())
    failed.phase_start("A", None, 3)
    failed.cancel("enough", source="user")
    failed.end(Outcome.FAILURE, "CUDA error 700", error_type="RuntimeError")
    assert (failed.state.outcome, failed.state.outcome_detail) == (
        Outcome.FAILURE,
        "CUDA error 700",
    )
    stopped = BuildMonitor(clock=ManualClock())
    stopped.phase_start("A", None, 3)
    stopped.cancel("enough", source="user")
    stopped.end()
    assert (stopped.state.outcome, stopped.state.outcome_detail) == (Outcome.CANCELLATION, "enough")


def test_an_interrupt_inside_the_monitors_block_ends_the_build_as_a_cancellation() -> None:
    with pytest.raises(KeyboardInterrupt), BuildMonitor(clock=ManualClock()) as monitor:
        monitor.phase_start("A", None, 3)
        raise KeyboardInterrupt
    assert monitor.state.outcome is Outcome.CANCELLATION
    assert monitor.state.cancel is not None
    assert (monitor.state.cancel.reason, monitor.state.cancel.source) == (
        "interrupted by the user", "signal",
    )  # fmt: skip


def test_a_held_cancel_enters_the_log_between_the_callbacks_made_before_and_after_it() -> None:
    """Callbacks replayed from elsewhere (a worker) carry their own times: a cancel decided
    while they were on their way goes in by its monotonic time, between them."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.hold_cancels = True
    before = ("phase_start", clock.wall_ns(), clock.mono_ns(), "builder", "A", None, 3)
    clock.advance(1)
    assert monitor.cancel("enough", source="user")
    clock.advance(1)
    after = ("step", clock.wall_ns(), clock.mono_ns(), "builder", "A", 0)
    monitor.record([before, after])
    kinds = [type(event).__name__ for event in monitor.log.recent()]
    assert kinds == ["BuildStarted", "PhaseStarted", "CancelRequested", "StepCompleted"]
