"""A follower that raises, blocks forever or falls behind never touches step_complete."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from trt_otel import BuildMonitor, Event, EventLog
from trt_otel.core.followers import FollowerWorker
from trt_otel.testing import CollectingFollower
from trt_otel.views.prometheus import MetricSources, metrics_registry


class Raising:
    name = "raising"

    def __init__(self) -> None:
        self.calls = 0

    def handle(self, events: Sequence[Event]) -> None:
        self.calls += 1
        raise RuntimeError("collector exploded")

    def close(self) -> None:
        raise OSError("cannot close either")


class Blocking:
    name = "blocking"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def handle(self, events: Sequence[Event]) -> None:
        self.entered.set()
        self.release.wait()

    def close(self) -> None:
        pass


def drive(monitor: BuildMonitor, steps: int) -> list[bool]:
    monitor.phase_start("Measuring tactic time", None, steps)
    answers = [monitor.step_complete("Measuring tactic time", s) for s in range(steps)]
    monitor.phase_finish("Measuring tactic time")
    return answers


def test_a_raising_follower_is_counted_and_keeps_receiving() -> None:
    monitor = BuildMonitor()
    raising = Raising()
    worker = monitor.log.follow(raising, min_interval_s=0)
    answers = []
    for batch in range(5):
        answers += drive(monitor, 100)
        assert worker.flush(5)
        assert raising.calls >= batch + 1
    monitor.end()
    assert answers == [True] * 500
    assert monitor.close(5)
    health = worker.health()
    assert health.errors == raising.calls + 1  # every batch, and the close
    assert health.handled == monitor.log.next_seq
    assert health.last_error == "OSError: cannot close either"


def test_a_follower_blocked_forever_neither_blocks_nor_changes_the_answers() -> None:
    log = EventLog()
    monitor = BuildMonitor(log=log)
    blocking = Blocking()
    worker = log.follow(blocking, capacity=1_000)
    monitor.phase_start("warm-up", None, 1)
    assert blocking.entered.wait(5)  # the follower thread is now stuck inside handle()

    answers = drive(monitor, 20_000)  # completes: the callback thread never waits on it
    monitor.cancel("stop", source="test")
    after_cancel = monitor.step_complete("Measuring tactic time", 0)

    assert answers == [True] * 20_000
    assert after_cancel is False
    health = worker.health()
    assert health.queued == 1_000
    assert health.dropped == log.next_seq - 1_000 - 2  # 2 were taken before it blocked
    assert worker.flush(0.2) is False
    assert log.close(0.2) is False  # a hung follower is abandoned, not waited for
    blocking.release.set()


def test_a_follower_joining_late_first_gets_the_retained_events() -> None:
    monitor = BuildMonitor()
    drive(monitor, 10)

    late = CollectingFollower("late")
    monitor.log.follow(late)
    drive(monitor, 5)
    monitor.end()
    assert monitor.close(5)
    assert [e.seq for e in late.events] == list(range(monitor.log.next_seq))


def test_a_batch_too_big_for_the_queue_keeps_its_newest_events() -> None:
    """A batch offered at once (a frame of a worker's callbacks) to a queue with room for
    three: the oldest go, counted, and the follower is handed the three newest, in order."""
    monitor = BuildMonitor()
    drive(monitor, 3)
    events = monitor.log.recent()
    assert len(events) == 6  # the build's start, the phase's, three steps, its finish
    collector = CollectingFollower("small")
    worker = FollowerWorker(collector, capacity=3, min_interval_s=0)
    worker.offer_many(events)  # before its thread starts: nothing is taken meanwhile
    worker.start()
    assert worker.flush(5)
    assert [e.seq for e in collector.events] == [e.seq for e in events[-3:]]
    assert worker.health().dropped == 3
    assert worker.shutdown(5)


def test_a_batch_that_fails_counts_each_of_its_events_as_failed() -> None:
    """A follower joining late is handed the retained events in one batch: when handling it
    raises, every event of that batch may be missing from what it made, not just one."""
    monitor = BuildMonitor()
    drive(monitor, 10)
    monitor.end()
    worker = monitor.log.follow(Raising(), min_interval_s=0)
    assert worker.flush(5)
    health = worker.health()
    assert health.errors == 1, "the retained events came as one batch"
    assert health.failed_events == monitor.log.next_seq == 14
    assert health.lost == 14
    assert monitor.close(5)


def test_a_log_that_follows_another_build_keeps_its_numbers() -> None:
    """Events numbered by the log they were recorded in (a build followed from elsewhere)
    keep their seq in the log that takes them: those taken already are skipped, and after a
    gap (events the reader lost) the log goes on from the number it was given."""
    source = BuildMonitor()
    source.start()
    drive(source, 5)
    source.end()
    events = source.log.recent()

    follower = BuildMonitor()
    follower.mirror(events[:3])
    follower.mirror(events)  # the first three again, then the rest
    assert [e.seq for e in follower.log.recent()] == [e.seq for e in events]
    assert follower.log.next_seq == source.log.next_seq
    assert follower.state.outcome is source.state.outcome is not None

    with_gap = BuildMonitor()
    with_gap.mirror([*events[:2], *events[5:]])
    assert [e.seq for e in with_gap.log.recent()] == [0, 1, *range(5, len(events))]
    assert with_gap.log.next_seq == source.log.next_seq


def test_the_metrics_tell_failed_events_from_dropped_ones() -> None:
    """A follower that fails on every batch and one that is too slow for its queue: each loss
    shows under its own name in the exposition text a scrape reads."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from trt_otel.views.prometheus import MetricSources, metrics_registry

    class Failing:
        name = "failing"

        def handle(self, events: Sequence[Event]) -> None:
            raise OSError("disk full")

        def close(self) -> None:
            pass

    release = threading.Event()

    class Stuck:
        name = "stuck"

        def handle(self, events: Sequence[Event]) -> None:
            release.wait(30)

        def close(self) -> None:
            pass

    monitor = BuildMonitor()
    failing = monitor.log.follow(Failing(), min_interval_s=0.0)
    stuck = monitor.log.follow(Stuck(), capacity=5, min_interval_s=0.0)
    registry = metrics_registry(MetricSources(monitor))
    monitor.phase_start("A", None, 100)
    for step in range(40):
        monitor.step_complete("A", step)
    assert failing.flush(10.0)
    values = {
        (sample.name, sample.labels.get("follower")): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    release.set()
    monitor.close()
    lost, dropped = failing.health().failed_events, stuck.health().dropped
    assert lost > 0 and dropped > 0
    assert values[("trt_otel_follower_failed_events_total", "failing")] == lost
    assert values[("trt_otel_follower_dropped_events_total", "failing")] == 0
    assert values[("trt_otel_follower_dropped_events_total", "stuck")] == dropped
    assert values[("trt_otel_follower_failed_events_total", "stuck")] == 0


def test_a_fold_that_fails_is_counted_in_the_metrics_and_the_log_goes_on() -> None:
    monitor = BuildMonitor()
    monitor.start()
    failures = 0

    def broken(event: object) -> None:
        nonlocal failures
        failures += 1
        raise RuntimeError("a fold's bug")

    monitor.log.add_fold(broken, replay_retained=False)
    monitor.phase_start("Building engine", None, 2)
    assert monitor.step_complete("Building engine", 0) is True
    assert failures == 2 and monitor.state.steps_completed_total == 1
    text = generate_latest(metrics_registry(MetricSources(monitor))).decode()
    (family,) = [
        f for f in text_string_to_metric_families(text) if f.name == "trt_otel_fold_errors"
    ]
    assert [s.value for s in family.samples] == [2]
