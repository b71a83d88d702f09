"""Concurrent callbacks from many builder threads: nothing lost, seq contiguous, state right."""

from __future__ import annotations

import threading

from trt_otel import BuildMonitor, PhaseStatus
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core.events import PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.testing import CollectingFollower

THREADS = 8
CALLBACKS_PER_THREAD = 50_000
STEPS_PER_THREAD = CALLBACKS_PER_THREAD - 2  # one phase_start and one phase_finish each


def test_eight_threads_of_fifty_thousand_callbacks_lose_nothing() -> None:
    monitor = BuildMonitor()
    collector = CollectingFollower()
    worker = monitor.log.follow(collector, capacity=1_000_000)
    barrier = threading.Barrier(THREADS)
    answers: list[set[object]] = [set() for _ in range(THREADS)]

    def builder_thread(index: int) -> None:
        name = f"phase-{index}"
        barrier.wait()
        monitor.phase_start(name, None, STEPS_PER_THREAD)
        seen = answers[index]
        for step in range(STEPS_PER_THREAD):
            seen.add(monitor.step_complete(name, step))
        monitor.phase_finish(name)

    threads = [
        threading.Thread(target=builder_thread, args=(i,), name=f"builder-{i}")
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    monitor.end()
    assert monitor.close(timeout_s=30)

    events = collector.events
    assert worker.health().dropped == 0
    assert [e.seq for e in events] == list(range(len(events)))
    # build_start + every callback + build_end
    assert len(events) == THREADS * CALLBACKS_PER_THREAD + 2
    assert all(seen == {True} for seen in answers)
    state = monitor.state
    assert state.steps_completed_total == THREADS * STEPS_PER_THREAD
    assert not state.anomalies
    assert len(state.phases) == THREADS
    for phase in state.phases.values():
        assert phase.status is PhaseStatus.FINISHED
        assert phase.steps_completed == STEPS_PER_THREAD
        assert phase.last_step == STEPS_PER_THREAD - 1
    # Each thread's steps are in order in the log, stamped with the calling thread.
    for index in range(THREADS):
        mine = [e for e in events if isinstance(e, StepCompleted) and e.name == f"phase-{index}"]
        assert [e.step for e in mine] == list(range(STEPS_PER_THREAD))
        assert {e.thread for e in mine} == {f"builder-{index}"}


def test_the_simulator_calls_back_from_several_builder_threads() -> None:
    monitor = BuildMonitor()
    plan = generate_plan(13)
    result = Driver(speed=0, threads=4).run(monitor, plan)
    assert result.completed
    events = monitor.log.recent()
    threads = {e.thread for e in events if e.type in ("step", "phase_start")}
    assert len(threads) == 4
    assert all(name.startswith("trt-builder-") for name in threads)
    assert not monitor.state.anomalies
    # Each phase instance calls back from one thread, as with TensorRT's max_threads, and the
    # callbacks are the plan's, in its order.
    thread_of_open: dict[str, str] = {}
    for event in events:
        if isinstance(event, PhaseStarted):
            thread_of_open[event.name] = event.thread
        elif isinstance(event, StepCompleted | PhaseFinished):
            assert thread_of_open[event.name] == event.thread, event
    kinds = {"phase_start": "phase_start", "step": "step_complete", "phase_finish": "phase_finish"}
    assert [kinds[e.type] for e in events if e.type in kinds] == [c.kind for c in plan]
