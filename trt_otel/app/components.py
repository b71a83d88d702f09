"""The parts a session attaches to a build, each a context manager that owns its shutdown.

Entering one starts it (binds its port, opens its file) and fails fast with a
:class:`~trt_otel.app.config.UsageError` when it cannot work; leaving it stops it and says, once,
what it could not do. A session enters them in one :class:`contextlib.ExitStack`, so they stop
in the reverse order of their start, and whatever had started is stopped when a later part
fails to.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from trt_otel.app import view_registry
from trt_otel.app.config import (
    ConsoleConfig,
    GpuConfig,
    HttpConfig,
    MetricsConfig,
    ObservabilityConfig,
    PolicyConfig,
    SpanConfig,
    UsageError,
)
from trt_otel.app.view_registry import ViewContext
from trt_otel.builder.provenance import FINGERPRINT, fingerprint
from trt_otel.capture.checked import read_journal
from trt_otel.capture.gpu import GpuReader, GpuSampler, open_reader
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.process import ProcessSampler
from trt_otel.core.eta import History
from trt_otel.core.files import FileKindError, regular_file_or_absent, write_atomically
from trt_otel.core.followers import Follower, FollowerWorker
from trt_otel.core.journal import JournalWriter
from trt_otel.core.log import EventLog
from trt_otel.core.observed import ObservedBuild
from trt_otel.core.readmodel import ReadModel, Subscriber
from trt_otel.core.sizes import format_bytes
from trt_otel.core.urls import shown
from trt_otel.views.console import LiveConsole, PlainLines
from trt_otel.views.discovery import ScrapeTarget, discovery_labels
from trt_otel.views.otlp_settings import LOGS, METRICS
from trt_otel.views.terminal import say, warn, warnings_heard_by
from trt_otel.views.trace_ids import TRACEPARENT_ATTRIBUTE, parse_traceparent

if TYPE_CHECKING:  # imported when asked for: most builds export nothing (start-up time)
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

    from trt_otel.control.runner import PolicyRunner
    from trt_otel.control.signals import StopClock
    from trt_otel.views.http import StatusServer
    from trt_otel.views.otlp import OtlpSpanExport
    from trt_otel.views.otlp_logs import OtlpLogExport
    from trt_otel.views.otlp_metrics import OtlpMetricsExport
    from trt_otel.views.prometheus import MetricSources, MetricsServer

DEEP_QUEUE = 1_000_000
"""Followers that must not lose an event (a lost event misshapes a tree) and do no I/O on the
way get a queue this deep."""


# -- before the monitor: what goes into the build's attributes -------------------------------


@contextlib.contextmanager
def gpu_reader(config: GpuConfig, needed_by: Sequence[str] = ()) -> Iterator[GpuReader | None]:
    """The build's GPU, unless turned off; one line says which, or why not. ``needed_by``: the
    options of policies that read the GPU's samples, which refuse to start a build (exit 2)
    where it is not sampled."""
    needing = " and ".join(needed_by)
    if not config.enabled:
        if needed_by:
            raise UsageError(f"{needing} needs the build's GPU sampled, which --no-gpu turns off")
        yield None
        return
    reader, line = open_reader(config.device)
    if reader is None and needed_by:
        why = line.removeprefix("gpu: no telemetry: ")
        raise UsageError(f"{needing} needs the build's GPU sampled, and no GPU is visible: {why}")
    say(line)
    try:
        yield reader
    finally:
        if reader is not None:
            reader.close()


def join_parent_trace(attributes: dict[str, Any]) -> None:
    """Inside a traced CI job (``TRACEPARENT`` set), the build's span joins the job's trace."""
    traceparent = os.environ.get("TRACEPARENT", "").strip()
    if not traceparent:
        return
    if parse_traceparent(traceparent) is None:
        warn(f"ignoring TRACEPARENT {traceparent!r}: not a W3C traceparent")
        return
    attributes[TRACEPARENT_ATTRIBUTE] = traceparent


def build_context(
    stack: contextlib.ExitStack[Any],
    observe: ObservabilityConfig,
    attributes: dict[str, Any],
    policy: PolicyConfig | None = None,
    *,
    fingerprinted: bool = False,
) -> tuple[GpuReader | None, History | None]:
    """What a session knows of its builds before the first one, entered on ``stack``: the GPU
    (its description added to ``attributes``; where ``policy`` reads it, there must be one),
    the traced job's trace to join, and the history of earlier builds. ``fingerprinted``: a
    build made here, whose record is complete once the GPU is known: its fingerprint is added
    then, before the history is read, so that the history is of this very build."""
    policy = policy if policy is not None else PolicyConfig()
    gpu = stack.enter_context(gpu_reader(observe.gpu, policy.options_reading("gpu")))
    if gpu is not None:
        attributes.update(gpu.describe())
    if fingerprinted:
        attributes[FINGERPRINT] = fingerprint(attributes)
    join_parent_trace(attributes)
    history = load_history(observe.history, attributes)
    if history is not None:
        check_memory_history(history, policy.min_available_bytes)
    return gpu, history


def load_history(directory: Path | None, attributes: dict[str, Any]) -> History | None:
    if directory is None:
        return None
    if not directory.is_dir():
        raise UsageError(f"--history {directory} is not a directory of journals")
    history = History.load(directory, attributes=attributes, read=read_journal)
    say(
        f"history: {len(history.builds)} earlier builds of this model in {directory}"
        + (f" ({len(history.skipped)} journals not used)" if history.skipped else "")
    )
    return history


def check_memory_history(
    history: History, min_available_bytes: int | None, available_bytes: int | None = None
) -> None:
    """Say what earlier builds of the model needed against what the host has now, and refuse
    (a usage error: nothing started) a build that ``--min-available`` says cannot fit."""
    peaks = history.peak_rss_range()
    if peaks is None:
        return
    count, low, high = peaks
    available = psutil.virtual_memory().available if available_bytes is None else available_bytes
    needed = f"{format_bytes(low)}-{format_bytes(high)}" if low != high else format_bytes(high)
    said = (
        f"the last {count} builds of this model peaked at {needed}; "
        f"{format_bytes(available)} is available"
    )
    if min_available_bytes is not None and available - high < min_available_bytes:
        raise UsageError(
            f"{said}: such a build would leave less than --min-available "
            f"{format_bytes(min_available_bytes)}, so it is not started"
        )
    if high > available:
        warn(f"memory: {said}")
    else:
        say(f"memory: {said}")


@contextlib.contextmanager
def sampling(
    monitor: BuildMonitor, gpu: GpuReader | None, interval_s: float
) -> Iterator[Callable[[int], None]]:
    """The builder's process (and its GPU, where there is one) sampled every ``interval_s``
    until the build ends (no sample follows its end); yields what to tell of the process that
    builds, once it runs."""

    def build_open() -> bool:
        return monitor.state.outcome is None

    with contextlib.ExitStack() as stack:
        samplers: list[ProcessSampler | GpuSampler] = []
        if gpu is not None:
            gpu_sampler = GpuSampler(
                monitor, gpu, interval_s=interval_s, warn=warn, build_open=build_open
            )
            samplers.append(stack.enter_context(gpu_sampler))
        builder = ProcessSampler(monitor, interval_s=interval_s, warn=warn, build_open=build_open)
        samplers.append(stack.enter_context(builder))

        def watch(pid: int) -> None:
            for sampler in samplers:
                sampler.watch(pid)

        yield watch


# -- sinks with a shutdown of their own ----------------------------------------------------------


@contextlib.contextmanager
def span_export(
    config: SpanConfig, model: ReadModel, resource: Resource | None = None
) -> Iterator[OtlpSpanExport | None]:
    """Spans to an OTLP collector, if one is configured, projected from ``model`` (they
    subscribe to it) and produced by ``resource`` (None: one detected now); flushed within
    the deadline on exit."""
    settings = config.settings()
    if settings is None:
        yield None
        return
    from trt_otel.views.otlp import OtlpSpanExport

    export = OtlpSpanExport(settings, warn=warn, model=model, resource=resource)
    model.subscribe(export)
    say(f"spans: {shown(settings.endpoint)} ({settings.protocol})")
    completed = False
    try:
        yield export
        completed = True
    finally:
        # A session that failed to start has nothing worth waiting for or reporting.
        health = export.shutdown(config.flush_timeout_s if completed else 0.0)
    if completed:
        lost = health.failed + health.dropped
        if lost:
            warn(
                f"{lost:,} spans not exported ({health.failed:,} refused or unreachable, "
                f"{health.dropped:,} dropped; last error: {health.last_error or 'none'})"
            )
        else:
            say(f"spans: {health.exported:,} exported")


@contextlib.contextmanager
def log_export(
    config: SpanConfig, model: ReadModel, resource: Resource | None = None
) -> Iterator[OtlpLogExport | None]:
    """The builder's messages as OTLP log records, if logs are wanted and an endpoint is
    configured; they subscribe to ``model``, and are flushed within the deadline on exit."""
    settings = config.settings(signal=LOGS)
    if settings is None or config.logs_level is None:
        yield None
        return
    from trt_otel.views.otlp_logs import OtlpLogExport

    export = OtlpLogExport(settings, config.logs_level, model=model, resource=resource)
    model.subscribe(export)
    say(f"logs: {shown(settings.endpoint)} ({settings.protocol}), {config.logs_level} and above")
    completed = False
    try:
        with warnings_heard_by(export.warning):  # trt-otel's own warnings are records too
            yield export
        completed = True
    finally:
        health = export.shutdown(config.flush_timeout_s if completed else 0.0)
    lost = health.emitted - health.exported
    if completed and lost:
        warn(f"{lost:,} of {health.emitted:,} log records not exported ({health.reason})")
    elif completed and health.emitted:
        say(f"logs: {health.exported:,} records exported")


@contextlib.contextmanager
def otlp_metrics(
    config: SpanConfig, registry: CollectorRegistry, resource: Resource | None = None
) -> Iterator[OtlpMetricsExport | None]:
    """``registry``'s series pushed over OTLP (``--otlp-metrics``) every interval, and once
    more on exit, within the flush deadline."""
    settings = config.settings(signal=METRICS)
    if settings is None:
        if config.metrics:  # asked for, with nowhere to go: before anything starts
            raise UsageError(
                "--otlp-metrics needs an OTLP endpoint: --otlp-endpoint URL or "
                "OTEL_EXPORTER_OTLP_ENDPOINT (and not OTEL_METRICS_EXPORTER=none)"
            )
        yield None
        return
    from trt_otel.views.otlp_metrics import OtlpMetricsExport

    export = OtlpMetricsExport(
        settings, registry, interval_s=config.metrics_interval_s, resource=resource
    )
    say(
        f"metrics: {shown(settings.endpoint)} ({settings.protocol}), "
        f"every {config.metrics_interval_s:g}s"
    )
    completed = False
    try:
        yield export
        completed = True
    finally:
        health = export.shutdown(config.flush_timeout_s if completed else 0.0)
    if completed and health.reason is not None:
        warn(f"the final metrics were not exported over OTLP ({health.reason})")
    elif completed and health.failed:
        why = f" ({health.refusal})" if health.refusal else ""
        warn(
            f"{health.failed:,} of {health.exported + health.failed:,} OTLP metric exports "
            f"failed{why}"
        )


class FinalFlush(Protocol):
    """An OTLP export whose final flush can begin before it is waited for."""

    def begin_shutdown(self, timeout_s: float) -> None: ...


@contextlib.contextmanager
def final_flush(timeout_s: float, *exports: FinalFlush | None) -> Iterator[None]:
    """On a normal exit, begin the final flush of every export given, at once: one flush
    timeout for them all (each one's shutdown, later, waits for what is left of it), not one
    after the other. After an error, nothing begins: each stops as a session that failed."""
    yield
    for export in exports:
        if export is not None:
            export.begin_shutdown(timeout_s)


def metric_sources(
    monitor: ObservedBuild,
    config: MetricsConfig,
    *,
    spans: OtlpSpanExport | None,
    runner: PolicyRunner | None,
    model: ReadModel,
) -> MetricSources:
    from trt_otel.views.prometheus import MetricSources

    return MetricSources(
        monitor,
        build_id_label=config.build_id_label,
        span_health=spans.health if spans is not None else None,
        policy_health=runner.health if runner is not None else None,
        eta=_eta_seconds(model, monitor),
    )


def _eta_seconds(model: ReadModel, monitor: ObservedBuild) -> Callable[[], float | None]:
    return lambda: model.estimate(monitor.log.clock.mono_ns()).build.seconds


@contextlib.contextmanager
def metrics_endpoint(
    registry: CollectorRegistry, config: MetricsConfig, stop: StopClock | None = None
) -> Iterator[MetricsServer | None]:
    """Prometheus' scrape endpoint for ``registry``, if asked for. On exit the final values
    reach Prometheus: a last scrape is awaited (only when something has been scraping), for
    as long as a stop's budget allows (``stop``)."""
    server: MetricsServer | None = None
    if config.port is not None:
        from trt_otel.views.prometheus import MetricsServer

        try:
            server = MetricsServer(registry, config.port, config.address)
        except OSError as error:
            raise UsageError(
                f"cannot serve metrics on {config.address}:{config.port}: {error.strerror or error}"
            ) from None
        say(f"metrics: http://{server.address}:{server.port}/metrics")
    completed = False
    try:
        yield server
        completed = True
    finally:
        if completed and server is not None:
            began = time.monotonic()
            if server.linger(_within_budget(stop, config.linger_s)):
                say(f"metrics: final values scraped after {time.monotonic() - began:.1f}s")
        if server is not None:
            server.close()


def _within_budget(stop: StopClock | None, linger_s: float) -> float:
    """A linger for a last reader, within what a signal's stop budget leaves (all of it where
    no signal asked the build to stop)."""
    return stop.allows(linger_s) if stop is not None else linger_s


@contextlib.contextmanager
def final_push(registry: CollectorRegistry, config: MetricsConfig) -> Iterator[None]:
    """On a normal exit, push the final values to the Pushgateway, if one is given (within its
    own deadline: :data:`~trt_otel.views.prometheus.PUSH_TIMEOUT_S`)."""
    yield
    if config.pushgateway is not None:
        from trt_otel.views.prometheus import push_build_metrics

        try:
            push_build_metrics(registry, config.pushgateway)
        except OSError as error:
            warn(f"cannot push metrics to {shown(config.pushgateway)}: {error}")


@contextlib.contextmanager
def status_server(
    monitor: ObservedBuild,
    config: HttpConfig,
    *,
    model: ReadModel,
    registry: CollectorRegistry,
    stop: StopClock | None = None,
) -> Iterator[StatusServer | None]:
    """The HTTP view, if asked for; its /metrics serves ``registry``. Its events come from the
    log: follow ``server.feed``."""
    if config.port is None:
        yield None
        return
    from trt_otel.views.http import StatusServer

    if config.url_file is not None:
        # Written by rename and removed at the end: anything but a regular file (a FIFO, a
        # device, a directory) would be destroyed, so it is refused before anything starts.
        try:
            regular_file_or_absent(config.url_file, "--http-url-file")
        except FileKindError as error:
            raise UsageError(str(error)) from None
    token, token_file = _cancel_token(config.cancel_token, monitor.build_id)
    try:
        try:
            server = StatusServer(
                monitor,
                model,
                registry,
                port=config.port,
                address=config.address,
                cancel_token=token,
                allowed_hosts=config.allowed_hosts,
            )
        except OSError as error:
            raise UsageError(
                f"cannot serve HTTP on {config.address}:{config.port}: {error.strerror or error}"
            ) from None
        server.token_file = token_file
        if config.url_file is not None:
            try:
                write_atomically(config.url_file, f"{server.url}\n".encode())
            except OSError as error:
                server.close(linger_s=0)
                raise UsageError(
                    f"cannot write --http-url-file {config.url_file}: {error.strerror or error}"
                ) from None
        say(f"page: {server.url}/")
        say(f"http: {server.url}/status  {server.url}/events")
        if token_file is not None:
            say(
                f'cancel: curl -X POST -H "Authorization: Bearer $(cat {token_file})" '
                f"{server.url}/cancel"
            )
        try:
            yield server
        finally:
            linger_s = _within_budget(stop, config.linger_s)
            server.close(linger_s=linger_s, unwatched=config.linger_unwatched)
            if config.url_file is not None:
                with contextlib.suppress(OSError):
                    config.url_file.unlink()
    finally:
        if token_file is not None:
            token_file.unlink(missing_ok=True)


@dataclass(frozen=True)
class Views:
    """What :func:`attach_views` started: the span export and the HTTP view (each ``None`` when
    not asked for) and the one registry behind every metrics view (``None`` when no metrics
    view is asked for)."""

    spans: OtlpSpanExport | None
    registry: CollectorRegistry | None
    http: StatusServer | None


def attach_views(
    stack: contextlib.ExitStack[Any],
    monitor: ObservedBuild | None,
    observe: ObservabilityConfig,
    *,
    runner: PolicyRunner | None,
    model: ReadModel,
    collectors: Sequence[Collector] = (),
    attributes: Mapping[str, Any] | None = None,
    stop: StopClock | None = None,
) -> Views:
    """The views ``trt-otel build``, ``run`` and ``watch`` attach alike: every view of
    :mod:`~trt_otel.app.view_registry` that ``observe`` asks for, entered on ``stack`` in the
    registry's order (so they stop in the reverse order, each after the log's followers have
    drained into it). The OpenTelemetry exports share one resource, detected once (the build's
    ``attributes`` name its GPU); ``collectors`` join the metrics registry. Without a metrics
    view there is no registry, and Prometheus' client is not imported."""
    context = ViewContext(
        monitor,
        observe,
        model,
        runner,
        attributes or {},
        collectors,
        resource=telemetry_resource(observe.spans, attributes),
        stop=stop,
    )
    for entry in view_registry.wanted_by(observe):
        context.started[entry.name] = stack.enter_context(entry.attached(context))
    return Views(context.view("spans"), context.view("metrics"), context.view("http"))


# -- each view as the registry attaches it -----------------------------------------------------


def attach_log_export(context: ViewContext) -> AbstractContextManager[OtlpLogExport | None]:
    return log_export(context.observe.spans, context.model, context.resource)


def attach_span_export(context: ViewContext) -> AbstractContextManager[OtlpSpanExport | None]:
    return span_export(context.observe.spans, context.model, context.resource)


def attach_scrape_target(context: ViewContext) -> AbstractContextManager[ScrapeTarget | None]:
    return scrape_target(context.observe.metrics, context.attributes, context.build)


@contextlib.contextmanager
def attach_metrics_registry(context: ViewContext) -> Iterator[CollectorRegistry]:
    """One registry for scrapes, the HTTP view, the push and OTLP metrics, with the
    session's ``collectors`` on it."""
    from trt_otel.views.prometheus import metrics_registry

    sources = metric_sources(
        context.build,
        context.observe.metrics,
        spans=context.view("spans"),
        runner=context.runner,
        model=context.model,
    )
    registry = metrics_registry(sources)
    for collector in context.collectors:
        registry.register(collector)
    yield registry


def attach_metrics_endpoint(context: ViewContext) -> AbstractContextManager[MetricsServer | None]:
    return metrics_endpoint(context.view("metrics"), context.observe.metrics, context.stop)


def attach_otlp_metrics(context: ViewContext) -> AbstractContextManager[OtlpMetricsExport | None]:
    return otlp_metrics(context.observe.spans, context.view("metrics"), context.resource)


def attach_status_server(context: ViewContext) -> AbstractContextManager[StatusServer | None]:
    return status_server(
        context.build,
        context.observe.http,
        model=context.model,
        registry=context.view("metrics"),
        stop=context.stop,
    )


def attach_final_flush(context: ViewContext) -> AbstractContextManager[None]:
    exports = (context.view("spans"), context.view("logs"), context.view("otlp-metrics"))
    return final_flush(context.observe.spans.flush_timeout_s, *exports)


def attach_final_push(context: ViewContext) -> AbstractContextManager[None]:
    return final_push(context.view("metrics"), context.observe.metrics)


@contextlib.contextmanager
def attach_announcement(context: ViewContext) -> Iterator[None]:
    """The scrape target announced, once the endpoint it names listens."""
    target = context.view("scrape-target")
    if target is not None:
        _announce_target(target, context.view("prometheus"), context.view("http"))
    yield


def telemetry_resource(spans: SpanConfig, attributes: Mapping[str, Any] | None) -> Resource | None:
    """The resource of the session's OpenTelemetry exports, detected once; None when none is
    configured (nothing to detect it for)."""
    if spans.settings() is None:
        return None
    from trt_otel.views.resource import detect_resource

    return detect_resource(attributes, warn=warn)


@contextlib.contextmanager
def scrape_target(
    config: MetricsConfig, attributes: Mapping[str, Any], monitor: ObservedBuild
) -> Iterator[ScrapeTarget | None]:
    """The build's file_sd target file (``--prometheus-sd-dir``), removed on exit."""
    if config.sd_dir is None:
        yield None
        return
    with ScrapeTarget(config.sd_dir, discovery_labels(attributes), monitor.build_id) as target:
        yield target


def _announce_target(
    target: ScrapeTarget, metrics: MetricsServer | None, http: StatusServer | None
) -> None:
    endpoint = metrics or http
    if endpoint is None:  # the options' check requires one
        raise UsageError("--prometheus-sd-dir needs --prometheus-port or --http-port")
    try:
        target.announce(endpoint.address, endpoint.port)
    except OSError as error:
        raise UsageError(
            f"cannot write to --prometheus-sd-dir {target.directory}: {error.strerror or error}"
        ) from None
    say(f"discovery: {target.path}")


def _cancel_token(given: str | None, build_id: str) -> tuple[str, Path | None]:
    """The bearer token for ``POST /cancel``: given (option or ``TRT_OTEL_CANCEL_TOKEN``), or
    generated for this build and written to a file only its owner can read."""
    token = given or os.environ.get("TRT_OTEL_CANCEL_TOKEN", "").strip()
    if token:
        return token, None
    token = secrets.token_urlsafe(32)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    directory = Path(base) / f"trt-otel-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid() or directory.stat().st_mode & 0o077:
        raise UsageError(f"{directory} is not private to this user; give --cancel-token")
    path = directory / f"{build_id}.token"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return token, path


# -- the log's followers -------------------------------------------------------------------------


def open_journal(path: Path, *, append: bool = False) -> JournalWriter:
    try:
        return JournalWriter(path, append=append)
    except FileNotFoundError:
        folder = path.parent
        raise UsageError(f"cannot write journal {path}: no folder {folder}") from None
    except OSError as error:
        raise UsageError(f"cannot write journal {path}: {error.strerror or error}") from None


def console_view(config: ConsoleConfig, model: ReadModel) -> Subscriber:
    """The live tree on a terminal, plain lines elsewhere; subscribed to ``model``."""
    view: Subscriber
    if config.live and sys.stderr.isatty():
        view = LiveConsole(model)
    else:
        view = PlainLines(model, sys.stderr)
    model.subscribe(view)
    return view


@contextlib.contextmanager
def following(
    log: EventLog,
    followers: Sequence[tuple[Follower, int]],
    model: ReadModel | None = None,
    *,
    inline: Sequence[Follower] = (),
) -> Iterator[EventLog]:
    """The log feeding each ``(follower, queue capacity)``, and each of ``inline`` on the
    appending thread, a batch at a time (see :meth:`EventLog.add_batch_consumer`); on exit
    every follower handles what is queued and is closed, and what any of them (or of
    ``model``'s subscribers) lost is said."""
    for follower, capacity in followers:
        log.follow(follower, capacity=capacity)
    for consumer in inline:
        log.add_batch_consumer(consumer.handle)
    try:
        yield log
    finally:
        workers = log.workers
        if not log.close(timeout_s=5.0):
            warn("a follower did not finish in time")
        if model is not None and model.is_fold:
            model.close()  # the log's own fold: it has seen every event already
        for consumer in inline:
            consumer.close()
        report_follower_health(workers)
        for name, (failed, last_error) in (model.subscriber_errors if model else {}).items():
            warn(f"{name}: failed on {failed:,} events (last error: {last_error})")


def report_follower_health(workers: Sequence[FollowerWorker]) -> None:
    """Say what a follower lost or failed at; the build itself was not affected."""
    for worker in workers:
        health = worker.health()
        if health.dropped or health.errors:
            warn(
                f"{health.name}: {health.lost:,} events may be missing from it "
                f"({health.dropped:,} dropped from a full queue, {health.failed_events:,} in "
                f"{health.errors:,} failed batches; last error: {health.last_error or 'none'})"
            )
