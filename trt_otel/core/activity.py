"""Is the builder working, or hung? The verdict folded from its process's samples.

TensorRT is silent for most of a real build: one step of "Determining refit engines" can take
minutes with no callback. The callbacks alone cannot tell a builder computing through such a
window from one that is deadlocked or stopped; its process can. Each ``process`` event (see
:class:`~trt_otel.core.events.ProcessSample`) is judged with the callbacks made since the one
before it, and the verdict is one of exactly:

- ``working``: it called back, or used CPU (or its GPU) above a small threshold, within the last
  :data:`IDLE_AFTER_S`;
- ``idle``: it did neither for longer than that (asleep at about 0% CPU: a deadlock, a wait that
  will not end);
- ``stopped``: its process is stopped (SIGSTOP, a debugger);
- ``gone``: its process no longer exists (or is a zombie).

A pure fold: the verdict depends only on the events, so a replayed journal says what the live
build said.
"""

from __future__ import annotations

import enum
from collections import deque

from trt_otel.core.durations import format_duration
from trt_otel.core.events import GpuSample, ProcessSample
from trt_otel.core.sizes import format_bytes

ACTIVE_CPU_PERCENT = 5.0
"""CPU use (100: one core) above which the builder counts as working."""
ACTIVE_GPU_UTILIZATION = 0.05
"""GPU utilization (0 to 1) above which the builder counts as working."""
CPU_WINDOW_S = 1.0
"""The shortest time over which CPU use is judged."""
IDLE_AFTER_S = 3.0
"""How long a builder must show no sign of work before it is ``idle``: a builder that waits a
moment on its disk or its GPU is not hung."""


class Verdict(enum.StrEnum):
    WORKING = "working"
    IDLE = "idle"
    STOPPED = "stopped"
    GONE = "gone"


STOPPED_STATUSES = frozenset({"stopped", "tracing-stop"})
GONE_STATUSES = frozenset({"gone", "zombie", "dead"})


class Activity:
    """The builder's process as the views and the stall policy see it: the latest sample, the
    verdict and since when it holds, the peak resident memory, and the last moment it was seen
    working (monotonic ns)."""

    __slots__ = (
        "_cpu_history",
        "_first_mono_ns",
        "last_active_mono_ns",
        "last_sample",
        "peak_rss_bytes",
        "rss_rising",
        "since_mono_ns",
        "verdict",
    )

    def __init__(self) -> None:
        self.last_sample: ProcessSample | None = None
        self.verdict: Verdict | None = None
        self.since_mono_ns: int | None = None
        self.last_active_mono_ns: int | None = None
        """The last sample that showed work (a callback since the one before, CPU or GPU use
        measured): never the first sample's time for its own sake."""
        self._first_mono_ns: int | None = None
        self.peak_rss_bytes: int | None = None
        self.rss_rising = False
        self._cpu_history: deque[tuple[int, float]] = deque()
        """(monotonic ns, CPU seconds) of the recent samples, a little over a window's worth."""

    def _busy(self, sample: ProcessSample) -> bool:
        """Whether the process used CPU above the threshold over the last :data:`CPU_WINDOW_S`
        at least: a blip (a few ms of a sleeping process, or of a writer that samples itself)
        over a short sampling interval is not work, and steady work at any interval is."""
        if sample.cpu_seconds is None:
            return sample.cpu_percent is not None and sample.cpu_percent >= ACTIVE_CPU_PERCENT
        history = self._cpu_history
        history.append((sample.mono_ns, sample.cpu_seconds))
        window_ns = CPU_WINDOW_S * 1e9
        # Keep the latest sample at least a window older than this one, and none before it.
        while len(history) > 2 and sample.mono_ns - history[1][0] >= window_ns:
            history.popleft()
        then_ns, then_cpu = history[0]
        if then_ns == sample.mono_ns:  # the first sample: its own figure is all there is
            return sample.cpu_percent is not None and sample.cpu_percent >= ACTIVE_CPU_PERCENT
        elapsed_s = max(CPU_WINDOW_S, (sample.mono_ns - then_ns) / 1e9)
        return sample.cpu_seconds - then_cpu >= ACTIVE_CPU_PERCENT / 100 * elapsed_s

    def sample(
        self,
        sample: ProcessSample,
        last_progress_mono_ns: int | None,
        gpu: GpuSample | None = None,
    ) -> None:
        """Fold one sample in: ``last_progress_mono_ns`` is the build's last callback."""
        previous = self.last_sample
        called_back = (
            last_progress_mono_ns is not None
            and previous is not None
            and last_progress_mono_ns > previous.mono_ns
        )
        busy_cpu = self._busy(sample)
        busy_gpu = (
            gpu is not None
            and gpu.utilization is not None
            and gpu.utilization >= ACTIVE_GPU_UTILIZATION
        )
        quiet_since: int | None = None
        if sample.status in GONE_STATUSES:
            verdict = Verdict.GONE
        elif sample.status in STOPPED_STATUSES:
            verdict = Verdict.STOPPED
        else:
            if called_back or busy_cpu or busy_gpu:
                self.last_active_mono_ns = sample.mono_ns
            if self._first_mono_ns is None:
                self._first_mono_ns = sample.mono_ns
            # A first sample with nothing measured yet is working (the builder has only just
            # started), but it is no activity: the stall counts from the build's last progress
            # until a sample shows work.
            quiet_since = (
                self._first_mono_ns
                if self.last_active_mono_ns is None
                else self.last_active_mono_ns
            )
            quiet_ns = sample.mono_ns - quiet_since
            verdict = Verdict.IDLE if quiet_ns > IDLE_AFTER_S * 1e9 else Verdict.WORKING
        if verdict is not self.verdict:
            self.verdict = verdict
            self.since_mono_ns = (
                quiet_since
                if verdict is Verdict.IDLE and quiet_since is not None
                else sample.mono_ns
            )
        if sample.rss_bytes is not None:
            last_rss = previous.rss_bytes if previous is not None else None
            self.rss_rising = last_rss is not None and sample.rss_bytes > last_rss
            self.peak_rss_bytes = max(self.peak_rss_bytes or 0, sample.rss_bytes)
        self.last_sample = sample

    def as_json(self) -> dict[str, object] | None:
        """The ``builder`` object of ``/status`` (and of ``watch``'s and MCP's status): None
        where the builder's process is not sampled."""
        sample = self.last_sample
        if sample is None or self.verdict is None:
            return None
        return {
            "state": self.verdict.value,
            "evidence": self.evidence(),
            "since_s": self.since_s(),
            "pid": sample.pid,
            "status": sample.status,
            "cpu_percent": sample.cpu_percent,
            "busiest_thread_percent": sample.busiest_thread_percent,
            "cpu_seconds": sample.cpu_seconds,
            "rss_bytes": sample.rss_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "threads": sample.threads,
            "read_bytes": sample.read_bytes,
            "write_bytes": sample.write_bytes,
            "available_bytes": sample.available_bytes,
        }

    def since_s(self) -> float | None:
        """How long the verdict has held, at the latest sample."""
        if self.last_sample is None or self.since_mono_ns is None:
            return None
        return max(0.0, (self.last_sample.mono_ns - self.since_mono_ns) / 1e9)

    def describe(self) -> str | None:
        """The verdict and its evidence, for a line: ``working (CPU 97%, 455 MiB, rising)``,
        ``idle for 35.0s (CPU 0%, 300 MiB)``, ``stopped (SIGSTOP?)``; None if not sampled."""
        if self.verdict is None:
            return None
        since = self.since_s()
        held = (
            f" for {format_duration(since)}"
            if self.verdict is Verdict.IDLE and since is not None
            else ""
        )
        evidence = self.evidence()
        return f"{self.verdict.value}{held} ({evidence})" if evidence else self.verdict.value

    def evidence(self) -> str:
        """The verdict's evidence in a few words: ``CPU 97%, 455 MiB, rising``."""
        sample = self.last_sample
        if sample is None:
            return ""
        if self.verdict is Verdict.GONE:
            return f"process {sample.pid} {sample.status}"
        if self.verdict is Verdict.STOPPED:
            return "SIGSTOP?"
        parts = []
        if sample.cpu_percent is not None:
            parts.append(f"CPU {sample.cpu_percent:.0f}%")
        if sample.rss_bytes is not None:
            parts.append(format_bytes(sample.rss_bytes))
            if self.rss_rising:
                parts.append("rising")
        return ", ".join(parts)
