"""Test doubles for users of trt-otel (and for its own tests)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from trt_otel.events import Event


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
