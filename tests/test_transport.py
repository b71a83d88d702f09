"""The worker's records on their way to the supervisor: the spool file's frames, a backlog kept
on disk rather than in memory, and a cancel placed among the callbacks by time. Real worker
processes and files."""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from conftest import trace_params
from trt_otel import BuildMonitor, ManualClock, Outcome
from trt_otel.builder.build import BuildJob, SimulatorSettings, run_build_job
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.simulator import InternedPlan, generate_plan, load_trace
from trt_otel.capture import supervisor
from trt_otel.capture.supervisor import run_isolated
from trt_otel.capture.transport import MAX_RECORDS_PER_FRAME, SpoolReader, SpoolWriter, encode_frame
from trt_otel.capture.worker import OddArgument
from trt_otel.core.events import (
    CancelRequested,
    Event,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    StepCompleted,
)
from waiting import silent_at

CALLBACKS = (PhaseStarted, StepCompleted, PhaseFinished)


def big_job(repeats: int = 10) -> BuildJob:
    """A build of 2,501 callbacks a repeat at full speed: the worker is well ahead of the
    supervisor, whose replay is slowed down below."""
    return BuildJob(
        model_path=Path("m.onnx"),
        model=demo_model_bytes(),
        simulator=SimulatorSettings(speed=0),
        plan=generate_plan(13, num_profiles=2) * repeats,
    )


def test_frames_round_trip_exactly_including_odd_values(tmp_path: Path) -> None:
    path = tmp_path / "spool"
    path.touch()
    writer = SpoolWriter(str(path))
    plain = [("step", 1, 2, "MainThread", "Measuring tactic time", 3), ("log", 4, 5, "t", "w", "m")]
    odd = [("step", 6, 7, "t", OddArgument("bytes", "b'x'"), 2**70)]
    for frame in (plain, odd, []):
        writer.write(encode_frame(list(frame), 99, 3, 400))
    writer.write(encode_frame([], 100, 3, 400, final=True)[:-1])  # torn: the writer died
    writer.close()
    reader = SpoolReader(os.open(path, os.O_RDONLY))
    frames = reader.read(max_frames=10)
    assert [[tuple(r) for r in f.records] for f in frames] == [plain, odd, []]
    assert frames[1].records[0][4] == OddArgument("bytes", "b'x'"), "odd arguments kept exactly"
    assert [(f.watermark_ns, f.callbacks_total, f.callback_ns_total) for f in frames] == [
        (99, 3, 400)
    ] * 3
    assert not any(f.final for f in frames)
    assert reader.torn, "an incomplete last frame is noticed"


class _SlowFold:
    """Slows the supervisor's replay down (a fold runs under the log's lock for every event),
    and notes when each event was replayed."""

    def __init__(self, per_event_s: float, slow_events: int) -> None:
        self.per_event_s = per_event_s
        self.slow_events = slow_events
        self.replayed_ns: dict[int, int] = {}
        self.first_phase = threading.Event()

    def __call__(self, event: Event) -> None:
        self.replayed_ns[event.seq] = time.monotonic_ns()
        if isinstance(event, PhaseStarted):
            self.first_phase.set()
        if event.seq < self.slow_events:
            time.sleep(self.per_event_s)  # the slowness under test, not a wait


@pytest.mark.e2e
def test_a_cancel_decided_behind_the_replay_is_logged_among_the_callbacks_by_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The order the worker's word gives, not the patience kept for a worker that cannot say
    # how far it got: on a loaded machine its forwarder can wait past half a second for the
    # CPU, the spool read to its end meanwhile, and the held cancel go in before callbacks it
    # came after.
    monkeypatch.setattr(supervisor, "HELD_CANCEL_PATIENCE_S", 60.0)
    monitor = BuildMonitor()
    slow = _SlowFold(0.002, slow_events=300)  # the replay falls behind from the start
    monitor.log.add_fold(slow)
    monitor.start()

    def cancel_once_replaying() -> None:
        slow.first_phase.wait(60)
        monitor.cancel("enough", source="user")

    canceller = threading.Thread(target=cancel_once_replaying)
    canceller.start()
    result = run_isolated(run_build_job, big_job(repeats=100), monitor=monitor)
    canceller.join()
    assert result.returned and monitor.state.outcome is Outcome.CANCELLATION
    events = monitor.log.recent()
    assert [e.seq for e in events] == list(range(len(events)))
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    before = [e for e in events if isinstance(e, CALLBACKS) and e.seq < cancel.seq]
    after = [e for e in events if isinstance(e, CALLBACKS) and e.seq > cancel.seq]
    assert before and after, "the worker made callbacks on both sides of the decision"
    assert all(e.mono_ns <= cancel.mono_ns for e in before)
    assert all(e.mono_ns >= cancel.mono_ns for e in after), "nothing made earlier comes later"
    assert slow.replayed_ns[before[-1].seq] > cancel.mono_ns, (
        "the replay was behind when the cancel was decided (else this test shows nothing)"
    )


@pytest.mark.e2e
def test_a_cancel_in_a_silent_worker_is_logged_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the worker's word that it made nothing since lets the cancel in, not impatience.
    monkeypatch.setattr(supervisor, "HELD_CANCEL_PATIENCE_S", 60.0)
    monitor = BuildMonitor()
    monitor.start()
    plan = generate_plan(13)
    job = BuildJob(
        model_path=Path("m.onnx"),
        model=demo_model_bytes(),
        simulator=SimulatorSettings(speed=0, silence_s=600),
        plan=plan,
    )
    logged = threading.Event()
    silent = threading.Event()
    callbacks, before = [0], silent_at(plan)

    def fold(event: Event) -> None:
        if isinstance(event, CancelRequested):
            logged.set()
        elif isinstance(event, CALLBACKS):
            callbacks[0] += 1
            if callbacks[0] == before:  # the last one before the silence
                silent.set()

    monitor.log.add_fold(fold)
    decided = threading.Event()

    def cancel_in_the_silence() -> None:
        if silent.wait(60):
            monitor.cancel("now", source="user")
            decided.set()

    threading.Thread(target=cancel_in_the_silence, daemon=True).start()
    waiter = threading.Thread(
        target=run_isolated, args=(run_build_job, job), kwargs={"monitor": monitor, "grace_s": 5}
    )
    waiter.start()
    assert decided.wait(60)
    assert logged.wait(5.0), "the worker's empty frames let the cancel into the log"
    waiter.join(60)


class _SlowFollower:
    name = "slow"

    def __init__(self) -> None:
        self.events = 0

    def handle(self, events: Sequence[Event]) -> None:
        self.events += len(events)
        time.sleep(len(events) * 100e-6)  # 10,000 events a second: slower than the replay

    def close(self) -> None:
        pass


@pytest.mark.e2e
def test_a_backlog_waits_in_the_spool_not_in_the_followers_queues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(supervisor, "FOLLOWER_ROOM", 1_000)
    monitor = BuildMonitor()
    follower = _SlowFollower()
    # Room for fewer events than the build makes: a replay that did not wait would drop some.
    worker = monitor.log.follow(follower, capacity=12_000, min_interval_s=0.0)
    deepest = [0]
    monitor.log.add_fold(lambda e: deepest.__setitem__(0, max(deepest[0], worker.queued)))
    monitor.start()
    result = run_isolated(run_build_job, big_job(), monitor=monitor)
    monitor.close(60)
    assert result.returned and monitor.state.outcome is Outcome.SUCCESS
    assert worker.health().dropped == 0
    assert follower.events == monitor.log.next_seq, "every event reached the follower"
    assert deepest[0] <= 1_000 + 2 * MAX_RECORDS_PER_FRAME


@pytest.mark.parametrize("trace", trace_params())
def test_a_trace_is_parsed_into_a_compact_plan_that_pickles_small(trace: Path) -> None:
    plan = load_trace(trace)
    assert isinstance(plan, InternedPlan)
    callbacks = list(plan)
    assert plan == callbacks and plan[3] == callbacks[3] and plan[2:5] == callbacks[2:5]
    data = pickle.dumps(plan)
    assert pickle.loads(data) == callbacks
    assert len(data) < 5 * len(plan) + 200 * 1_000, "about 4 bytes a callback"


@pytest.mark.e2e
def test_the_workers_callbacks_are_counted_and_timed_but_not_its_log_lines() -> None:
    """The monitor's own figures, as the worker reports them: every callback TensorRT made
    (counted from the records, not by each callback), and time spent in them."""
    monitor = BuildMonitor()
    monitor.start()
    result = run_isolated(run_build_job, big_job(repeats=2), monitor=monitor)
    monitor.close()
    assert result.returned and monitor.state.outcome is Outcome.SUCCESS
    events = monitor.log.recent()
    assert any(isinstance(e, LogMessage) for e in events), "the build logged: not callbacks"
    assert monitor.callbacks_total == sum(isinstance(e, CALLBACKS) for e in events)
    assert 0 < monitor.callback_ns_total < monitor.callbacks_total * 1_000_000


@pytest.mark.e2e
def test_a_build_cancelled_before_its_worker_starts_does_not_build(tmp_path: Path) -> None:
    monitor = BuildMonitor()
    monitor.start()
    assert monitor.cancel("stopped before it began", source="user")
    job = BuildJob(
        model_path=Path("m.onnx"),
        model=demo_model_bytes(),
        engine_path=tmp_path / "m.engine",
        simulator=SimulatorSettings(speed=0),
    )
    result = run_isolated(run_build_job, job, monitor=monitor)
    assert result.returned and monitor.state.outcome is Outcome.CANCELLATION
    assert monitor.state.steps_completed_total <= 1, "the first step was answered: stop"
    assert not (tmp_path / "m.engine").exists(), "a cancelled build saved an engine"


class _FirstIdle(threading.Event):
    """The replay's "has the worker ended?" wait: notes whether the cancel is still held when
    the replay first idles on a spool read to its end, then says the worker has ended."""

    def __init__(self, monitor: BuildMonitor) -> None:
        super().__init__()
        self.monitor = monitor
        self.held_when_idle: bool | None = None

    def wait(self, timeout: float | None = None) -> bool:
        if self.held_when_idle is None:
            self.held_when_idle = self.monitor.held_cancel is not None
        self.set()
        return True


@pytest.mark.parametrize(("decided_s_ago", "held"), [(0.1, True), (1.0, False)])
def test_a_held_cancel_waits_its_patience_for_a_worker_that_says_nothing(
    tmp_path: Path, decided_s_ago: float, held: bool
) -> None:
    """A spool read to its end from a worker that has not said how far it got (stopped, or
    dying): the cancel decided meanwhile is held for HELD_CANCEL_PATIENCE_S (half a second)
    after its decision, no less, then goes into the log without the worker's word."""
    spool = tmp_path / "spool"
    spool.touch()
    decided_ns = time.monotonic_ns() - round(decided_s_ago * 1e9)
    monitor = BuildMonitor(clock=ManualClock(mono_ns=decided_ns))
    monitor.start()
    monitor.hold_cancels = True
    assert monitor.cancel("enough", source="user")
    descriptor = os.open(spool, os.O_RDONLY)
    try:
        replay = supervisor._Replay(SpoolReader(descriptor), monitor, supervisor._Inbox())
        idle = replay.worker_ended = _FirstIdle(monitor)
        replay._run()  # on this thread: one idle round, then the worker has ended
    finally:
        os.close(descriptor)
    assert idle.held_when_idle is held
    assert monitor.held_cancel is None, "the worker's end lets it in, whatever the patience"
