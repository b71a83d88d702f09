"""``--otlp-metrics``: the series of ``/metrics`` pushed over OTLP (the SDK's periodic reader and a
final export), decoded from the wire by a real receiver: the same names and labels, units from
the names, the duration histogram with the build's trace id as its exemplar."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cli import CLI
from otlp_receiver import OtlpReceiver, ReceivedPoint, hanging_collector
from rtx_builds import import_rtx, write_conv
from trt_otel import BuildMonitor, ProcessSample, read_journal
from trt_otel.builder.onnx_models import CONV_SHAPES
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core.events import BuildStarted
from trt_otel.views.otlp_metrics import OtlpMetricsExport
from trt_otel.views.otlp_settings import GRPC, METRICS, OtlpSettings
from trt_otel.views.prometheus import MetricSources, metrics_registry

MIB = 1 << 20


def exposition_series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The (name, labels) of every sample of a Prometheus text exposition, histograms and
    ``_created`` samples aside."""
    found = set()
    for family in text_string_to_metric_families(text):
        if family.type == "histogram":
            continue
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                found.add((sample.name, tuple(sorted(sample.labels.items()))))
    return found


Series = tuple[str, tuple[tuple[str, str], ...]]


def last_export(points: list[ReceivedPoint]) -> dict[Series, ReceivedPoint]:
    """The latest point of each series (an OTLP counter named as its family: ``_total`` added,
    as OTLP-to-Prometheus translation does)."""
    latest: dict[Series, ReceivedPoint] = {}
    for point in sorted(points, key=lambda p: p.time_ns):
        name = point.metric + ("_total" if point.kind == "sum" and point.monotonic else "")
        latest[(name, tuple(sorted(point.attributes.items())))] = point
    return latest


def test_the_pushed_series_are_the_scraped_series(receiver: OtlpReceiver) -> None:
    settings = OtlpSettings.resolve(
        f"http://127.0.0.1:{receiver.grpc_port}", GRPC, environ={}, signal=METRICS
    )
    assert settings is not None
    monitor = BuildMonitor(attributes={"trt.backend": "simulator", "model.path": "m.onnx"})
    registry = metrics_registry(MetricSources(monitor))
    export = OtlpMetricsExport(settings, registry, interval_s=3600.0)  # only the final export
    Driver(speed=0).run(monitor, generate_plan(3))
    monitor.sample(ProcessSample, pid=1234, status="running", cpu_seconds=1.0, rss_bytes=MIB)
    monitor.end()
    health = export.shutdown(10.0)
    assert (health.exported, health.failed, health.reason) == (1, 0, None)
    points = receiver.wait_for_metric_requests(1)

    scraped = exposition_series(generate_latest(registry).decode())
    pushed = last_export(points)
    histogram = {series for series in pushed if series[0] == "trt_build_duration_seconds"}
    assert set(pushed) - histogram == scraped
    assert pushed[("trt_build_state", (("state", "success"),))].value == 1
    steps = pushed[("trt_build_steps_completed_total", ())]
    assert steps.kind == "sum" and steps.monotonic
    assert steps.value == monitor.state.steps_completed_total
    assert pushed[("trt_build_start_timestamp_seconds", ())].unit == "s"
    assert pushed[("trt_build_progress_ratio", ())].unit == "1"
    assert pushed[("trt_build_process_resident_bytes", ())].unit == "By"
    assert pushed[("trt_build_process_resident_bytes", ())].value == MIB
    (duration,) = [p for p in points if p.metric == "trt_build_duration_seconds"]
    assert duration.kind == "histogram" and duration.count == 1 and duration.unit == "s"
    assert duration.attributes == {"backend": "simulator", "outcome": "success"}
    assert duration.exemplar_trace_ids == (monitor.build_id,), "the build's trace"


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_build_pushes_its_metrics_with_no_prometheus_scraping(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    import_rtx()
    model = write_conv(tmp_path / "conv.onnx")
    journal = tmp_path / "conv.jsonl"
    built = subprocess.run(
        [*CLI, "build", str(model), "-o", str(tmp_path / "conv.engine"), "--shapes", CONV_SHAPES,
         "--journal", str(journal), "--no-progress", "--no-gpu", "--otlp-metrics",
         "--otlp-endpoint", f"http://127.0.0.1:{receiver.http_port}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    points = receiver.wait_for_metric_requests(1)
    pushed = last_export(points)
    assert pushed[("trt_build_state", (("state", "success"),))].value == 1
    info = [p for (name, _), p in pushed.items() if name == "trt_build_info"]
    assert info and info[0].attributes["backend"] == "tensorrt-rtx"
    build_id = next(e.build_id for e in read_journal(journal).events if isinstance(e, BuildStarted))
    duration = pushed[
        ("trt_build_duration_seconds", (("backend", "tensorrt-rtx"), ("outcome", "success")))
    ]
    assert duration.count == 1 and duration.exemplar_trace_ids == (build_id,)
    spans = receiver.wait_for(2)
    assert {tuple(sorted(p.resource.items())) for p in points} == {
        tuple(sorted(spans[0].resource.items()))
    }, "the spans' resource"


@pytest.mark.e2e
def test_otlp_metrics_without_an_endpoint_is_a_usage_error() -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [*CLI, "demo", "--no-progress", "--speed", "0", "--otlp-metrics"],
        capture_output=True, text=True, timeout=60, check=False, env=environment,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "trt-otel: error: --otlp-metrics needs an OTLP endpoint: --otlp-endpoint URL or "
        "OTEL_EXPORTER_OTLP_ENDPOINT (and not OTEL_METRICS_EXPORTER=none)"
    )
    assert "Traceback" not in result.stderr and "build started" not in result.stderr


class _UnansweredExporter(MetricExporter):
    """An exporter whose every export waits for the collector's answer until ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        self.answer.wait()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def test_a_final_export_still_waiting_when_the_sdk_gives_up_is_not_exported() -> None:
    """The SDK's shutdown returns at its deadline while its final export still waits for an
    answer on the reader's thread: that export did not arrive, though the shutdown ended."""
    exporter = _UnansweredExporter()
    with hanging_collector() as port:
        settings = OtlpSettings(f"http://127.0.0.1:{port}/v1/metrics", "http/protobuf", 1.0)
        export = OtlpMetricsExport(
            settings,
            metrics_registry(MetricSources(BuildMonitor())),
            interval_s=60,
            exporter=exporter,
        )
        export.begin_shutdown(0.3)
        stopping = export._stopping
        assert stopping is not None
        stopping.join()  # the SDK's shutdown has returned, its export has not
        health = export.shutdown(0.3)
        exporter.answer.set()
    assert health.reason == "no answer within 0.3s", health
    assert health.exported == 0


class _KeptExporter(MetricExporter):
    """Keeps each export's data, as a collector would receive it."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[MetricsData] = []
        self.arrived = threading.Event()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object
    ) -> MetricExportResult:
        self.exports.append(metrics_data)
        self.arrived.set()
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def steps_exported(data: MetricsData) -> list[float]:
    return [
        point.value
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "trt_build_steps_completed"  # OTLP counters without "_total"
        for point in metric.data.data_points
        if isinstance(point, NumberDataPoint)
    ]


def test_a_periodic_export_sends_the_values_of_its_moment() -> None:
    """An export during the build collects the registry again (one collection serves every
    instrument of one export): the steps done since the last one are in it, not the values
    the export began with."""
    monitor = BuildMonitor()
    monitor.start()
    exporter = _KeptExporter()
    settings = OtlpSettings("http://127.0.0.1:9/v1/metrics", "http/protobuf", 1.0)
    export = OtlpMetricsExport(
        settings, metrics_registry(MetricSources(monitor)), interval_s=1.5, exporter=exporter
    )
    try:
        monitor.phase_start("Building engine", None, 3)
        for step in range(3):
            monitor.step_complete("Building engine", step)
        assert exporter.arrived.wait(30), "no periodic export"
        assert steps_exported(exporter.exports[0]) == [3.0]
    finally:
        monitor.end()
        export.shutdown(5.0)
