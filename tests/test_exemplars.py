"""``trt_build_duration_seconds``: a histogram by backend and outcome whose bucket carries the
build's trace id as an exemplar, scraped from a real TensorRT-RTX build by a real Prometheus with
exemplar storage on and read back through its API."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from cli import CLI
from prometheus_server import PrometheusServer, free_port, promtool_lint
from rtx_builds import import_rtx, write_residual
from trt_otel import BuildMonitor, read_journal
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.core.clock import ManualClock
from trt_otel.core.events import BuildStarted
from trt_otel.views.prometheus import MetricSources, metrics_registry
from trt_otel.views.trace_ids import TRACEPARENT_ATTRIBUTE


def finished_build(**attributes: str) -> BuildMonitor:
    clock = ManualClock()
    monitor = BuildMonitor(attributes={"trt.backend": "tensorrt-rtx", **attributes}, clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    clock.advance(42.5)  # between the 30 s and the 60 s bucket's bounds
    monitor.step_complete("Building engine", 0)
    monitor.phase_finish("Building engine")
    monitor.cancel("over its limit", source="timeout", timeout=True)
    monitor.end()
    return monitor


@pytest.mark.e2e
def test_the_duration_histogram_carries_the_trace_id_in_openmetrics_only() -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    monitor = finished_build(**{TRACEPARENT_ATTRIBUTE: traceparent})
    registry = metrics_registry(MetricSources(monitor))
    text = generate_latest(registry).decode()
    assert promtool_lint(text) == "" if shutil.which("promtool") else True
    assert "trace_id" not in text, "the Prometheus text format has no exemplars"

    exposition = openmetrics(registry).decode()  # type: ignore[no-untyped-call]
    families = text_string_to_metric_families(exposition)  # type: ignore[no-untyped-call]
    (family,) = [f for f in families if f.name == "trt_build_duration_seconds"]
    assert family.type == "histogram"
    buckets = [s for s in family.samples if s.name.endswith("_bucket")]
    assert {tuple(sorted(s.labels.items())) for s in buckets if s.labels["le"] == "+Inf"} == {
        (("backend", "tensorrt-rtx"), ("le", "+Inf"), ("outcome", "timeout"))
    }
    with_exemplar = [s for s in buckets if s.exemplar is not None]
    assert len(with_exemplar) == 1, "one observation, one exemplar, in its own bucket"
    (sample,) = with_exemplar
    assert sample.exemplar.labels == {"trace_id": "0af7651916cd43dd8448eb211c80319c"}, (
        "the traced job's trace, which the build's spans joined"
    )
    duration = next(s.value for s in family.samples if s.name.endswith("_sum"))
    assert duration == 42.5 and sample.labels["le"] == "60.0"
    assert sample.exemplar.value == duration
    assert float(sample.labels["le"]) >= duration
    smaller = [s for s in buckets if s.labels["le"] != "+Inf" and float(s.labels["le"]) < duration]
    assert all(s.value == 0 for s in smaller)


def test_no_duration_until_the_build_ends() -> None:
    monitor = BuildMonitor()
    monitor.start()
    text = generate_latest(metrics_registry(MetricSources(monitor))).decode()
    assert "trt_build_duration_seconds" not in text


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="Debian's prometheus package is not installed (.ci/run installs it)",
)
def test_prometheus_stores_a_real_builds_exemplar_and_its_api_returns_the_trace(
    tmp_path: Path,
) -> None:
    import_rtx()
    # The exporter lingers for one more scrape after the end (--prometheus-linger) only where
    # something scraped during the build: Prometheus tries its target every second once its
    # scrape loop runs, and this build serves its metrics for a few seconds (400 blocks: 3 s
    # on a quiet machine).
    model = write_residual(tmp_path / "residual.onnx", blocks=400)
    exporter = free_port()
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{exporter}", features=("exemplar-storage",))
    try:
        prometheus.wait_until_scraping()
        began = time.time()
        journal = tmp_path / "conv.jsonl"
        built = subprocess.run(
            [*CLI, "build", str(model), "-o", str(tmp_path / "r.engine"), "--shapes",
             RESIDUAL_SHAPES, "--journal", str(journal), "--no-progress", "--no-gpu",
             "--prometheus-port", str(exporter), "--prometheus-linger", "20s",
             "--otlp-logs-level", "off"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr
        assert "final values scraped" in built.stderr, built.stderr
        build_id = next(
            e.build_id for e in read_journal(journal).events if isinstance(e, BuildStarted)
        )
        selector = 'trt_build_duration_seconds_bucket{backend="tensorrt-rtx",outcome="success"}'
        deadline = time.monotonic() + 120  # a loaded machine's Prometheus stores it late
        stored: list[dict[str, object]] = []
        while time.monotonic() < deadline and not stored:
            stored = prometheus.exemplars(selector, began - 60, time.time() + 60)
            if not stored:
                time.sleep(0.25)
        scrapes = prometheus.query("up[5m]") if not stored else []
    finally:
        prometheus.close()
    assert stored, f"no exemplar stored; scrapes: {scrapes}; the build said: {built.stderr}"
    (series,) = stored
    exemplars = series["exemplars"]
    assert isinstance(exemplars, list) and exemplars
    assert {e["labels"]["trace_id"] for e in exemplars} == {build_id}, "the build's trace"
