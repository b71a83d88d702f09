"""The Prometheus projection: a collector that reads the build's state at scrape time.

Nothing happens per step: a scrape takes the log's lock just long enough to copy a few numbers
per phase name (TensorRT has about a dozen), then builds the metric families outside it. Labels
stay bounded: phase names are reused, so the gauges describe the latest instance of each name,
and no build id is a label (it is in ``trt_build_info`` only when asked for). Label sets known in
advance (cancellations by reason, anomalies by kind, states) are all present from the first
scrape, at 0, so a dashboard shows 0 rather than "No data".

One registry is built per build from a typed :class:`MetricSources`; the scrape endpoint, the
HTTP view's ``/metrics`` and the Pushgateway all read it, so they show the same series.
"""

from __future__ import annotations

import gzip
import math
import socket
import socketserver
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, make_wsgi_app, push_to_gateway
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from trt_otel.control.policies import PolicyHealth
from trt_otel.core.activity import Verdict
from trt_otel.core.events import AnomalyKind, CancelSource, GpuSample, ProcessSample
from trt_otel.core.followers import FollowerHealth
from trt_otel.core.observed import ObservedBuild
from trt_otel.core.state import BuildState
from trt_otel.views.otlp_settings import SpanExportHealth
from trt_otel.views.trace_ids import build_trace_id

SpanHealthSource = Callable[[], SpanExportHealth]
PolicyHealthSource = Callable[[], Sequence[PolicyHealth]]
EtaSource = Callable[[], float | None]
"""Seconds left in the build, or None when unknown."""

BUILD_STATES = ("pending", "running", "cancelling", "success", "failure", "cancellation", "timeout")
"""Values of ``trt_build_state{state}``: one is 1, the others 0."""

CANCEL_REASONS = tuple(source.value for source in CancelSource)
"""Values of ``trt_build_cancellations_total{reason}`` (the cancel's ``source``): every
:class:`~trt_otel.core.events.CancelSource`, each present from the start at 0; a source outside
them (a program's own) gets its series when it happens."""

_INFO_ATTRIBUTES = {
    "trt.backend": "backend",
    "trt.version": "trt_version",
    "model.sha256": "model_sha256",
}


@dataclass(frozen=True, slots=True)
class PhaseSample:
    name: str
    num_steps: int
    steps_completed: int
    is_open: bool


@dataclass(frozen=True, slots=True)
class BuildSample:
    """What one scrape reports, copied under the log's lock."""

    state: str
    progress_ratio: float
    start_s: float | None
    end_s: float | None
    last_progress_s: float | None
    steps_total: int
    phases_started_total: int
    phases: tuple[PhaseSample, ...]
    cancel_reason: str | None
    anomalies: Mapping[str, int]
    events_total: int
    callbacks_total: int
    callback_s_total: float
    internal_errors: int
    fold_errors: int
    followers: tuple[FollowerHealth, ...]
    info: Mapping[str, str]
    spans: SpanExportHealth | None = None
    policies: tuple[PolicyHealth, ...] = ()
    eta_s: float | None = None
    gpu: GpuSample | None = None
    builder: ProcessSample | None = None
    builder_peak_rss_bytes: int | None = None
    liveness: str | None = None
    duration_s: float | None = None
    """How long the build took, once it ended."""
    cancel_latency_s: float | None = None
    """From the cancel's request to the build's end (its journal's ``build_end``, written once
    the builder's process has stopped), once a cancelled build ended."""
    backend: str = ""
    trace_id: str | None = None
    """The build's trace id (32 hex digits), for the duration's exemplar."""
    store_hit: bool | None = None
    """Whether the engine store served the build (None: no store)."""
    store_saved_s: float = 0.0
    """What serving it saved: the median of the builds that made the engine."""


@dataclass(frozen=True, slots=True)
class MetricSources:
    """What the build's metrics are read from at scrape time: the monitor, and the health of
    the parts that report one (absent parts have no series)."""

    monitor: ObservedBuild
    build_id_label: bool = False
    """Add the build id to ``trt_build_info`` (one series per build)."""
    span_health: SpanHealthSource | None = None
    policy_health: PolicyHealthSource | None = None
    eta: EtaSource | None = None


def metrics_registry(sources: MetricSources) -> CollectorRegistry:
    """The build's one registry: what a scrape, the HTTP view's ``/metrics`` and a push read.

    ``auto_describe`` stays off: it would collect (a scrape's worth of work) at registration.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BuildCollector(sources))
    _SOURCES_OF[registry] = sources  # for the push's grouping key
    return registry


_SOURCES_OF: weakref.WeakKeyDictionary[CollectorRegistry, MetricSources] = (
    weakref.WeakKeyDictionary()
)


def sample_build(sources: MetricSources) -> BuildSample:
    """A consistent snapshot of the monitor's state for one scrape."""
    monitor, build_id_label = sources.monitor, sources.build_id_label
    span_health, policy_health, eta = sources.span_health, sources.policy_health, sources.eta
    with monitor.log.transaction():
        state = monitor.state
        outcome = state.outcome
        build_state = outcome.value if outcome is not None else state.status.value
        phases = tuple(
            PhaseSample(p.name, p.num_steps, p.steps_completed, p.is_open)
            for p in (state.phases[i] for i in state.latest_by_name.values())
        )
        sample_values: dict[str, Any] = {
            "state": build_state,
            "progress_ratio": state.progress_ratio(),
            "start_s": _seconds(state.start_wall_ns),
            "end_s": _seconds(state.end_wall_ns),
            "last_progress_s": _seconds(state.last_progress_wall_ns),
            "steps_total": state.steps_completed_total,
            "phases_started_total": state.phases_started_total,
            "cancel_reason": state.cancel.source if state.cancel is not None else None,
            "anomalies": {kind.value: n for kind, n in state.anomalies.items()},
            "events_total": monitor.log.next_seq,
            "callbacks_total": monitor.callbacks_total,
            "callback_s_total": monitor.callback_ns_total / 1e9,
            "internal_errors": monitor.internal_errors,
            "fold_errors": monitor.log.fold_errors,
        }
        attributes = dict(state.attributes)
        sample_values.update(_duration(state, attributes))
        gpu = state.gpu
        activity = state.activity
        builder, peak_rss = activity.last_sample, activity.peak_rss_bytes
        liveness = activity.verdict.value if activity.verdict is not None else None
    info = {
        label: str(attributes[key]) for key, label in _INFO_ATTRIBUTES.items() if key in attributes
    }
    if "model.path" in attributes:
        info["model"] = str(attributes["model.path"]).rsplit("/", 1)[-1]
    if build_id_label and monitor.build_id:
        info["build_id"] = monitor.build_id
    followers = tuple(worker.health() for worker in monitor.log.workers)
    if monitor.model is not None:  # the log's own fold: a follower with no queue
        followers += (monitor.model.health(),)
    spans = span_health() if span_health is not None else None
    policies = tuple(policy_health()) if policy_health is not None else ()
    return BuildSample(
        backend=str(attributes.get("trt.backend", "")),
        **_store(attributes),
        phases=phases,
        followers=followers,
        info=info,
        spans=spans,
        policies=policies,
        eta_s=eta() if eta is not None else None,
        gpu=gpu,
        builder=builder,
        builder_peak_rss_bytes=peak_rss,
        liveness=liveness,
        **sample_values,
    )


def _store(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the engine store served the build, and what that saved, from its record."""
    hit = attributes.get("trt.store.hit")
    if not isinstance(hit, bool):
        return {}
    saved = attributes.get("trt.store.saved_s") if hit else None
    if not isinstance(saved, int | float) or isinstance(saved, bool) or saved < 0:
        saved = 0.0
    return {"store_hit": hit, "store_saved_s": float(saved)}


def _store_metrics(sample: BuildSample) -> Iterator[Metric]:
    """The engine store's part: a build served (a hit) or built (a miss), and what a hit saved."""
    yield CounterMetricFamily(
        "trt_engine_store_hits",
        "Builds the engine store served instead of building",
        1 if sample.store_hit else 0,
    )
    yield CounterMetricFamily(
        "trt_engine_store_misses",
        "Builds the engine store could not serve, so built (and stored, if they succeeded)",
        0 if sample.store_hit else 1,
    )
    yield CounterMetricFamily(
        "trt_engine_store_saved_seconds",
        "Build time the engine store saved: for each served build, its earlier builds' median",
        sample.store_saved_s,
    )


def _duration(state: BuildState, attributes: dict[str, Any]) -> dict[str, Any]:
    """How long the build took, and its trace id, once it ended."""
    if state.outcome is None or state.end_mono_ns is None or state.start_mono_ns is None:
        return {}
    trace_id, _ = build_trace_id(attributes, state.build_id or "")
    ended: dict[str, Any] = {
        "duration_s": (state.end_mono_ns - state.start_mono_ns) / 1e9,
        "trace_id": f"{trace_id:032x}",
    }
    if state.cancel is not None:
        ended["cancel_latency_s"] = max(0, state.end_mono_ns - state.cancel.mono_ns) / 1e9
    return ended


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e9


class BuildCollector(Collector):
    """The contract's ``trt_build_*`` metrics and the monitor's own ``trt_otel_*`` health."""

    def __init__(self, sources: MetricSources) -> None:
        self.sources = sources

    def collect(self) -> Iterable[Metric]:
        return list(build_metrics(sample_build(self.sources)))


# Long: one metric family after another, in the order of the exposition.
def build_metrics(sample: BuildSample) -> Iterable[Metric]:
    steps = GaugeMetricFamily(
        "trt_build_phase_steps",
        "num_steps of the latest instance of each TensorRT phase",
        labels=["phase"],
    )
    completed = GaugeMetricFamily(
        "trt_build_phase_steps_completed",
        "Steps completed in the latest instance of each TensorRT phase",
        labels=["phase"],
    )
    open_phase = GaugeMetricFamily(
        "trt_build_phase_open", "1 while the latest instance of the phase is open", labels=["phase"]
    )
    for phase in sample.phases:
        steps.add_metric([phase.name], phase.num_steps)
        completed.add_metric([phase.name], phase.steps_completed)
        open_phase.add_metric([phase.name], 1 if phase.is_open else 0)
    yield steps
    yield completed
    yield open_phase
    yield CounterMetricFamily(
        "trt_build_steps_completed", "Every step TensorRT reported in the build", sample.steps_total
    )
    yield CounterMetricFamily(
        "trt_build_phases_started", "Phase instances TensorRT started", sample.phases_started_total
    )
    yield GaugeMetricFamily(
        "trt_build_progress_ratio", "Overall build progress from 0 to 1", sample.progress_ratio
    )
    if sample.gpu is not None:
        yield from _gpu_metrics(sample.gpu)
    if sample.builder is not None:
        yield from _builder_metrics(sample)
    if sample.eta_s is not None:  # no sample while the estimate is unknown
        yield GaugeMetricFamily(
            "trt_build_eta_seconds",
            "Estimated seconds left in the build (from earlier builds, else from progress)",
            sample.eta_s,
        )
    for name, help_text, value in (
        ("trt_build_start_timestamp_seconds", "When the build started (Unix time)", sample.start_s),
        ("trt_build_end_timestamp_seconds", "When the build ended (Unix time)", sample.end_s),
        (
            "trt_build_last_progress_timestamp_seconds",
            "When TensorRT last reported progress (Unix time)",
            sample.last_progress_s,
        ),
    ):
        if value is not None:
            yield GaugeMetricFamily(name, help_text, value)
    state = GaugeMetricFamily(
        "trt_build_state", "1 for the build's current state", labels=["state"]
    )
    for name in BUILD_STATES:
        state.add_metric([name], 1 if name == sample.state else 0)
    yield state
    cancellations = CounterMetricFamily(
        "trt_build_cancellations", "Cancels requested, by who requested them", labels=["reason"]
    )
    reasons = dict.fromkeys(CANCEL_REASONS, 0)
    if sample.cancel_reason is not None:
        reasons[sample.cancel_reason] = 1
    for reason, count in reasons.items():
        cancellations.add_metric([reason], count)
    yield cancellations
    if sample.duration_s is not None:
        yield duration_histogram(sample)
    if sample.cancel_latency_s is not None:
        yield cancel_latency_histogram(sample)
    if sample.store_hit is not None:
        yield from _store_metrics(sample)
    if sample.info:
        yield InfoMetricFamily(
            "trt_build", "What was built, and with what", value=dict(sample.info)
        )
    yield from health_metrics(sample)


# Long: one metric family after another, in the order of the exposition.
def health_metrics(sample: BuildSample) -> Iterable[Metric]:
    anomalies = CounterMetricFamily(
        "trt_otel_anomalies", "TensorRT protocol departures tolerated, by kind", labels=["kind"]
    )
    counts = {kind.value: 0 for kind in AnomalyKind} | dict(sample.anomalies)
    for kind, count in sorted(counts.items()):
        anomalies.add_metric([kind], count)
    yield anomalies
    yield CounterMetricFamily("trt_otel_events", "Events in the build's log", sample.events_total)
    yield CounterMetricFamily(
        "trt_otel_callbacks", "TensorRT callbacks handled by the monitor", sample.callbacks_total
    )
    yield CounterMetricFamily(
        "trt_otel_callback_seconds",
        "Time spent inside the monitor's callbacks",
        sample.callback_s_total,
    )
    yield CounterMetricFamily(
        "trt_otel_monitor_errors",
        "Failures inside the monitor's callbacks (answered anyway)",
        sample.internal_errors,
    )
    yield CounterMetricFamily(
        "trt_otel_fold_errors",
        "Events a fold of the log (the build's state, the read model) failed on (skipped)",
        sample.fold_errors,
    )
    dropped = CounterMetricFamily(
        "trt_otel_follower_dropped_events",
        "Events a follower lost because its queue was full",
        labels=["follower"],
    )
    errors = CounterMetricFamily(
        "trt_otel_follower_errors", "Failures of a follower", labels=["follower"]
    )
    queued = GaugeMetricFamily(
        "trt_otel_follower_queued_events", "Events waiting for a follower", labels=["follower"]
    )
    failed = CounterMetricFamily(
        "trt_otel_follower_failed_events",
        "Events in batches a follower failed to handle (a journal on a full disk)",
        labels=["follower"],
    )
    for health in sample.followers:
        failed.add_metric([health.name], health.failed_events)
        dropped.add_metric([health.name], health.dropped)
        errors.add_metric([health.name], health.errors)
        queued.add_metric([health.name], health.queued)
    yield dropped
    yield failed
    yield errors
    yield queued
    if sample.spans is not None:
        yield from _span_export_metrics(sample.spans)
    if sample.policies:
        policy_errors = CounterMetricFamily(
            "trt_otel_policy_errors",
            "Errors met by a cancel policy (an unreachable cancel URL), by kind of policy",
            labels=["policy"],
        )
        stuck = GaugeMetricFamily(
            "trt_otel_policy_stuck_seconds",
            "How long a cancel policy's check under way has gone without an answer, once past "
            "its limit (a cancel file on a hung mount); 0 when none is stuck",
            labels=["policy"],
        )
        for policy in sample.policies:
            policy_errors.add_metric([policy.source], policy.errors)
            stuck.add_metric([policy.source], policy.stuck_s or 0.0)
        yield policy_errors
        yield stuck


DURATION_BUCKETS_S = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800)
"""``trt_build_duration_seconds``'s buckets: engine builds take seconds to hours."""


def duration_histogram(sample: BuildSample) -> Metric:
    """``trt_build_duration_seconds{backend,outcome}``: the build, once it ended, as one
    observation, with the build's trace id as the exemplar of its bucket (OpenMetrics only),
    so a dashboard's slow build opens its trace."""
    assert sample.duration_s is not None
    duration = sample.duration_s
    histogram = HistogramMetricFamily(
        "trt_build_duration_seconds",
        "How long builds took, by builder library and outcome",
        labels=["backend", "outcome"],
    )
    exemplar = None
    if sample.trace_id is not None:
        exemplar = Exemplar({"trace_id": sample.trace_id}, duration, sample.end_s)
    buckets: list[Any] = []
    placed = False
    for bound in (*DURATION_BUCKETS_S, float("inf")):
        inside = duration <= bound
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        bucket: tuple[Any, ...] = (le, 1.0 if inside else 0.0)
        if inside and not placed:
            placed = True
            if exemplar is not None:
                bucket = (*bucket, exemplar)
        buckets.append(bucket)
    histogram.add_metric([sample.backend, sample.state], buckets=buckets, sum_value=duration)
    return histogram


CANCEL_LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 8, 10, 15, 30, 60, 120, 300)
"""``trt_build_cancel_latency_seconds``'s buckets: a step away is well under a second, a silent
window ends at the grace period (30 s by default); 8 s is the stop a CI runner allows between
its SIGINT and its SIGTERM."""


def cancel_latency_histogram(sample: BuildSample) -> Metric:
    """``trt_build_cancel_latency_seconds{backend,reason}``: how long a cancelled build took to
    stop, from the request to its end, as one observation, by who asked (``reason``, as
    ``trt_build_cancellations_total``'s)."""
    assert sample.cancel_latency_s is not None and sample.cancel_reason is not None
    latency = sample.cancel_latency_s
    histogram = HistogramMetricFamily(
        "trt_build_cancel_latency_seconds",
        "How long cancelled builds took to stop, from the request to the build's end",
        labels=["backend", "reason"],
    )
    buckets = [
        ("+Inf" if bound == float("inf") else repr(float(bound)), 1.0 if latency <= bound else 0.0)
        for bound in (*CANCEL_LATENCY_BUCKETS_S, float("inf"))
    ]
    histogram.add_metric([sample.backend, sample.cancel_reason], buckets=buckets, sum_value=latency)
    return histogram


_GPU_GAUGES = (
    ("memory_used_bytes", "trt_build_gpu_memory_used_bytes", "GPU memory in use"),
    ("memory_total_bytes", "trt_build_gpu_memory_total_bytes", "GPU memory in all"),
    ("utilization", "trt_build_gpu_utilization_ratio", "Fraction of time a kernel ran"),
    (
        "memory_utilization",
        "trt_build_gpu_memory_utilization_ratio",
        "Fraction of time device memory was read or written",
    ),
    ("sm_clock_hz", "trt_build_gpu_sm_clock_hertz", "Streaming multiprocessor clock"),
    ("memory_clock_hz", "trt_build_gpu_memory_clock_hertz", "Memory clock"),
    ("power_w", "trt_build_gpu_power_watts", "Power drawn by the GPU"),
    ("temperature_c", "trt_build_gpu_temperature_celsius", "GPU temperature"),
    (
        "process_memory_used_bytes",
        "trt_build_process_gpu_memory_bytes",
        "GPU memory the builder's process holds",
    ),
)


def _gpu_metrics(sample: GpuSample) -> Iterable[Metric]:
    """The latest GPU sample (labelled by NVML index); a value the GPU does not report is left
    out rather than shown as 0."""
    for field_name, metric, help_text in _GPU_GAUGES:
        value = getattr(sample, field_name)
        if value is not None:
            gauge = GaugeMetricFamily(metric, f"{help_text} (latest sample)", labels=["gpu"])
            gauge.add_metric([str(sample.index)], float(value))
            yield gauge


def _builder_metrics(sample: BuildSample) -> Iterable[Metric]:
    """The builder's process (latest sample) and the liveness verdict drawn from it."""
    process = sample.builder
    assert process is not None
    if process.cpu_seconds is not None:
        yield CounterMetricFamily(
            "trt_build_process_cpu_seconds",
            "CPU time (user and system) the builder's process has used",
            process.cpu_seconds,
        )
    for metric, help_text, value in (
        (
            "trt_build_process_resident_bytes",
            "Resident memory of the builder's process (latest sample)",
            process.rss_bytes,
        ),
        (
            "trt_build_process_peak_resident_bytes",
            "Peak resident memory of the builder's process over the build's samples",
            sample.builder_peak_rss_bytes,
        ),
        (
            "trt_build_host_available_bytes",
            "Memory available on the builder's host (latest sample)",
            process.available_bytes,
        ),
    ):
        if value is not None:
            yield GaugeMetricFamily(metric, help_text, value)
    liveness = GaugeMetricFamily(
        "trt_build_liveness",
        "1 for the builder's liveness verdict: working, idle, stopped or gone",
        labels=["state"],
    )
    for verdict in Verdict:
        liveness.add_metric([verdict.value], 1 if verdict.value == sample.liveness else 0)
    yield liveness


def _span_export_metrics(health: SpanExportHealth) -> Iterable[Metric]:
    yield CounterMetricFamily(
        "trt_otel_spans_exported", "Spans the OTLP collector accepted", health.exported
    )
    yield CounterMetricFamily(
        "trt_otel_spans_failed", "Spans in exports the OTLP collector did not accept", health.failed
    )
    yield CounterMetricFamily(
        "trt_otel_spans_dropped",
        "Spans lost because the export queue was full or the final flush ran out of time",
        health.dropped,
    )
    yield GaugeMetricFamily("trt_otel_spans_queued", "Spans waiting to be exported", health.queued)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not news: no line per request on the build's terminal."""


class MetricsServer:
    """Serves ``registry`` on ``address:port`` (loopback by default) with prometheus_client's
    own WSGI app: its content negotiation (text or OpenMetrics) and gzip when asked for.

    It counts the scrapes it answers, so the end of a build waits for a last one only when
    something is scraping (registering, pushing or the HTTP view's ``/metrics`` is not a scrape
    here).
    """

    def __init__(self, registry: CollectorRegistry, port: int, address: str = "127.0.0.1") -> None:
        self.registry = registry
        self.scrapes = 0
        self._last_scrape_began: float | None = None
        self._scraped = threading.Condition()
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsWSGIServer", (_ThreadingServer,), {"address_family": family})
        # Binding happens here, so a port in use is a configuration error before the build.
        self._server: WSGIServer = make_server(
            address, port, self._counting(make_wsgi_app(registry)), server_class, _QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            # How long close() waits for the loop to see its shutdown (socketserver's 0.5 s
            # by default, paid at the end of every build that serves this view).
            kwargs={"poll_interval": 0.05},
            name="trt-otel-metrics",
            daemon=True,
        )
        self._thread.start()
        self.address = address
        self.port = int(self._server.server_port)

    def _counting(self, app: WSGIApplication) -> WSGIApplication:
        def counted(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            began = time.monotonic()
            statuses: list[str] = []

            def starting(status: str, *args: Any) -> Any:
                statuses.append(status)
                return start_response(status, *args)

            body = app(environ, starting)
            scrape = bool(statuses) and statuses[0].startswith("200")
            if scrape and environ.get("PATH_INFO") != "/favicon.ico":
                with self._scraped:
                    self.scrapes += 1
                return self._delivered(body, began, environ)
            return body

        return counted

    def _delivered(
        self, body: Iterable[bytes], began: float, environ: WSGIEnvironment
    ) -> Iterator[bytes]:
        """``body``, and once all of it is sent, the scrape is one that may be the final one.
        The server writes each chunk before it asks for the next, so what follows the loop runs
        once the answer is in the socket: a scrape counted before its answer was written was
        cut off by the build's exit (the handler's thread is a daemon) while the build said its
        final values had been scraped."""
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        if _in_time(time.monotonic() - began, environ):
            with self._scraped:
                self._last_scrape_began = max(began, self._last_scrape_began or began)
                self._scraped.notify_all()

    def wait_for_scrape_after(self, mono_s: float, timeout_s: float) -> bool:
        """Wait until a scrape that began after ``mono_s`` (time.monotonic) was answered in
        time for its scraper to keep it; False on timeout. A scrape that began earlier may
        have read older values."""
        with self._scraped:
            return self._scraped.wait_for(
                lambda: self._last_scrape_began is not None and self._last_scrape_began > mono_s,
                timeout_s,
            )

    def linger(self, timeout_s: float) -> bool:
        """After the build, wait (at most ``timeout_s``) for one more scrape so the final
        values reach Prometheus; only when something has scraped at all."""
        if self.scrapes == 0 or timeout_s <= 0:
            return False
        return self.wait_for_scrape_after(time.monotonic(), timeout_s)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


SCRAPE_TIME_KEPT = 0.9
"""The share of Prometheus's scrape timeout an answer may take here and still count as the
final scrape: a scrape Prometheus gave up on is a sample it never stored, and its clock starts
before ours (its connect, our queue), so an answer that took nearly all of it here is late."""


def _in_time(took_s: float, environ: WSGIEnvironment) -> bool:
    """Whether an answer that took ``took_s`` here reached Prometheus within its scrape's
    timeout (its ``X-Prometheus-Scrape-Timeout-Seconds``; a scraper that sends none is
    believed)."""
    said = environ.get("HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS")
    try:
        timeout_s = float(said) if said is not None else math.inf
    except ValueError:
        return True
    return not timeout_s > 0 or took_s <= timeout_s * SCRAPE_TIME_KEPT


def exposition(
    registry: CollectorRegistry, accept: str | None, accept_encoding: str | None
) -> tuple[str, bytes, dict[str, str]]:
    """``/metrics`` as prometheus_client's own server answers it, for a server of ours (the HTTP
    view): the format ``Accept`` asks for (text, or OpenMetrics), gzipped when accepted.
    Returns the content type, the body and any other headers."""
    encoder, content_type = choose_encoder(accept or "")
    body = encoder(registry)
    if "gzip" in (accept_encoding or ""):
        return content_type, gzip.compress(body), {"Content-Encoding": "gzip"}
    return content_type, body, {}


PUSH_TIMEOUT_S = 5.0
"""What a push gets in all: connect, the request, the Pushgateway's head and body."""
MAX_PUSH_ANSWER = 64 * 1024
"""The most of a Pushgateway's answer read (it answers a push with an empty body)."""


def push_build_metrics(
    registry: CollectorRegistry,
    gateway: str,
    *,
    job: str = "trt_otel",
    build_id: str | None = None,
    timeout_s: float = PUSH_TIMEOUT_S,
) -> None:
    """Push the build's metrics (the registry a scrape reads) to a Pushgateway once, for builds
    shorter than a scrape interval, grouped by the build's id (``build_id``, read from the
    registry's build when not given): a push replaces its group, so builds pushing at the same
    time each keep their own group instead of overwriting one another.

    The push has ``timeout_s`` in all, however slowly the Pushgateway (or a proxy) answers
    (prometheus_client's own handler bounds each read, not the push). Raises OSError when it
    cannot be reached, does not answer in time, or answers anything but a 2xx (a redirect is
    not followed: nothing says where a push may go)."""
    if build_id is None:
        build_id = _build_id_of(registry)
    grouping_key = {"build_id": build_id} if build_id else None
    push_to_gateway(
        gateway,
        job=job,
        registry=registry,
        grouping_key=grouping_key,
        timeout=timeout_s,
        handler=_bounded_push,
    )


def _bounded_push(
    url: str, method: str, timeout: float | None, headers: list[tuple[str, str]], data: bytes
) -> Callable[[], None]:
    """prometheus_client's push handler, with one deadline for the whole push
    (:mod:`~trt_otel.core.outbound`); the environment's proxies apply, as they do to its own."""

    def push() -> None:
        import http.client
        import urllib.request

        from trt_otel.core import outbound
        from trt_otel.core.deadlines import Deadline

        request = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
        with Deadline(PUSH_TIMEOUT_S if timeout is None else timeout) as deadline:
            try:
                answer = outbound.call(request, deadline, max_bytes=MAX_PUSH_ANSWER)
            except http.client.HTTPException as error:  # no HTTP answer: as unreachable
                raise OSError(f"not an HTTP answer ({type(error).__name__})") from None
        redirect = answer.redirect()
        if redirect is not None:
            raise OSError(
                f"the Pushgateway answered {redirect}: a push is not redirected; give the URL "
                "it names"
            )
        if not 200 <= answer.status < 300:
            raise OSError(f"the Pushgateway answered {answer.status} {answer.reason}".rstrip())

    return push


def _build_id_of(registry: CollectorRegistry) -> str | None:
    """The id of the build a registry of :func:`metrics_registry` reads (None: another)."""
    sources = _SOURCES_OF.get(registry)
    return (sources.monitor.build_id or None) if sources is not None else None
