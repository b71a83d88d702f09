"""``trt_build_cancel_latency_seconds``: how long a cancelled build took to stop, from the
request to its end, one observation by backend and by who asked; none for a build that was not
cancelled. In the Prometheus exposition (lint-clean under ``promtool``) and over OTLP to a real
receiver, with the same buckets."""

from __future__ import annotations

import shutil

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otlp_receiver import OtlpReceiver
from prometheus_server import promtool_lint
from trt_otel import BuildMonitor
from trt_otel.core.clock import ManualClock
from trt_otel.views.otlp_metrics import OtlpMetricsExport
from trt_otel.views.otlp_settings import GRPC, METRICS, OtlpSettings
from trt_otel.views.prometheus import CANCEL_LATENCY_BUCKETS_S, MetricSources, metrics_registry

LATENCY = "trt_build_cancel_latency_seconds"


def build(*, cancel_at_s: float | None, stopped_after_s: float = 2.2) -> BuildMonitor:
    """A build whose cancel, if any, comes ``cancel_at_s`` in and is honoured
    ``stopped_after_s`` later, at TensorRT's next step."""
    clock = ManualClock()
    monitor = BuildMonitor(attributes={"trt.backend": "tensorrt-rtx"}, clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 10)
    clock.advance(7.0)  # the build's own time before the cancel: not the latency
    monitor.step_complete("Building engine", 0)
    if cancel_at_s is not None:
        clock.advance(cancel_at_s - 7.0)
        monitor.cancel("received SIGTERM", source="signal")
        clock.advance(stopped_after_s)
        monitor.step_complete("Building engine", 1)  # answered False
    monitor.phase_finish("Building engine")
    monitor.end()
    return monitor


def exposition(monitor: BuildMonitor) -> str:
    return generate_latest(metrics_registry(MetricSources(monitor))).decode()


def families(monitor: BuildMonitor) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(exposition(monitor))}


def test_a_cancelled_build_observes_the_time_from_its_cancel_to_its_end() -> None:
    found = families(build(cancel_at_s=9.0, stopped_after_s=2.2))
    family = found[LATENCY]
    assert family.type == "histogram"  # type: ignore[attr-defined]
    samples = family.samples  # type: ignore[attr-defined]
    total = next(s for s in samples if s.name == f"{LATENCY}_sum")
    assert total.value == pytest.approx(2.2)  # from the cancel to the end: not the 9 s before
    assert total.labels == {"backend": "tensorrt-rtx", "reason": "signal"}
    buckets = {s.labels["le"]: s.value for s in samples if s.name == f"{LATENCY}_bucket"}
    assert list(buckets) == [repr(float(b)) for b in CANCEL_LATENCY_BUCKETS_S] + ["+Inf"]
    assert buckets["1.0"] == 0 and buckets["2.5"] == 1 and buckets["+Inf"] == 1
    count = next(s for s in samples if s.name == f"{LATENCY}_count")
    assert count.value == 1


def test_a_build_that_was_not_cancelled_has_no_latency() -> None:
    assert LATENCY not in families(build(cancel_at_s=None))
    running = BuildMonitor()
    running.start()
    running.cancel("received SIGTERM", source="signal")
    assert LATENCY not in families(running), "not until the build has stopped"


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_the_latency_is_lint_clean() -> None:
    assert promtool_lint(exposition(build(cancel_at_s=9.0))) == ""


@pytest.mark.e2e
def test_the_latency_is_pushed_over_otlp_with_its_buckets(receiver: OtlpReceiver) -> None:
    settings = OtlpSettings.resolve(
        f"http://127.0.0.1:{receiver.grpc_port}", GRPC, environ={}, signal=METRICS
    )
    assert settings is not None
    monitor = build(cancel_at_s=9.0, stopped_after_s=0.4)
    export = OtlpMetricsExport(
        settings, metrics_registry(MetricSources(monitor)), interval_s=3600.0
    )
    health = export.shutdown(10.0)
    assert (health.exported, health.failed, health.reason) == (1, 0, None)
    points = [p for p in receiver.wait_for_metric_requests(1) if p.metric == LATENCY]
    assert len(points) == 1, points
    (latency,) = points
    assert (latency.kind, latency.count, latency.unit) == ("histogram", 1, "s")
    assert latency.value == pytest.approx(0.4)
    assert latency.attributes == {"backend": "tensorrt-rtx", "reason": "signal"}
    assert latency.bounds == tuple(float(b) for b in CANCEL_LATENCY_BUCKETS_S)
