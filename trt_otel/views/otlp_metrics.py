"""OTLP metric export (``--otlp-metrics``): the build's Prometheus registry, pushed as
OpenTelemetry metrics, for builds no Prometheus can scrape (a short-lived pod, a CI runner).

The series are the very ones ``/metrics`` shows: each metric family of the registry becomes an
asynchronous instrument of the SDK, observed from one registry collection per export cycle, with
the same name and labels (a counter under its family's name, as OTLP-to-Prometheus translation
adds ``_total`` back), and a unit read from the name's suffix (``_seconds`` is ``s``). The
``trt_build_duration_seconds`` and ``trt_build_cancel_latency_seconds`` histograms are each
recorded once, when the build has ended, into a histogram with the same buckets, in the context of
the build's trace, so the duration's OTLP point carries the trace id as its exemplar, as the
OpenMetrics one does.

The SDK's ``PeriodicExportingMetricReader`` pushes every ``interval_s`` on its own thread; at
the end one more collection is flushed, within a deadline. Nothing runs on TensorRT's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.metrics import CallbackOptions, Histogram, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

from trt_otel.core.version import __version__
from trt_otel.views.conventions import SCHEMA_URL
from trt_otel.views.otlp_http import AcceptedOn2xx
from trt_otel.views.otlp_settings import GRPC, OtlpSettings, unreachable_because
from trt_otel.views.prometheus import CANCEL_LATENCY_BUCKETS_S, DURATION_BUCKETS_S
from trt_otel.views.resource import detect_resource

DURATION = "trt_build_duration_seconds"
CANCEL_LATENCY = "trt_build_cancel_latency_seconds"

HISTOGRAMS: dict[str, tuple[tuple[float, ...], str]] = {
    DURATION: (DURATION_BUCKETS_S, "How long builds took"),
    CANCEL_LATENCY: (CANCEL_LATENCY_BUCKETS_S, "How long cancelled builds took to stop"),
}
"""The registry's histograms, each observed once per build, when it ended: their buckets and
description."""

UNITS = (
    ("_seconds", "s"),
    ("_bytes", "By"),
    ("_ratio", "1"),
    ("_hertz", "Hz"),
    ("_watts", "W"),
    ("_celsius", "Cel"),
)
"""Units (UCUM, as OpenTelemetry writes them) from the Prometheus names' suffixes."""

SNAPSHOT_TTL_S = 1.0
"""One registry collection serves every instrument of a cycle: a snapshot younger than this is
reused."""


def unit_of(name: str) -> str:
    for suffix, unit in UNITS:
        if name.endswith(suffix):
            return unit
    return ""


def make_metric_exporter(
    settings: OtlpSettings, session: AcceptedOn2xx | None = None
) -> MetricExporter:
    """The SDK's exporter; over HTTP, one that counts only a 2xx answer as accepted, through
    ``session`` (a new one when None)."""
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter(endpoint=settings.endpoint, timeout=settings.request_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter(
        endpoint=settings.endpoint,
        timeout=settings.request_timeout_s,
        session=AcceptedOn2xx() if session is None else session,
    )


class _CountingExporter(MetricExporter):
    """The OTLP exporter, counting what its exports did (the collector's answer is the only
    evidence that the metrics arrived)."""

    def __init__(self, exporter: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._lock = threading.Lock()
        self.exported = 0
        self.failed = 0
        self.in_flight = 0
        """Exports begun and not yet answered: at the final deadline, one still waiting means
        the final values did not arrive, whether or not the SDK's shutdown has returned."""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        with self._lock:
            self.in_flight += 1
        try:
            result = self._exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        finally:
            with self._lock:
                self.in_flight -= 1
        with self._lock:
            if result is MetricExportResult.SUCCESS:
                self.exported += 1
            else:
                self.failed += 1
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


@dataclass(frozen=True, slots=True)
class MetricExportHealth:
    exported: int
    """Exports the collector accepted."""
    failed: int
    reason: str | None = None
    """Why the final export did not happen, when it did not."""
    refusal: str | None = None
    """What the collector answered to an export it did not accept, when it said."""


class OtlpMetricsExport:
    """Pushes ``registry``'s series over OTLP: every ``interval_s``, and once more at
    :meth:`shutdown`."""

    def __init__(
        self,
        settings: OtlpSettings,
        registry: CollectorRegistry,
        *,
        interval_s: float,
        resource: Resource | None = None,
        exporter: MetricExporter | None = None,
    ) -> None:
        self.settings = settings
        self._registry = registry
        self._session = settings.http_session() if exporter is None else None
        self._exporter = _CountingExporter(
            exporter or make_metric_exporter(settings, self._session)
        )
        self._reader = PeriodicExportingMetricReader(
            self._exporter, export_interval_millis=interval_s * 1000
        )
        self._provider = MeterProvider(
            resource=resource or detect_resource(),
            metric_readers=[self._reader],
            views=[
                View(
                    instrument_name=name,
                    aggregation=ExplicitBucketHistogramAggregation([float(b) for b in buckets]),
                )
                for name, (buckets, _) in HISTOGRAMS.items()
            ],
            shutdown_on_exit=False,
        )
        self._meter = self._provider.get_meter("trt_otel", __version__, SCHEMA_URL)
        self._lock = threading.Lock()
        self._instruments: set[str] = set()
        self._snapshot: dict[str, list[Observation]] = {}
        self._snapshot_at = float("-inf")
        self._histograms: dict[str, Histogram] = {}
        self._recorded: set[str] = set()
        self._stopping: threading.Thread | None = None
        self._stop_by = 0.0
        self._reason: str | None = None
        self.refresh()

    def refresh(self) -> None:
        """Collect the registry now: an instrument for each family seen for the first time
        (observed from the next export on), and the build's duration once it has ended."""
        families = self._collect()
        for name, (kind, help_text) in families.items():
            if name in self._instruments:
                continue
            self._instruments.add(name)
            create: Callable[..., Any] = (
                self._meter.create_observable_counter
                if kind == "counter"
                else self._meter.create_observable_gauge
            )
            create(
                name, callbacks=[self._observer(name)], unit=unit_of(name), description=help_text
            )

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                stale = time.monotonic() - self._snapshot_at > SNAPSHOT_TTL_S
            if stale:
                self._collect()
            with self._lock:
                return list(self._snapshot.get(name, ()))

        return observe

    # Long: one pass over the registry's families, each kind of Prometheus sample in its place.
    def _collect(self) -> dict[str, tuple[str, str]]:
        """One collection of the registry: the observations of each instrument, kept as the
        cycle's snapshot; the families by instrument name, with their kind and help."""
        observations: dict[str, list[Observation]] = {}
        families: dict[str, tuple[str, str]] = {}
        for family in self._registry.collect():
            if family.type == "histogram":
                if family.name in HISTOGRAMS:
                    self._record_once(family.name, family.samples)
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # the counter's creation time: no series of OTLP's
                if family.type == "counter":
                    name, kind = family.name, "counter"
                else:  # gauge, info, stateset: a gauge per sample name
                    name, kind = sample.name, "gauge"
                families.setdefault(name, (kind, family.documentation))
                observations.setdefault(name, []).append(
                    Observation(sample.value, dict(sample.labels))
                )
        with self._lock:
            self._snapshot = observations
            self._snapshot_at = time.monotonic()
        return families

    def _record_once(self, name: str, samples: list[Sample]) -> None:
        """The ended build's observation of histogram ``name``, recorded once, in its trace's
        context where it has one (the exemplar)."""
        total = next((s for s in samples if s.name == f"{name}_sum"), None)
        exemplar = next((s.exemplar for s in samples if s.exemplar is not None), None)
        if total is None:
            return
        labels = {k: v for k, v in total.labels.items() if k != "le"}
        key = f"{name}/{sorted(labels.items())}/{exemplar.labels if exemplar else ''}"
        with self._lock:
            if key in self._recorded:
                return
            self._recorded.add(key)
            if name not in self._histograms:
                self._histograms[name] = self._meter.create_histogram(
                    name, unit=unit_of(name), description=HISTOGRAMS[name][1]
                )
            histogram = self._histograms[name]
        context = None
        if exemplar is not None:
            trace_id = int(exemplar.labels["trace_id"], 16)
            span = SpanContext(trace_id, 1, False, TraceFlags(TraceFlags.SAMPLED))
            context = set_span_in_context(NonRecordingSpan(span))
        histogram.record(total.value, labels, context=context)

    def begin_shutdown(self, timeout_s: float) -> None:
        """Start the final export (what the build ended with) and the SDK's shutdown on a
        daemon thread of their own, to end within ``timeout_s``, so that other exports flush
        meanwhile. A collector that cannot be connected to is not waited for. Only the first
        call counts."""
        if self._stopping is not None:
            return

        def stop() -> None:
            if timeout_s <= 0:
                self._reason = "not attempted"
            else:
                self._reason = unreachable_because(self.settings.endpoint, min(1.0, timeout_s))
            if self._reason is None:
                self.refresh()  # families that appeared since the last export: the end's
            else:
                self._exporter.shutdown()  # nothing would arrive: no export is waited for
            # The periodic reader's shutdown collects and exports once more: the final values.
            self._provider.shutdown(max(1, int(timeout_s * 1000)))

        self._stop_by = time.monotonic() + max(timeout_s, 0.0)
        self._stopping = threading.Thread(target=stop, name="trt-otel-metrics-stop", daemon=True)
        self._stopping.start()

    def shutdown(self, timeout_s: float) -> MetricExportHealth:
        """The final export within ``timeout_s`` (from :meth:`begin_shutdown`, if it was
        called), then stop. An exporter stuck in a request is left behind on its daemon
        thread."""
        self.begin_shutdown(timeout_s)
        assert self._stopping is not None
        self._stopping.join(max(self._stop_by - time.monotonic(), 0.05))
        reason = self._reason
        # The SDK's shutdown returns at its deadline with its final export still waiting on
        # its own thread, so the thread having ended says nothing of the export: ask it.
        waiting = self._stopping.is_alive() or self._exporter.in_flight > 0
        if waiting and reason is None:
            reason = f"no answer within {timeout_s:g}s"
        refusal = self._session.refusal if self._session is not None else None
        return MetricExportHealth(self._exporter.exported, self._exporter.failed, reason, refusal)
