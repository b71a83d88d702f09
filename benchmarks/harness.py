"""What the benchmarks share: the baseline monitors, and trt-otel with every projection on."""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trt_otel import BuildMonitor, JournalWriter
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.console import PlainLines
from trt_otel.views.http import StatusServer
from trt_otel.views.otlp import OtlpSpanExport
from trt_otel.views.otlp_settings import OtlpSettings
from trt_otel.views.prometheus import MetricSources, MetricsServer, metrics_registry


class LockAndDictMonitor:
    """The state update of NVIDIA's sample progress monitor: a lock and a dict of active
    phases, no rendering."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, dict[str, Any]] = {}

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        with self._lock:
            indent = self._active[parent_phase]["indent"] + 1 if parent_phase in self._active else 0
            self._active[phase_name] = {"steps": 0, "num_steps": num_steps, "indent": indent}

    def step_complete(self, phase_name: str, step: int) -> bool:
        with self._lock:
            self._active[phase_name]["steps"] = step
        return True

    def phase_finish(self, phase_name: str) -> None:
        with self._lock:
            del self._active[phase_name]


class RenderingSampleMonitor(LockAndDictMonitor):
    """NVIDIA's sample as it ships: the same state, and every step redraws every active phase
    as a progress bar with ANSI cursor moves, flushed to the terminal (here /dev/null)."""

    def __init__(self) -> None:
        super().__init__()
        self._out = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
        self._lines = 0

    def step_complete(self, phase_name: str, step: int) -> bool:
        with self._lock:
            self._active[phase_name]["steps"] = step
            self._redraw()
        return True

    def _redraw(self) -> None:
        out = self._out
        if self._lines:
            out.write(f"\x1b[{self._lines}A")
        for title, phase in self._active.items():
            done = (phase["steps"] + 1) / max(1, phase["num_steps"])
            bar = "=" * int(done * 40)
            out.write(f"\x1b[2K{'  ' * phase['indent']}{title}: [{bar:<40}] {done:4.0%}\n")
        self._lines = len(self._active)
        out.flush()

    def close(self) -> None:
        self._out.close()


@dataclass
class FullMonitor:
    """trt-otel with every projection on, in one process: journal, plain console, span export
    to an unreachable collector, served /metrics, the HTTP view, and the ETA."""

    monitor: BuildMonitor
    spans: OtlpSpanExport
    metrics: MetricsServer
    status: StatusServer
    extra: list[Any] = field(default_factory=list)

    def close(self) -> None:
        self.monitor.end()
        self.monitor.close(30)
        if self.monitor.model is not None:  # the log's fold: closed by its owner
            self.monitor.model.close()
        self.spans.shutdown(1.0)
        self.metrics.close()
        self.status.close(linger_s=1.0)


def full_monitor(
    directory: Path, dead_port: int, name: str = "bench", *, supervising: bool = False
) -> FullMonitor:
    """Wired as :func:`trt_otel.app.session.run_session` wires it: the journal, the read model
    (console lines, span projection and ETA read it), the HTTP view's feed. ``supervising``:
    as a supervisor's monitor, whose fold is the read model (else the model follows)."""
    model = ReadModel()
    monitor = BuildMonitor(
        attributes={"model.path": "bench.onnx"}, model=model if supervising else None
    )
    log = monitor.log
    log.follow(JournalWriter(directory / f"{name}.jsonl"), capacity=1_000_000)
    settings = OtlpSettings.resolve(f"http://127.0.0.1:{dead_port}", "http/protobuf", environ={})
    assert settings is not None
    spans = OtlpSpanExport(settings, warn=lambda message: None, model=model)
    model.subscribe(spans)
    model.subscribe(PlainLines(model, io.StringIO()))
    if not supervising:
        log.follow(model, capacity=1_000_000)

    def eta() -> float | None:
        return model.estimate(monitor.log.clock.mono_ns()).build.seconds

    registry = metrics_registry(MetricSources(monitor, span_health=spans.health, eta=eta))
    metrics = MetricsServer(registry, 0)
    status = StatusServer(monitor, model, registry, port=0, cancel_token="bench")
    log.follow(status.feed, capacity=1_000_000)
    return FullMonitor(monitor, spans, metrics, status)
