"""Test doubles for users of trt-otel (and for its own tests)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from random import Random
from typing import Any

from trt_otel.builder.simulator import Callback, Driver
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.clock import ManualClock
from trt_otel.core.events import Event


class CollectingFollower:
    """A follower that keeps every event it is given, in order (thread-safe to read)."""

    def __init__(self, name: str = "collector") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self.closed = False

    def handle(self, events: Sequence[Event]) -> None:
        with self._lock:
            self._events.extend(events)

    def close(self) -> None:
        self.closed = True

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)


def virtual_build(
    plan: Sequence[Callback],
    *,
    pace: float = 1.0,
    jitter: float = 0.3,
    seed: int = 0,
    attributes: dict[str, Any] | None = None,
) -> list[Event]:
    """The events of a simulated build of ``plan`` in virtual time (it takes no real time).

    Each callback's simulated work is scaled by ``pace`` (a slower machine: above 1) and by a
    log-normal factor of spread ``jitter``, so builds of one model differ as real ones do.
    """
    clock = ManualClock()
    random = Random(seed)

    def sleep(seconds: float) -> None:
        clock.advance(seconds * pace * random.lognormvariate(0.0, jitter))

    monitor = BuildMonitor(clock=clock, attributes=attributes or {})
    collector = CollectingFollower()
    monitor.log.follow(collector, min_interval_s=0.0)
    monitor.start()
    result = Driver(speed=1.0, sleep=sleep).run(monitor, plan)
    monitor.end_with_result(b"engine" if result.completed else None)
    monitor.close()
    return collector.events
