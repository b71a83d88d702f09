"""A real OTLP trace receiver for the tests: gRPC and HTTP/protobuf, decoding the wire protocol.

It speaks what Jaeger and the OpenTelemetry Collector accept: ``TraceService/Export`` over gRPC
and ``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest`` body (gzip or not) over
HTTP. Received spans are decoded into plain :class:`ReceivedSpan` records.
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
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from prometheus_server import free_port


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
    kind: int = 0
    """``opentelemetry.proto.trace.v1.Span.SpanKind``: 1 internal, 2 server."""
    scope_schema_url: str = ""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind is None:
        return None
    return getattr(value, kind)


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
                        kind=span.kind,
                        scope_schema_url=scope_spans.schema_url,
                    )
                )
    return spans


class OtlpReceiver:
    """Collects every span received, from either protocol, thread-safely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.grpc_port = 0
        self.http_port = 0

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        received = decode(request)
        with self._lock:
            self.requests += 1
            self._spans.extend(received)

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

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self._receiver = receiver

    def Export(  # noqa: N802 - the gRPC method's name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._receiver.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def _http_handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(415)
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
            receiver.add(request)
            payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
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
    receiver.grpc_port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    http_server = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(receiver))
    receiver.http_port = http_server.server_address[1]
    thread = threading.Thread(target=http_server.serve_forever, daemon=True)
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
