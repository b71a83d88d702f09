"""Is a journal's writer still there? How ``watch JOURNAL`` tells a silent build from a lost one.

A live build can be silent for minutes (TensorRT makes no callback), so a journal that stops
growing proves nothing by itself. The writer leaves two signs of life:

- its process id and host name in the journal's header (``writer_pid``, ``writer_host``): a
  follower on the same host sees at once that the process is gone (``kill -9``, a crash);
- a touch of the file (its modification time) every ``touch_interval_s`` (10 s) while it is
  open, even when there is nothing to write: a follower elsewhere (a shared filesystem) sees the
  file's time move. Only a change is looked at, never the time itself, so clocks need not agree.

A followed journal with no end is lost at once when its writer ran on this host and its process
is gone; when the writer ran elsewhere (or an older journal does not say), when neither a line
nor a touch came for ``lost_after_s``.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_otel.control.stopping import holds_write_lock, process_running
from trt_otel.core.durations import format_duration

DEFAULT_LOST_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class Writer:
    """A journal's writer, as its header describes it (None: an older journal does not say)."""

    pid: int | None
    host: str | None
    created_wall_ns: int | None

    @classmethod
    def from_header(cls, header: Mapping[str, Any]) -> Writer:
        pid, host = header.get("writer_pid"), header.get("writer_host")
        created = header.get("created_wall_ns")
        return cls(
            pid if type(pid) is int and pid > 0 else None,
            host if isinstance(host, str) else None,
            created if type(created) is int else None,
        )

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def running_here(self, journal: Path | None = None) -> bool | None:
        """Whether the writer's process runs, when it ran on this host (None: cannot tell).
        Given the ``journal``, a process that runs but provably does not hold its write lock is
        not its writer (a header is text anyone can write, and a reader holds the journal open
        too): None, not a sign of life."""
        if self.pid is None or self.host != socket.gethostname():
            return None
        running = process_running(self.pid, self.created_wall_ns)
        if running and journal is not None and holds_write_lock(self.pid, journal) is False:
            return None
        return running


class Liveness:
    """Decides, poll by poll, whether a followed journal with no end is lost."""

    def __init__(
        self,
        path: Path,
        header: Mapping[str, Any],
        lost_after_s: float = DEFAULT_LOST_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.writer = Writer.from_header(header)
        self.lost_after_s = lost_after_s
        self._clock = clock
        self._last_sign = clock()
        self._mtime_ns = self._modified_ns()

    def _modified_ns(self) -> int | None:
        try:
            return os.stat(self.path).st_mtime_ns
        except OSError:
            return None

    def grew(self) -> None:
        """New lines: a sign of life."""
        self._last_sign = self._clock()

    def lost(self) -> str | None:
        """Why the build is lost, or None while it may still be running."""
        running = self.writer.running_here(self.path)
        if running is False:
            return (
                f"{self.path}: its writer ({self.writer.describe()}) is gone and the journal "
                "has no end: the build was lost"
            )
        mtime = self._modified_ns()
        if running or mtime != self._mtime_ns:  # its process, or a touch, is a sign of life
            self._mtime_ns = mtime
            self._last_sign = self._clock()
        if self._clock() - self._last_sign > self.lost_after_s:
            return (
                f"{self.path}: nothing written nor touched for "
                f"{format_duration(self.lost_after_s)} and the journal has no end: the build "
                "was lost (--lost-after waits longer)"
            )
        return None
