"""Clocks, injectable so tests and replays never depend on the machine's time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where events get their timestamps."""

    def wall_ns(self) -> int:
        """Nanoseconds since the Unix epoch (for spans and people)."""
        ...

    def mono_ns(self) -> int:
        """Monotonic nanoseconds (for durations, immune to clock steps)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def wall_ns(self) -> int:
        return time.time_ns()

    def mono_ns(self) -> int:
        return time.monotonic_ns()


class ManualClock:
    """A clock that moves only when told to; both readings advance together."""

    def __init__(self, wall_ns: int = 1_700_000_000_000_000_000, mono_ns: int = 0) -> None:
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns

    def wall_ns(self) -> int:
        return self._wall_ns

    def mono_ns(self) -> int:
        return self._mono_ns

    def advance(self, seconds: float) -> None:
        delta = round(seconds * 1e9)
        self._wall_ns += delta
        self._mono_ns += delta


SYSTEM_CLOCK = SystemClock()
