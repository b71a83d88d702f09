"""OTLP span export: the span projection, turned into OpenTelemetry spans and sent off-thread.

The span projection runs where the build's read model is folded and hands each finished span to
the OpenTelemetry SDK, as a finished SDK span with its recorded times and derived ids; a
:class:`SpanExportQueue`, the export's one queue and one thread, exports them in batches. What an
export did is the exporter's ``SpanExportResult``, and the process's logging is left alone. A
collector that is down, slow or refusing costs the build nothing: failures are reported once with
their likely reason and counted, exports are held back while they fail, spans that do not fit
are dropped and counted, and shutting down waits for a final flush only up to a deadline.

Not the SDK's ``BatchSpanProcessor``: with a collector that is down, its shutdown held a build's
exit for 30 s and it could say nothing of the spans it lost, where this queue ends at once and
counts every one (``benchmarks/span_export.py``, BENCHMARKS.md).

Configuration follows the OpenTelemetry environment variables (``OTEL_EXPORTER_OTLP_*``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), which ``--otlp-endpoint`` and
``--otlp-protocol`` override.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SdkEvent
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from trt_otel.core.events import BuildStarted, Event, StepCompleted
from trt_otel.core.readmodel import PHASE_EVENTS_CLOSING, ReadModel
from trt_otel.core.state import Phase
from trt_otel.core.urls import shown
from trt_otel.core.version import __version__
from trt_otel.views.conventions import SCHEMA_URL
from trt_otel.views.otlp_settings import (
    OtlpSettings,
    SpanExportHealth,
    Warn,
    unreachable_because,
)
from trt_otel.views.resource import detect_resource
from trt_otel.views.spans import (
    SpanProjection,
    SpanRecord,
)

SPAN_QUEUE_CAPACITY = 2_048
"""Spans waiting for the collector, at most (four batches): about 15 MiB, since an SDK span
waiting for export takes about 7.5 KiB (measured: 16,384 queued for a collector that was down
cost the supervisor 108 MiB more than 2,048, and 4,096 still grew it by 60 MiB between 40 and
160 thousand phases). The oldest are dropped when it is full, counted and reported."""


class SpanExportQueue(SpanProcessor):
    """An SDK span processor that exports ended spans in batches on its own thread: the OTLP
    export's one queue and one thread (the spans are made on the read model's thread).

    ``on_end`` is an append to a bounded deque (the oldest span makes room when it is full, and
    is counted). What an export did is the exporter's ``SpanExportResult``; the first failure is
    reported through ``warn`` with the likely reason (:func:`unreachable_because`, or no answer
    within the request timeout), later ones are counted. While exports fail they are held back
    ``retry_after_s``, doubling up to a minute, so a dead collector costs a timeout now and
    then. The process's logging is never touched.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        describe: str,
        warn: Warn,
        endpoint: str = "",
        request_timeout_s: float | None = None,
        refusal: Callable[[], str | None] | None = None,
        capacity: int = SPAN_QUEUE_CAPACITY,
        batch_size: int = 512,
        interval_s: float = 1.0,
        retry_after_s: float = 5.0,
    ) -> None:
        self._exporter = exporter
        self._describe = describe
        self._warn = warn
        self._endpoint = endpoint
        self._request_timeout_s = request_timeout_s
        self._refusal = refusal
        self._capacity = capacity
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._retry_after_s = retry_after_s
        self._backoff_s = retry_after_s
        self._retry_at = float("-inf")
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._in_flight = 0
        self._exporting = False
        """Between taking a batch and being done with it (its outcome counted and reported)."""
        self._final = False
        """Set by close: one last attempt, whatever the backoff; a failure gives the rest up."""
        self._close_by: float | None = None
        """When the final flush must end (monotonic), once it has begun."""
        self._given_up = False
        self._reported = False
        self._stopping = False
        self._exported = 0
        self._dropped = 0
        self._failed = 0
        self.failed_exports = 0
        """Exports that failed (their spans counted in :meth:`health`'s ``failed``)."""
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="trt-otel-otlp-export", daemon=True)
        self._thread.start()

    # -- SpanProcessor -------------------------------------------------------------------------

    def on_end(self, span: ReadableSpan) -> None:
        if self._stopping:
            self._dropped += 1
            return
        if len(self._queue) >= self._capacity:
            try:
                self._queue.popleft()
                self._dropped += 1
            except IndexError:
                pass
        self._queue.append(span)
        if len(self._queue) == self._batch_size:
            # A batch is ready: wake the export thread once (it exports until the queue is
            # empty or a failure holds it back). While a collector is down the queue stays
            # full, and a wake per span would only cost this thread.
            self._wake.set()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.flush(timeout_millis / 1000)

    def shutdown(self) -> None:
        self.close(timeout_s=5.0)

    # -- the export thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            while self._queue and not self._given_up:
                # Whether this attempt is the final one is decided as it begins: a close that
                # begins while an earlier attempt fails must still get its last attempt.
                final = self._final
                if not final and time.monotonic() < self._retry_at:
                    break  # held back after a failure
                exported = self._export(self._take_batch())
                with self._idle:
                    # Only now is the batch done with: counted, and a failure reported.
                    self._exporting = False
                if not exported:
                    self._given_up = final
                    break
            with self._idle:
                self._idle.notify_all()
            if self._stopping:
                return

    def _take_batch(self) -> list[ReadableSpan]:
        batch: list[ReadableSpan] = []
        with self._idle:
            while self._queue and len(batch) < self._batch_size:
                batch.append(self._queue.popleft())
            self._in_flight = len(batch)
            self._exporting = True
        return batch

    def _export(self, batch: Sequence[ReadableSpan]) -> bool:
        error: str | None = None
        began = time.monotonic()
        try:
            ok = self._exporter.export(batch) is SpanExportResult.SUCCESS
        except Exception as exception:  # an exporter bug must not end the thread
            ok, error = False, f"{type(exception).__name__}: {exception}"
        took_s = time.monotonic() - began
        with self._idle:
            if self._in_flight == 0:
                return False  # close() gave up on this batch and counted it dropped
            self._in_flight = 0
            if ok:
                self._exported += len(batch)
                self._backoff_s = self._retry_after_s
                return True
            self._failed += len(batch)
            self.failed_exports += 1
            first_failure = self.failed_exports == 1
        self._last_error = error or self._why_failed(took_s)
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, 60.0)
        if first_failure:
            self._report(self._last_error)
        return False

    def _report(self, reason: str) -> None:
        if not self._reported:
            self._reported = True
            self._warn(
                f"OTLP export to {self._describe} failed ({reason}); "
                "the build goes on, further failures are only counted"
            )

    def _still_unreachable(self, timeout_s: float) -> bool:
        """Whether the collector still cannot be connected to (within ``timeout_s``)."""
        reason = unreachable_because(self._endpoint, timeout_s) if self._endpoint else None
        if reason is not None:
            self._last_error = reason
        return reason is not None

    def _why_failed(self, took_s: float) -> str:
        """The likely reason of a FAILURE, the exporter's only answer."""
        refused = self._refusal() if self._refusal is not None else None
        if refused is not None:
            return refused
        unreachable = unreachable_because(self._endpoint) if self._endpoint else None
        if unreachable is not None:
            return unreachable
        timeout_s = self._request_timeout_s
        if timeout_s is not None and took_s >= timeout_s * 0.9:
            return f"no answer within {timeout_s:g}s"
        return "the collector answered, but did not accept the spans"

    # -- control -------------------------------------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        """Wait until every span handed over so far was exported or given up on."""
        self._wake.set()
        with self._idle:
            return self._idle.wait_for(
                lambda: (
                    self._given_up
                    or (not self._queue and not self._in_flight and not self._exporting)
                ),
                timeout=timeout_s,
            )

    def begin_close(self, timeout_s: float) -> None:
        """Start the final flush (one last attempt, whatever the backoff), to end within
        ``timeout_s`` from now, without waiting: other exports flush meanwhile, and
        :meth:`close` waits for what is left of it. Only the first call counts."""
        if self._close_by is not None:
            return
        self._close_by = time.monotonic() + max(timeout_s, 0.0)
        self._final = True
        self._wake.set()

    def close(self, timeout_s: float) -> bool:
        """Export what is queued by the flush's end (``timeout_s`` from the first of
        :meth:`begin_close` and this), then drop the rest and stop; True when everything queued
        was handed to the collector in time."""
        if self._stopping:
            return not self._queue
        self.begin_close(timeout_s)
        assert self._close_by is not None
        close_by = self._close_by
        unreachable = bool(self._queue or self._in_flight) and self._still_unreachable(
            min(1.0, max(close_by - time.monotonic(), 0.05))
        )
        if unreachable:
            # Nothing queued can reach a collector that cannot be connected to, and the
            # exporter would only wait out its retries: a dead collector must not hold the
            # build's exit for seconds.
            self._given_up = True
            self._report(self._last_error or "unreachable")
        flushed = self.flush(max(close_by - time.monotonic(), 0.0)) and not self._given_up
        self._stopping = True
        self._wake.set()
        with self._idle:
            left = len(self._queue) + self._in_flight
            if unreachable:
                self._failed += left  # unreachable, as an export would have found
            else:
                self._dropped += left
            self._queue.clear()
            self._in_flight = 0
        if left and not self._given_up:  # the deadline passed with an export unanswered
            reason = f"no answer within {timeout_s:g}s"
            self._last_error = self._last_error or reason
            self._report(reason)
        try:
            # Aborts retries and in-flight calls; an exporter stuck anyway is left behind on
            # its daemon thread rather than holding up the process.
            self._exporter.shutdown()
        except Exception as exception:
            self._last_error = f"{type(exception).__name__}: {exception}"
        return flushed

    def health(self) -> SpanExportHealth:
        return SpanExportHealth(
            exported=self._exported,
            dropped=self._dropped,
            failed=self._failed,
            queued=len(self._queue) + self._in_flight,
            last_error=self._last_error,
        )


# -- records to SDK spans ----------------------------------------------------------------------


class SpanEmitter:
    """Hands each record to the span processor as a finished SDK span (``ReadableSpan``), with
    the record's ids, times, attributes and events.

    A record is already a finished span, so none of the SDK's machinery for a span being
    recorded (a tracer, a sampler, a context, limits on attributes that the projection keeps
    small anyway) is needed: building the ``ReadableSpan`` directly took 2.0 us a span here,
    starting and ending one through a tracer 14.3 us. The sampler's one decision is kept: a
    record whose traced job chose not to sample its trace is not exported.
    """

    def __init__(self, processor: SpanProcessor, resource: Resource | None = None) -> None:
        self._processor = processor
        self._resource = resource or detect_resource()
        self._scope = InstrumentationScope("trt_otel", __version__, SCHEMA_URL)

    def emit(self, record: SpanRecord) -> None:
        if not record.sampled:
            return
        parent = None
        if record.parent_span_id is not None:
            parent = SpanContext(
                record.trace_id,
                record.parent_span_id,
                is_remote=record.parent_is_remote,
                trace_flags=_SAMPLED,
            )
        span = ReadableSpan(
            name=record.name,
            context=SpanContext(record.trace_id, record.span_id, False, _SAMPLED),
            parent=parent,
            resource=self._resource,
            attributes=record.attributes,
            events=[
                SdkEvent(event.name, event.attributes, event.time_ns) for event in record.events
            ],
            kind=SpanKind.SERVER if record.server else SpanKind.INTERNAL,
            status=_UNSET if record.error is None else Status(StatusCode.ERROR, record.error),
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=self._scope,
            links=[
                Link(SpanContext(trace_id, span_id, False, _SAMPLED))
                for trace_id, span_id in record.links
            ],
        )
        self._processor.on_end(span)


_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


# -- the follower ------------------------------------------------------------------------------


class OtlpSpanExport:
    """The ``otlp`` follower: events in, spans out to an OTLP collector.

    Attach with ``log.follow(export)``; after the log is closed, call :meth:`close` to flush
    within a deadline. Works the same on a replayed journal (call :meth:`handle` directly).
    """

    name = "otlp"
    phase_events = PHASE_EVENTS_CLOSING  # a span is made where a phase closes

    def __init__(
        self,
        settings: OtlpSettings,
        *,
        warn: Warn,
        exporter: SpanExporter | None = None,
        resource: Resource | None = None,
        model: ReadModel | None = None,
        interval_s: float = 1.0,
        retry_after_s: float = 5.0,
    ) -> None:
        """``interval_s`` and ``retry_after_s`` tune the :class:`SpanExportQueue`."""
        self.settings = settings
        self.projection = self._projection(model)
        session = settings.http_session() if exporter is None else None
        self.queue = SpanExportQueue(
            exporter or settings.make_exporter(session),
            describe=f"{shown(settings.endpoint)} ({settings.protocol})",
            warn=warn,
            endpoint=settings.endpoint,
            request_timeout_s=settings.request_timeout_s,
            refusal=(lambda: session.refusal) if session is not None else None,
            interval_s=interval_s,
            retry_after_s=retry_after_s,
        )
        self._emitter = SpanEmitter(self.queue, resource)
        self._warn = warn

    def handle(self, events: Sequence[Event]) -> None:
        """As a follower of the log: fold each event into the projection's own model."""
        for event in events:
            if isinstance(event, BuildStarted) and self.projection.started:
                # A log of several builds (``trt-otel run``): each build is a tree of its own.
                self._next_build()
            for record in self.projection.apply(event):
                self._emitter.emit(record)

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        """As a subscriber of the shared read model given at construction, on its thread: the
        spans the event completed go to the export queue (an append, never a wait)."""
        if type(event) is BuildStarted and self.projection.started:
            # The model has already begun the new build: the last one ended before it (a run
            # records its builds one after another), so there is nothing left to finish.
            self.projection = self._projection(self.projection.model)
        for record in self.projection.project(event, closed):
            self._emitter.emit(record)

    def on_steps(self, last: StepCompleted) -> None:
        """Quiet steps complete no span."""

    def emit(self, record: SpanRecord) -> None:
        """Export a span made outside the projection (``run``'s own, a live snapshot)."""
        self._emitter.emit(record)

    def spans_left(self) -> int:
        """What the span budget still allows beside the final spans sent so far (read from
        another thread: a snapshot's budget, a moment late at worst)."""
        return self.settings.span_budget - self.projection.emitted

    def failed_exports(self) -> int:
        """How many exports have failed so far (their spans were not delivered)."""
        return self.queue.failed_exports

    def _next_build(self) -> None:
        for record in self.projection.finish():
            self._emitter.emit(record)
        self.projection = self._projection(None)

    def _projection(self, model: ReadModel | None) -> SpanProjection:
        return SpanProjection(
            span_budget=self.settings.span_budget,
            fold_under_ns=self.settings.fold_under_ns,
            model=model,
            keep_logged_from=self.settings.logs_level,
            log_events=self.settings.logs_level is None,
        )

    def close(self) -> None:
        """The log ended: end whatever it left open (see :meth:`SpanProjection.finish`)."""
        for record in self.projection.finish():
            self._emitter.emit(record)

    def begin_shutdown(self, timeout_s: float) -> None:
        """Start the final flush, to end within ``timeout_s``, without waiting for it."""
        self.queue.begin_close(timeout_s)

    def shutdown(self, timeout_s: float) -> SpanExportHealth:
        """Flush within ``timeout_s`` (from :meth:`begin_shutdown`, if it was called) and stop;
        what happened to the spans."""
        self.queue.close(timeout_s)
        return self.queue.health()

    def health(self) -> SpanExportHealth:
        """What happened to the spans so far; safe from any thread (a scrape reads it)."""
        return self.queue.health()
