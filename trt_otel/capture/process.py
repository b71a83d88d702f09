"""The builder's process, sampled: CPU, memory, state, threads and I/O, through psutil.

A :class:`ProcessSampler` reads one process (the worker of ``build`` and ``demo``, the program of
``run``, a journal's writer on this host) every ``interval_s`` on a thread of its own, and appends
each reading as a ``process`` event. The fold (:mod:`trt_otel.core.activity`) judges from them
whether the builder is working, idle, stopped or gone, so the journal, ``replay`` and every view
say the same. Reading a process costs a few ``/proc`` files a sample; a failing read costs that
sample, is reported once, and never touches the build.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import psutil

from trt_otel.core.clock import SYSTEM_CLOCK
from trt_otel.core.events import ProcessSample

if TYPE_CHECKING:
    from trt_otel.capture.monitor import BuildMonitor, BuildOpen

_logger = logging.getLogger(__name__)

Warn = Callable[[str], None]

_STATUSES = {
    psutil.STATUS_RUNNING: "running",
    psutil.STATUS_SLEEPING: "sleeping",
    psutil.STATUS_DISK_SLEEP: "disk-wait",
    psutil.STATUS_STOPPED: "stopped",
    psutil.STATUS_TRACING_STOP: "tracing-stop",
    psutil.STATUS_ZOMBIE: "zombie",
    psutil.STATUS_DEAD: "dead",
    psutil.STATUS_IDLE: "sleeping",
}


class ProcessReader:
    """Reads one process; the CPU figures are the use since the previous :meth:`read`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._process = psutil.Process(pid)
        self._last_cpu_s: float | None = None
        self._last_threads: dict[int, float] = {}
        self._last_at: float | None = None

    def read(self, now_s: float) -> dict[str, object]:
        """One reading, as the ``process`` event's fields. ``now_s``: a monotonic time."""
        try:
            with self._process.oneshot():
                status = _STATUSES.get(self._process.status(), "running")
                times = self._process.cpu_times()
                cpu_s = times.user + times.system
                reading: dict[str, object] = {
                    "status": status,
                    "cpu_seconds": round(cpu_s, 3),
                    "rss_bytes": self._process.memory_info().rss,
                    "threads": self._process.num_threads(),
                }
                threads = {t.id: t.user_time + t.system_time for t in self._process.threads()}
                try:
                    io = self._process.io_counters()
                    reading["read_bytes"], reading["write_bytes"] = io.read_bytes, io.write_bytes
                except (psutil.AccessDenied, AttributeError):  # not ours to read, or no such API
                    pass
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return {"status": "gone"}
        if self._last_at is not None and self._last_cpu_s is not None and now_s > self._last_at:
            elapsed = now_s - self._last_at
            reading["cpu_percent"] = round(max(0.0, cpu_s - self._last_cpu_s) / elapsed * 100, 1)
            busiest = max(
                (used - self._last_threads.get(tid, 0.0) for tid, used in threads.items()),
                default=0.0,
            )
            reading["busiest_thread_percent"] = round(max(0.0, busiest) / elapsed * 100, 1)
        self._last_cpu_s, self._last_threads, self._last_at = cpu_s, threads, now_s
        return reading


Record = Callable[[int, dict[str, object]], ProcessSample | None]
"""Records one reading (the process id and the event's fields) and returns it as an event (None:
not recorded, the build has ended)."""


def appending_to(monitor: BuildMonitor, build_open: BuildOpen | None = None) -> Record:
    """Each reading recorded by ``monitor`` as a ``process`` event (journaled, replayed,
    projected), while ``build_open`` says the build has not ended."""

    def record(pid: int, fields: dict[str, object]) -> ProcessSample | None:
        return monitor.sample(ProcessSample, build_open, pid=pid, **fields)

    return record


class ProcessSampler:
    """Records a ``process`` event every ``interval_s``, on its own thread, for the process
    :meth:`watch` names (none until then): recorded by the build's ``monitor``, or handed to
    ``record`` (a follower of a journal cannot add to the build's own log). A process that is
    gone is said once, and sampling stops."""

    def __init__(
        self,
        monitor: BuildMonitor | None,
        *,
        interval_s: float = 1.0,
        warn: Warn | None = None,
        pid: int | None = None,
        record: Record | None = None,
        build_open: BuildOpen | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("the sampling interval must be longer than 0s")
        if record is None:
            if monitor is None:
                raise ValueError("a sampler needs a monitor to record its samples, or a record")
            record = appending_to(monitor, build_open)
        self._record = record
        self._clock = monitor.log.clock if monitor is not None else SYSTEM_CLOCK
        self.interval_s = interval_s
        self.samples = 0
        self.errors = 0
        self._warn = warn or (lambda message: _logger.warning("%s", message))
        self._reader: ProcessReader | None = None
        self._watched = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trt-otel-process", daemon=True)
        if pid is not None:
            self.watch(pid)

    def watch(self, pid: int) -> None:
        """Sample ``pid`` from now on (the worker, once it has started). Safe from any thread."""
        try:
            self._reader = ProcessReader(pid)
        except psutil.Error as error:
            self._fail(error)
            return
        self._watched.set()

    def start(self) -> ProcessSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._watched.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def __enter__(self) -> ProcessSampler:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def sample_once(self) -> ProcessSample | None:
        reader = self._reader
        if reader is None:
            return None
        try:
            reading = reader.read(self._clock.mono_ns() / 1e9)
            reading["available_bytes"] = psutil.virtual_memory().available
        except Exception as error:  # a failing read costs this sample, nothing else
            self._fail(error)
            return None
        self.samples += 1
        event = self._record(reader.pid, reading)
        if event is None:  # the build has ended: nothing more to sample
            self._reader = None
            return None
        if event.status == "gone":
            self._reader = None
        return event

    def _fail(self, error: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            self._warn(
                f"reading the builder's process failed ({type(error).__name__}: {error}); "
                "the build goes on, further failures are only counted"
            )

    def _run(self) -> None:
        self._watched.wait()
        while not self._stop.is_set() and self._reader is not None:
            self.sample_once()
            self._stop.wait(self.interval_s)
