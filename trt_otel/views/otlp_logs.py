"""OTLP log export: the builder's logger messages (and trt-otel's notes on the build) as
OpenTelemetry log records, each in the trace and span of the phase it happened in.

TensorRT's ``ILogger`` messages are :class:`~trt_otel.core.events.LogMessage` events; the protocol
departures trt-otel tolerated are :class:`~trt_otel.core.events.Anomaly` events and a cancel is a
:class:`~trt_otel.core.events.CancelRequested`: each becomes one record, timed as the span
projection times spans (the monotonic clock anchored once to the wall clock, so a record lies
inside its span), with the trace id and span id the span projection derives for the phase open
then (the innermost; the build's own span when none is), and a severity mapped from TensorRT's.
The span projection keeps a phase with such a record from being folded, so its span exists.

Records go through the SDK's logs pipeline: a ``LoggerProvider`` with the session's resource and
a ``BatchLogRecordProcessor`` (its own bounded queue and thread) in front of the OTLP exporter.
Nothing here runs on TensorRT's threads: the export follows the read model like the spans do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from trt_otel.core.events import (
    Anomaly,
    BuildStarted,
    CancelRequested,
    Event,
    GpuSample,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
    severity_rank,
)
from trt_otel.core.readmodel import PHASE_EVENTS_NONE, ReadModel
from trt_otel.core.state import Phase
from trt_otel.core.version import __version__
from trt_otel.views.conventions import SCHEMA_URL
from trt_otel.views.otlp_http import AcceptedOn2xx
from trt_otel.views.otlp_settings import GRPC, OtlpSettings, unreachable_because
from trt_otel.views.resource import detect_resource
from trt_otel.views.trace_ids import build_span_id, build_trace_id, phase_span_id

SEVERITY_NUMBERS = {
    "internal_error": SeverityNumber.FATAL,
    "error": SeverityNumber.ERROR,
    "warning": SeverityNumber.WARN,
    "info": SeverityNumber.INFO,
    "verbose": SeverityNumber.DEBUG,
}
"""TensorRT's severities as OpenTelemetry's (the log data model's ranges: an internal error is
fatal to the build, verbose is debug)."""

MAX_BODY_CHARS = 16_384
"""A message longer than this is cut (TensorRT prints whole engine summaries at verbose)."""


@dataclass(frozen=True, slots=True)
class LogItem:
    """One log record, independent of any OpenTelemetry SDK."""

    time_ns: int
    trace_id: int
    span_id: int
    sampled: bool
    severity: str
    """TensorRT's name of it (``WARNING``), or trt-otel's for its own notes."""
    severity_number: SeverityNumber
    body: str
    attributes: dict[str, Any]
    event_name: str


_NO_RECORD: frozenset[type[Event]] = frozenset(
    {StepCompleted, PhaseStarted, PhaseFinished, ProcessSample, GpuSample}
)
"""The events that never make a log record."""


class LogProjection:
    """Log records from the read model's events: a pure function of the events, so a replayed
    journal gives the live run's records. ``level``: the least severe TensorRT message kept;
    trt-otel's own notes (anomalies, cancels) are warnings."""

    def __init__(self, level: str, model: ReadModel | None = None) -> None:
        self.model = model if model is not None else ReadModel()
        self._rank = severity_rank(level)
        self._trace_id = 0
        self._sampled = True
        self._build_id = ""
        self._wall_base_ns: int | None = None
        self._mono_base_ns = 0

    def apply(self, event: Event) -> LogItem | None:
        """Fold ``event`` into the projection's own model; the record it makes, if any."""
        return self.project(event, self.model.apply(event))

    def project(self, event: Event, closed: Sequence[Phase] = ()) -> LogItem | None:
        """The record ``event`` makes, the model having folded it."""
        kind = type(event)
        if kind in _NO_RECORD and self._wall_base_ns is not None:
            return None  # a build's events are mostly these: nothing more to ask of them
        if self._wall_base_ns is None or kind is BuildStarted:
            self._begin(event)
        if isinstance(event, LogMessage):
            severity = event.severity.lower()
            if severity_rank(severity) > self._rank:
                return None
            number = SEVERITY_NUMBERS.get(severity, SeverityNumber.INFO)
            return self._item(
                event,
                severity=event.severity,
                number=number,
                body=event.message,
                event_name="trt.log",
                attributes={},
            )
        if isinstance(event, Anomaly):
            attributes = {"trt.anomaly.kind": event.kind.value}
            return self._item(
                event,
                severity="WARNING",
                number=SeverityNumber.WARN,
                body=event.detail,
                event_name="trt.anomaly",
                attributes=attributes,
            )
        if isinstance(event, CancelRequested):
            attributes = {"trt.cancel.source": event.source}
            body = f"cancel requested: {event.reason}"
            return self._item(
                event,
                severity="WARNING",
                number=SeverityNumber.WARN,
                body=body,
                event_name="trt.cancel",
                attributes=attributes,
            )
        return None

    def warning(self, message: str, time_ns: int) -> LogItem:
        """A warning of trt-otel's own, in the build's span when a build has begun."""
        started = self._wall_base_ns is not None
        return LogItem(
            time_ns=time_ns,
            trace_id=self._trace_id if started else 0,
            span_id=build_span_id(self._trace_id, self._build_id) if started else 0,
            sampled=self._sampled,
            severity="WARNING",
            severity_number=SeverityNumber.WARN,
            body=message[:MAX_BODY_CHARS],
            attributes={"trt.build.id": self._build_id} if started else {},
            event_name="trt_otel.warning",
        )

    def _begin(self, event: Event) -> None:
        self._wall_base_ns, self._mono_base_ns = event.wall_ns, event.mono_ns
        if isinstance(event, BuildStarted):
            self._build_id = event.build_id
            attributes = dict(event.attributes)
        else:  # a log without its start: as the span projection names such a build
            self._build_id, attributes = f"seq0-{event.wall_ns}", {}
        self._trace_id, remote = build_trace_id(attributes, self._build_id)
        self._sampled = remote.sampled if remote is not None else True

    def _item(
        self,
        event: Event,
        *,
        severity: str,
        number: SeverityNumber,
        body: str,
        event_name: str,
        attributes: dict[str, Any],
    ) -> LogItem:
        state = self.model.state
        phase = state.innermost_open()
        phase_id = state.open_by_name.get(phase) if phase is not None else None
        if phase_id is None:
            span_id = build_span_id(self._trace_id, self._build_id)
        else:
            span_id = phase_span_id(self._trace_id, self._build_id, phase_id)
            attributes = {**attributes, "trt.phase.name": phase}
        assert self._wall_base_ns is not None
        return LogItem(
            time_ns=self._wall_base_ns + (event.mono_ns - self._mono_base_ns),
            trace_id=self._trace_id,
            span_id=span_id,
            sampled=self._sampled,
            severity=severity,
            severity_number=number,
            body=body[:MAX_BODY_CHARS],
            attributes={**attributes, "trt.build.id": self._build_id},
            event_name=event_name,
        )


def make_log_exporter(
    settings: OtlpSettings, session: AcceptedOn2xx | None = None
) -> LogRecordExporter:
    """The SDK's exporter; over HTTP, one that counts only a 2xx answer as accepted, through
    ``session`` (a new one when None)."""
    if settings.protocol == GRPC:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
            OTLPLogExporter as GrpcLogExporter,
        )

        return GrpcLogExporter(endpoint=settings.endpoint, timeout=settings.request_timeout_s)
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogExporter,
    )

    return HttpLogExporter(
        endpoint=settings.endpoint,
        timeout=settings.request_timeout_s,
        session=AcceptedOn2xx() if session is None else session,
    )


@dataclass(frozen=True, slots=True)
class LogExportHealth:
    emitted: int
    """Records handed to the SDK's batch processor."""
    exported: int
    """Records in exports the collector accepted."""
    reason: str | None = None
    """Why some were not, when that is known."""


class _CountingExporter(LogRecordExporter):
    """The OTLP exporter, counting what its exports did: the collector's answer is the only
    evidence that a record arrived."""

    def __init__(self, exporter: LogRecordExporter) -> None:
        self._exporter = exporter
        self.exported = 0
        self.failed = 0

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        result = self._exporter.export(batch)
        if result is LogRecordExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.failed += len(batch)
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self._exporter.shutdown()  # type: ignore[no-untyped-call]


class OtlpLogExport:
    """The ``otlp-logs`` follower: events in, log records out through the SDK's logs pipeline.

    Subscribe it to the shared read model (:meth:`on_event`), or feed it a replayed journal
    (:meth:`handle`); :meth:`shutdown` flushes within a deadline.
    """

    name = "otlp-logs"
    phase_events = PHASE_EVENTS_NONE  # a phase's start or finish makes no record

    def __init__(
        self,
        settings: OtlpSettings,
        level: str,
        *,
        resource: Resource | None = None,
        model: ReadModel | None = None,
        exporter: LogRecordExporter | None = None,
        schedule_delay_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self.level = level
        self.projection = LogProjection(level, model)
        self._provider = LoggerProvider(
            resource=resource or detect_resource(), shutdown_on_exit=False
        )
        self._session = settings.http_session() if exporter is None else None
        self._exporter = _CountingExporter(exporter or make_log_exporter(settings, self._session))
        self._provider.add_log_record_processor(
            BatchLogRecordProcessor(
                self._exporter,
                schedule_delay_millis=schedule_delay_s * 1000,
                max_queue_size=2_048,
            )
        )
        self._logger = self._provider.get_logger("trt_otel", __version__, SCHEMA_URL)
        self.emitted = 0
        self._stopping: threading.Thread | None = None
        self._deadline = 0.0
        self._reason: str | None = None

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        """As a subscriber of the shared read model, on its thread."""
        item = self.projection.project(event, closed)
        if item is not None:
            self.emit(item)

    def on_steps(self, last: StepCompleted) -> None:
        """Steps make no record."""

    def handle(self, events: Sequence[Event]) -> None:
        """As a follower of a log of its own (a replayed journal)."""
        for event in events:
            item = self.projection.apply(event)
            if item is not None:
                self.emit(item)

    def close(self) -> None:
        """Nothing is left open at the log's end: a record is made whole from one event."""

    def emit(self, item: LogItem) -> None:
        if not item.sampled:
            return  # the traced job chose not to record this trace
        context = None
        if item.trace_id:
            flags = TraceFlags(TraceFlags.SAMPLED)
            span = NonRecordingSpan(SpanContext(item.trace_id, item.span_id, False, flags))
            context = set_span_in_context(span)
        self._logger.emit(
            timestamp=item.time_ns,
            observed_timestamp=item.time_ns,
            context=context,
            severity_number=item.severity_number,
            severity_text=item.severity,
            body=item.body,
            attributes=item.attributes,
            event_name=item.event_name,
        )
        self.emitted += 1

    def begin_shutdown(self, timeout_s: float) -> None:
        """Start the final flush (within ``timeout_s``) and the SDK's shutdown on a daemon
        thread of their own, so that other exports can flush meanwhile. A collector that
        cannot be connected to is not waited for: the exporter would only wait out its
        retries."""
        if self._stopping is not None:
            return

        def stop() -> None:
            if timeout_s <= 0:
                self._reason = "not attempted"
            else:
                self._reason = unreachable_because(self.settings.endpoint, min(1.0, timeout_s))
            if self._reason is None:
                self._provider.force_flush(max(1, int(timeout_s * 1000)))
            self._provider.shutdown()

        self._deadline = time.monotonic() + max(timeout_s, 0.0)
        self._stopping = threading.Thread(target=stop, name="trt-otel-logs-stop", daemon=True)
        self._stopping.start()

    def warning(self, message: str) -> None:
        """One of trt-otel's own warnings (a sink that failed, a value ignored) as a record, in
        the current build's trace; from any thread. None once the export is stopping."""
        if self._stopping is not None:
            return
        self.emit(self.projection.warning(message, time.time_ns()))

    def shutdown(self, timeout_s: float) -> LogExportHealth:
        """Flush within ``timeout_s`` (from :meth:`begin_shutdown`, if it was called) and stop;
        what happened to the records. An exporter stuck in a request is left behind on its
        daemon thread rather than holding up the process."""
        self.begin_shutdown(timeout_s)
        assert self._stopping is not None
        self._stopping.join(max(self._deadline - time.monotonic(), 0.05))
        exported = self._exporter.exported
        reason = self._reason
        if exported < self.emitted and reason is None:
            refused = self._session.refusal if self._session is not None else None
            if self._exporter.failed:
                reason = refused or "the collector did not accept them"
            else:
                reason = f"no answer within {timeout_s:g}s"
        return LogExportHealth(self.emitted, exported, reason)
