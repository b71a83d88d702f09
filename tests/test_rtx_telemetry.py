"""A real TensorRT-RTX build's metrics and spans, through a real Prometheus server (scraping the
build while it runs, its silent window included) and a real OTLP receiver.

Skipped where ``tensorrt_rtx`` does not import, and (the Prometheus half) where Debian's
``prometheus`` is not installed; each with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from otlp_receiver import OtlpReceiver, final_spans, snapshots
from prometheus_server import PrometheusServer, free_port
from rtx_builds import HELD_BLOCKS, SILENT_PHASE, held_in_silent_step, write_residual
from trt_otel import read_journal
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.core.events import PhaseStarted, StepCompleted
from waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_real_builds_metrics_and_spans_arrive(
    rtx: Any, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus package is not installed (.ci/run installs it)")
    model = write_residual(tmp_path / "residual.onnx", HELD_BLOCKS)
    exporter = free_port()
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{exporter}")
    try:
        prometheus.wait_until_scraping()
        journal, engine = tmp_path / "r.jsonl", tmp_path / "r.engine"
        process = subprocess.Popen(
            [*CLI, "build", str(model), "-o", str(engine), "--journal", str(journal),
             "--no-progress", "--no-gpu", "--shapes", RESIDUAL_SHAPES,
             "--prometheus-port", str(exporter), "--prometheus-linger", "10s",
             "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}",
             "--otlp-protocol", "grpc"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # Scraped while TensorRT is silent: the open phase, none of its steps done yet, in a
        # sample of the build's running state (looked for over the run, not only at this instant).
        silent = (
            f'min_over_time(trt_build_phase_steps_completed{{phase="{SILENT_PHASE}"}}[10m]) == 0'
        )
        try:
            # Held in its silent window until Prometheus has scraped it there, and its outermost
            # phase was shown while it ran (after 5 s open: --otlp-live is on by default).
            with held_in_silent_step(journal):
                assert prometheus.wait_for(silent, timeout_s=60), "not scraped in the silent window"
                assert prometheus.query('max_over_time(trt_build_state{state="running"}[10m]) == 1')
                wait_until(
                    lambda: "Building engine" in {s.name for s in snapshots(receiver.spans)},
                    "the outermost phase shown while it ran",
                    60,
                )
        finally:
            _, err = process.communicate(timeout=300)  # a hang's guard: 104 s once in CI
        assert process.returncode == 0, err
        # The exporter is gone now, and its series stale: read their last samples.
        success = 'last_over_time(trt_build_state{state="success"}[5m]) == 1'
        assert prometheus.wait_for(success, timeout_s=60), f"no final scrape: {err[-2000:]}"
        (info,) = prometheus.query("last_over_time(trt_build_info[5m])")
        assert info["metric"]["backend"] == "tensorrt-rtx"
        assert info["metric"]["trt_version"] == rtx.__version__
        events = read_journal(journal).events
        steps = sum(isinstance(e, StepCompleted) for e in events)
        (total,) = prometheus.query("last_over_time(trt_build_steps_completed_total[5m])")
        assert int(float(total["value"][1])) == steps
    finally:
        prometheus.close()

    phases = Counter(e.name for e in events if isinstance(e, PhaseStarted))
    wait_until(
        lambda: len(final_spans(receiver.spans)) >= sum(phases.values()) + 1, "every span", 30
    )
    # The final trace is what it is without the snapshots.
    spans = final_spans(receiver.spans)
    (build,) = [s for s in spans if not s.parent_span_id]
    assert build.attributes["trt.backend"] == "tensorrt-rtx"
    assert build.attributes["trt.version"] == rtx.__version__
    assert build.attributes["cicd.pipeline.result"] == "success"
    assert Counter(s.name for s in spans if s.parent_span_id) == phases
    # The silent window is inside its phase's span, as long as the journal says it was.
    (refit,) = [s for s in spans if s.name == SILENT_PHASE]
    start = next(e for e in events if isinstance(e, PhaseStarted) and e.name == SILENT_PHASE)
    step = next(e for e in events if isinstance(e, StepCompleted) and e.name == SILENT_PHASE)
    assert refit.end_ns - refit.start_ns >= step.wall_ns - start.wall_ns > 1_000_000_000
