"""A real OTLP receiver for the tests: gRPC and HTTP/protobuf, decoding the wire protocol.

It speaks what Jaeger and the OpenTelemetry Collector accept: ``TraceService/Export``,
``LogsService/Export`` and ``MetricsService/Export`` over gRPC, and ``POST /v1/traces``,
``/v1/logs`` and ``/v1/metrics`` with a protobuf request body (gzip or not) over HTTP. Received
spans, log records and metric points are decoded into plain :class:`ReceivedSpan`,
:class:`ReceivedLog` and :class:`ReceivedPoint` records.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from prometheus_server import free_port
from trt_otel.views.otlp_live import SNAPSHOT


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    """0 unset, 1 ok, 2 error (``opentelemetry.proto.trace.v1.Status.StatusCode``)."""
    status_message: str
    events: tuple[tuple[str, dict[str, Any]], ...]
    resource: dict[str, Any]
    scope: str
    links: tuple[tuple[str, str], ...] = ()
    """(trace id, span id) of each span this one links to."""
    kind: int = 0
    """``opentelemetry.proto.trace.v1.Span.SpanKind``: 1 internal, 2 server."""
    scope_schema_url: str = ""
    parent_is_remote: bool | None = None
    """From the span's flags: whether its parent came from another process (None: not said)."""


def snapshots(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The live snapshots of phases still running (``trt.span.snapshot``)."""
    return [s for s in spans if s.attributes.get(SNAPSHOT) is True]


def final_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The spans a trace keeps once its build has ended: the live snapshots left out."""
    return [s for s in spans if SNAPSHOT not in s.attributes]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind is None:
        return None
    return getattr(value, kind)


_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
"""``SpanFlags``: the span says whether its parent is remote, and whether it is."""


def _parent_is_remote(flags: int) -> bool | None:
    return bool(flags & _IS_REMOTE) if flags & _HAS_IS_REMOTE else None


def decode(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        status_code=span.status.code,
                        status_message=span.status.message,
                        events=tuple(
                            (e.name, {a.key: _value(a.value) for a in e.attributes})
                            for e in span.events
                        ),
                        resource=resource,
                        scope=scope_spans.scope.name,
                        links=tuple(
                            (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                        ),
                        kind=span.kind,
                        scope_schema_url=scope_spans.schema_url,
                        parent_is_remote=_parent_is_remote(span.flags),
                    )
                )
    return spans


@dataclass(frozen=True)
class ReceivedLog:
    time_ns: int
    trace_id: str
    span_id: str
    severity_number: int
    severity_text: str
    body: Any
    attributes: dict[str, Any]
    event_name: str
    resource: dict[str, Any]
    scope: str


def decode_logs(request: logs_service_pb2.ExportLogsServiceRequest) -> list[ReceivedLog]:
    records = []
    for resource_logs in request.resource_logs:
        resource = {a.key: _value(a.value) for a in resource_logs.resource.attributes}
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                records.append(
                    ReceivedLog(
                        time_ns=record.time_unix_nano,
                        trace_id=record.trace_id.hex(),
                        span_id=record.span_id.hex(),
                        severity_number=record.severity_number,
                        severity_text=record.severity_text,
                        body=_value(record.body),
                        attributes={a.key: _value(a.value) for a in record.attributes},
                        event_name=record.event_name,
                        resource=resource,
                        scope=scope_logs.scope.name,
                    )
                )
    return records


@dataclass(frozen=True)
class ReceivedPoint:
    """One data point of a metric: a gauge's or sum's value, a histogram's count and sum."""

    metric: str
    kind: str
    """``gauge``, ``sum`` or ``histogram``."""
    unit: str
    monotonic: bool
    attributes: dict[str, Any]
    value: float
    time_ns: int
    resource: dict[str, Any]
    count: int = 0
    exemplar_trace_ids: tuple[str, ...] = ()
    bounds: tuple[float, ...] = ()
    """A histogram's bucket bounds."""


def decode_metrics(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[ReceivedPoint]:
    points = []
    for resource_metrics in request.resource_metrics:
        resource = {a.key: _value(a.value) for a in resource_metrics.resource.attributes}
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                kind = str(metric.WhichOneof("data"))
                data = getattr(metric, kind)
                for point in data.data_points:
                    attributes = {a.key: _value(a.value) for a in point.attributes}
                    if kind == "histogram":
                        value, count = point.sum, point.count
                    else:
                        value = getattr(point, point.WhichOneof("value"))
                        count = 0
                    points.append(
                        ReceivedPoint(
                            metric=metric.name,
                            kind=kind,
                            unit=metric.unit,
                            monotonic=bool(getattr(data, "is_monotonic", False)),
                            attributes=attributes,
                            value=float(value),
                            time_ns=point.time_unix_nano,
                            resource=resource,
                            count=count,
                            exemplar_trace_ids=tuple(e.trace_id.hex() for e in point.exemplars),
                            bounds=tuple(point.explicit_bounds) if kind == "histogram" else (),
                        )
                    )
    return points


class OtlpReceiver:
    """Collects every span, log record and metric point received, from either protocol,
    thread-safely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._logs: list[ReceivedLog] = []
        self._points: list[ReceivedPoint] = []
        self.requests = 0
        self.metric_requests = 0
        self.grpc_port = 0
        self.http_port = 0

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        received = decode(request)
        with self._lock:
            self.requests += 1
            self._spans.extend(received)

    def add_logs(self, request: logs_service_pb2.ExportLogsServiceRequest) -> None:
        received = decode_logs(request)
        with self._lock:
            self._logs.extend(received)

    def add_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        received = decode_metrics(request)
        with self._lock:
            self.metric_requests += 1
            self._points.extend(received)

    @property
    def logs(self) -> list[ReceivedLog]:
        with self._lock:
            return list(self._logs)

    @property
    def points(self) -> list[ReceivedPoint]:
        with self._lock:
            return list(self._points)

    def wait_for_logs(self, count: int, timeout_s: float = 10.0) -> list[ReceivedLog]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.logs) < count:
            time.sleep(0.05)
        return self.logs

    def wait_for_metric_requests(self, count: int, timeout_s: float = 10.0) -> list[ReceivedPoint]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.metric_requests < count:
            time.sleep(0.05)
        return self.points

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.spans
            if len(spans) >= count:
                return spans
            time.sleep(0.05)
        return self.spans

    def wait_for_final(self, count: int, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        """The final spans (:func:`final_spans`) once ``count`` have come, or those there are
        after ``timeout_s``. A build open longer than 5 s (any build, on a loaded machine) also
        sends live snapshots of its open phases (``--otlp-live``, on by default): a test that
        counts a build's phases counts these."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = final_spans(self.spans)
            if len(spans) >= count:
                return spans
            time.sleep(0.05)
        return final_spans(self.spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def clear_all(self) -> None:
        """Forget every span, log record and metric point received so far."""
        with self._lock:
            self._spans.clear()
            self._logs.clear()
            self._points.clear()
            self.metric_requests = 0


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(  # noqa: N802 - the gRPC method's name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(  # noqa: N802 - the gRPC method's name
        self, request: logs_service_pb2.ExportLogsServiceRequest, context: grpc.ServicerContext
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        self._receiver.add_logs(request)
        return logs_service_pb2.ExportLogsServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(  # noqa: N802 - the gRPC method's name
        self,
        request: metrics_service_pb2.ExportMetricsServiceRequest,
        context: grpc.ServicerContext,
    ) -> metrics_service_pb2.ExportMetricsServiceResponse:
        self._receiver.add_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


def _http_handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    routes: dict[str, tuple[type[Message], Any, Message]] = {
        "/v1/traces": (
            trace_service_pb2.ExportTraceServiceRequest,
            receiver.add,
            trace_service_pb2.ExportTraceServiceResponse(),
        ),
        "/v1/logs": (
            logs_service_pb2.ExportLogsServiceRequest,
            receiver.add_logs,
            logs_service_pb2.ExportLogsServiceResponse(),
        ),
        "/v1/metrics": (
            metrics_service_pb2.ExportMetricsServiceRequest,
            receiver.add_metrics,
            metrics_service_pb2.ExportMetricsServiceResponse(),
        ),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path not in routes:
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(415)
                return
            request_type, add, response = routes[self.path]
            request = request_type()
            request.ParseFromString(body)
            add(request)
            payload = response.SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Both servers on free loopback ports, stopped on exit."""
    receiver = OtlpReceiver()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service = _TraceService(receiver)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, grpc_server)  # type: ignore[no-untyped-call]
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(_LogsService(receiver), grpc_server)  # type: ignore[no-untyped-call]
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
        _MetricsService(receiver), grpc_server
    )
    receiver.grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    http_server = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(receiver))
    receiver.http_port = http_server.server_address[1]
    # Polled every 50 ms, not socketserver's 500: the shutdown below waits for the next poll.
    thread = threading.Thread(
        target=http_server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield receiver
    finally:
        http_server.shutdown()
        http_server.server_close()
        grpc_server.stop(grace=None).wait()


@contextmanager
def hanging_collector() -> Iterator[int]:
    """A port that accepts connections and never answers (a collector that hangs)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            accepted.append(connection)  # held open, never read, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for connection in accepted:
            connection.close()
        listener.close()


def dead_port() -> int:
    """A loopback port with nothing listening (a collector that is down)."""
    return free_port()
