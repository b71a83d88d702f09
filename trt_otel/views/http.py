"""The HTTP view of a build, for IDEs, services and agents.

- ``GET /``: a live web page of the build (:mod:`trt_otel.views.web`);
- ``GET /status``: the build as JSON (phase tree, progress, elapsed, estimates, outcome);
  ``GET /status.schema.json``: its JSON Schema (:mod:`trt_otel.views.status`);
- ``GET /events``: Server-Sent Events of the event log. Each event's ``id:`` is its ``seq``, so a
  client that reconnects with ``Last-Event-ID`` (or asks ``?since=N``) misses nothing and gets
  nothing twice; a new client gets the build from its first event;
- ``GET /metrics``: the Prometheus projection; ``GET /healthz``: liveness;
- ``POST /cancel`` with ``Authorization: Bearer TOKEN`` and an optional reason (JSON
  ``{"reason": ...}`` or plain text): cancels the build at TensorRT's next step.

Every request must name the server in its ``Host`` header: the address it serves on (an IP
literal, any port), ``localhost``, or a name the user allowed. A web page on another site that
points its own name at this address (DNS rebinding) sends that name, and is answered 421 with
nothing of the build.

Nothing here touches the callbacks: events reach the server through its feed
(:mod:`trt_otel.views.http_feed`), which encodes each one once into an SSE frame; every client
thread reads those frames without taking the log's lock. A slow client only fills its own
socket, and is dropped after a timeout. The ``Host`` check is :mod:`trt_otel.views.http_hosts`'s.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import re
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.events import CancelSource
from trt_otel.core.observed import CancellableBuild
from trt_otel.core.readmodel import ReadModel
from trt_otel.views import web
from trt_otel.views.http_feed import EventFeed
from trt_otel.views.http_hosts import HostCheck
from trt_otel.views.prometheus import exposition
from trt_otel.views.report.live import LiveTimeline
from trt_otel.views.status import StatusDocument, status_document, status_schema

_logger = logging.getLogger(__name__)

MAX_BODY = 4096
MAX_SSE_CLIENTS = 100
KEEPALIVE_S = 15.0
CLIENT_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 256
"""Connections served at once (each on a thread of its own); past it, a connection is
answered 503 and closed, unless it is one of the owner's controls (below)."""
RESERVED_CONNECTIONS = 16
"""Connections kept, past :data:`MAX_CONNECTIONS`, for the owner's controls: ``GET /healthz``
and ``POST /cancel`` are answered while others hold every other slot; any other request that
lands in one is answered 503."""
REQUEST_DEADLINE_S = 10.0
"""A request's line, headers and body must all arrive within this, however slowly they trickle
(a read waits at most :data:`CLIENT_TIMEOUT_S`, and a byte every few seconds would otherwise
hold a slot for ever)."""
RESERVED_DEADLINE_S = 2.0
"""The same for a request in a reserved slot: the owner's controls are short."""
MAX_CONTROL_LINE = 64
"""The longest request line read in a reserved slot (the owner's controls' are short)."""
_CONTROL_LINE = re.compile(rb"((GET|HEAD) /healthz|POST /cancel)[ ?][^\r\n]*\r?\n\Z")
"""The request line of one of the owner's controls, served from a reserved slot."""
_STATUS_ENCODER = msgspec.json.Encoder(enc_hook=str)
"""A build's attributes come from its caller: what JSON has no type for is shown as text."""
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 20\r\n"
    b"Connection: close\r\n\r\ntoo many connections"
)


TIMELINE_HEADERS = {
    # An image: no script runs in it; its own inline style is all it may use.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


# -- the server --------------------------------------------------------------------------------


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, read by a request that must arrive by :attr:`deadline`."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self.deadline: float | None = None
        self._unread = b""

    def readable(self) -> bool:
        return True

    def unread(self, data: bytes) -> None:
        """Give ``data`` (read ahead of the buffered reader above) back, to be read first."""
        self._unread = data + self._unread

    def readinto(self, buffer: Any) -> int:
        if self._unread:
            count = min(len(buffer), len(self._unread))
            buffer[:count] = self._unread[:count]
            self._unread = self._unread[count:]
            return count
        deadline = self.deadline
        if deadline is None:
            return self._connection.recv_into(buffer)
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._connection.settimeout(min(left, CLIENT_TIMEOUT_S))
        try:
            return self._connection.recv_into(buffer)
        finally:  # an answer's writes keep the client timeout
            self._connection.settimeout(CLIENT_TIMEOUT_S)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._reserve = threading.BoundedSemaphore(RESERVED_CONNECTIONS)
        self.reserved: set[Any] = set()
        """The connections in a reserved slot, which serve the owner's controls alone."""
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        # A thread a connection, at most MAX_CONNECTIONS of them: a flood of idle connections
        # (each held up to REQUEST_DEADLINE_S) is answered 503 past that, not given a thread,
        # but for the few kept for the owner's controls.
        if not self._slots.acquire(blocking=False):
            if not self._reserve.acquire(blocking=False):
                with contextlib.suppress(OSError):
                    request.sendall(_TOO_MANY)
                self.shutdown_request(request)
                return
            self.reserved.add(request)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            if request in self.reserved:
                self.reserved.discard(request)
                self._reserve.release()
            else:
                self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away mid-answer is its own business; anything else is logged, not
        # printed over the build's terminal.
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            _logger.debug("HTTP request from %s failed", client_address, exc_info=True)


class StatusServer:
    """Serves one build's HTTP view on ``address:port`` (loopback by default)."""

    def __init__(
        self,
        monitor: CancellableBuild,
        model: ReadModel,
        registry: CollectorRegistry,
        *,
        port: int,
        address: str = "127.0.0.1",
        cancel_token: str,
        allowed_hosts: Sequence[str] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if not cancel_token.strip():
            raise ValueError("the cancel token is empty: POST /cancel would take any request")
        self.monitor = monitor
        self.model = model
        self.registry = registry
        self.timeline = LiveTimeline(model, clock)
        """The build's timeline as ``trt-otel report`` draws it (``/timeline.svg``)."""
        self.feed = EventFeed()
        self.clock = clock
        self.token_file: Path | None = None
        """Where a generated token was written for the owner (removed with the server)."""
        self._token = cancel_token.encode()
        self.hosts = HostCheck(address, allowed_hosts)
        self._sse_clients = 0
        self._clients_lock = threading.Lock()
        self.client_seen = threading.Event()
        """Set by the first request: with no client ever, nobody waits for the final status."""
        self.final_served = threading.Event()
        """Set once a client has been given the build's end (its final status, or the end of
        the event stream): the view need not linger after that."""
        self._server = _Server((address, port), _handler_class(self))
        self.address = address
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            # How long close() waits for the loop to see its shutdown (socketserver's 0.5 s
            # by default, paid at the end of every build that serves this view).
            kwargs={"poll_interval": 0.05},
            name="trt-otel-http",
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def token_matches(self, presented: str) -> bool:
        """Whether ``presented`` is the whole token: compared in constant time, and never
        when empty."""
        if not presented:
            return False
        return hmac.compare_digest(presented.encode(), self._token)

    def enter_sse(self) -> bool:
        with self._clients_lock:
            if self._sse_clients >= MAX_SSE_CLIENTS:
                return False
            self._sse_clients += 1
            return True

    def leave_sse(self) -> None:
        with self._clients_lock:
            self._sse_clients -= 1

    @property
    def sse_clients(self) -> int:
        return self._sse_clients

    def status(self) -> StatusDocument:
        now = self.clock.mono_ns()
        with self.model.reading() as model:
            return status_document(model, model.estimate_locked(now), now)

    def close(self, linger_s: float = 3.0, *, unwatched: bool = False) -> None:
        """Stop serving, after ``linger_s`` at most: streaming clients first get the end of the
        build, and an ended build's final status stays readable (and ``POST /cancel`` answers
        409) until a client has read it, since pollers would rarely catch it otherwise. Only
        when a client came by during the build, unless ``unwatched``: the Prometheus endpoint
        likewise waits only after a real scrape, and a build nobody watched exits at once."""
        watched = unwatched or self.client_seen.is_set()
        deadline = time.monotonic() + (linger_s if watched else 0.0)
        ended = self.monitor.state.outcome is not None
        while time.monotonic() < deadline and (
            self._sse_clients or (ended and not self.final_served.is_set())
        ):
            time.sleep(0.05)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


# Long: the request handler class closes over its server; its methods are short, one an
# endpoint, and read in the order of the endpoints' table in docs/http.md.
def _handler_class(server: StatusServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = CLIENT_TIMEOUT_S  # a client that stalls mid-request or mid-stream is dropped
        server_version = "trt-otel"
        sys_version = ""

        head_only = False
        """A HEAD request: everything a GET would send but the body."""

        def setup(self) -> None:
            super().setup()
            self.rfile.close()  # read through the deadline instead (the socket stays open)
            self._reader = _DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self._reader)
            self._reserved = self.request in self.server.reserved  # type: ignore[attr-defined]

        def handle_one_request(self) -> None:
            budget = RESERVED_DEADLINE_S if self._reserved else REQUEST_DEADLINE_S
            self._reader.deadline = time.monotonic() + budget
            if self._reserved and not self._control_line_ahead():
                return
            super().handle_one_request()

        def _control_line_ahead(self) -> bool:
            """In a reserved slot, whether the request line names one of the owner's controls,
            decided on that line alone, before any header is waited for: a flood of clients
            that send another request line and trickle their headers would otherwise hold the
            reserve for its deadline each. The line is given back to be read as usual."""
            line = bytearray()
            byte = bytearray(1)
            with contextlib.suppress(OSError):  # a client gone, or past its deadline
                while len(line) < MAX_CONTROL_LINE and not line.endswith(b"\n"):
                    if not self._reader.readinto(byte):
                        break
                    line += byte
            if _CONTROL_LINE.match(bytes(line)):
                self._reader.unread(bytes(line))
                return True
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.wfile.write(_TOO_MANY)
            return False

        def _refused_in_reserve(self, control: bool) -> bool:
            """In a reserved slot, only the owner's controls are served, once each."""
            if not self._reserved:
                return False
            self.close_connection = True
            if control:
                return False
            with contextlib.suppress(OSError):
                self.wfile.write(_TOO_MANY)
            return True

        def do_HEAD(self) -> None:
            self.head_only = True
            try:
                self.do_GET()
            finally:
                self.head_only = False  # the connection's next request may be a GET

        def _host_allowed(self) -> bool:
            """Refuse (421) a request that does not name this server: a page of another site
            reaching it through a rebound name. Two Host headers are a bad request (RFC 9112):
            a proxy and this server could each read a different one."""
            hosts = self.headers.get_all("Host") or []
            if len(hosts) > 1:
                self._json(400, {"error": "more than one Host header"})
                self.close_connection = True
                return False
            if server.hosts.accepts(self.headers.get("Host")):
                return True
            self._json(
                421,
                {"error": "this server does not answer to that Host (see --http-allowed-host)"},
            )
            self.close_connection = True
            return False

        def do_GET(self) -> None:
            if self._refused_in_reserve(self.path.partition("?")[0] == "/healthz"):
                return
            if not self._host_allowed():
                return
            server.client_seen.set()
            path, _, query = self.path.partition("?")
            if path == "/status":
                status = server.status()
                self._send(200, "application/json", _STATUS_ENCODER.encode(status))
                if status.outcome is not None and not self.head_only:
                    server.final_served.set()
            elif path == "/status.schema.json":
                self._json(200, status_schema())
            elif path == "/events":
                self._events(urllib.parse.parse_qs(query))
            elif path == "/metrics":  # negotiated as the Prometheus endpoint does
                accept, encoding = self.headers.get("Accept"), self.headers.get("Accept-Encoding")
                self._send(200, *exposition(server.registry, accept, encoding))
            elif path == "/healthz":
                # Read once, before answering: the build may end while the answer is sent,
                # and only an answer that said so has served its end.
                build = server.monitor.state
                build_status, ended = build.status.value, build.outcome is not None
                self._json(200, {"status": "ok", "build": build_status})
                if ended and not self.head_only:
                    server.final_served.set()
            elif path == "/timeline.svg":
                picture = server.timeline.svg().encode("utf-8")
                self._send(200, "image/svg+xml; charset=utf-8", picture, TIMELINE_HEADERS)
            elif path == "/cancel":
                self._json(405, {"error": "use POST"}, {"Allow": "POST"})
            elif (page := web.asset(path)) is not None:
                self._send(200, page.content_type, page.body, web.PAGE_HEADERS)
            else:
                self._json(404, {"error": f"no such resource: {path}"})

        def do_POST(self) -> None:
            if self._refused_in_reserve(self.path.partition("?")[0] == "/cancel"):
                return
            if not self._host_allowed():
                return
            server.client_seen.set()
            path = self.path.partition("?")[0]
            if path == "/status":
                self._json(405, {"error": "use GET"}, {"Allow": "GET"})
                return
            if path != "/cancel":
                self._json(404, {"error": f"no such resource: {path}"})
                return
            self._cancel()

        def _cancel(self) -> None:
            authorization = self.headers.get("Authorization", "")
            scheme, _, token = authorization.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                self._json(
                    401, {"error": "a bearer token is required"}, {"WWW-Authenticate": "Bearer"}
                )
                return
            if not server.token_matches(token):  # the whole value, never a part of it
                self._json(403, {"error": "wrong token"})
                return
            body = self._body()
            if body is None:
                return
            reason = _reason(body, self.headers.get("Content-Type", ""))
            if reason is None:
                self._json(400, {"error": 'the body is a JSON {"reason": "..."} or plain text'})
                return
            monitor = server.monitor
            if monitor.state.outcome is not None:
                self._json(409, {"error": "the build has ended", "outcome": monitor.state.outcome})
                return
            first = monitor.cancel(reason or "cancelled over HTTP", source=CancelSource.HTTP)
            cancel = monitor.state.cancel
            self._json(
                202 if first else 200,
                {
                    "cancelled": True,
                    "first": first,
                    "reason": cancel.reason if cancel is not None else reason,
                },
            )

        def _body(self) -> bytes | None:
            length_text = self.headers.get("Content-Length")
            if length_text is None:
                if self.headers.get("Transfer-Encoding"):
                    self._json(411, {"error": "send a Content-Length"})
                    return None
                return b""
            try:
                length = int(length_text)
            except ValueError:
                self._json(400, {"error": "bad Content-Length"})
                return None
            if length < 0 or length > MAX_BODY:
                self._json(413, {"error": f"bodies are limited to {MAX_BODY} bytes"})
                self.close_connection = True
                return None
            return self.rfile.read(length)

        def _events(self, query: dict[str, list[str]]) -> None:
            since = -1
            since_values = query.get("since") or []
            text = self.headers.get("Last-Event-ID") or (since_values[0] if since_values else None)
            if text is not None:
                try:
                    since = int(text)
                except ValueError:
                    self._json(400, {"error": f"not an event id: {text[:40]!r}"})
                    return
            if self.head_only:
                self._send(200, "text/event-stream", b"", {"Cache-Control": "no-cache"})
                return
            if not server.enter_sse():
                self._json(503, {"error": "too many event streams"}, {"Retry-After": "5"})
                return
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("X-Accel-Buffering", "no")
                self.end_headers()
                self._stream(since)
            except OSError:
                pass  # the client went away
            finally:
                server.leave_sse()
                self.close_connection = True

        def _stream(self, since: int) -> None:
            self.wfile.write(b"retry: 1000\n\n")
            while True:
                first, frames, over = server.feed.frames_after(since, KEEPALIVE_S)
                if first > since + 1:  # older events are no longer held: say so, go on
                    gap = {"requested_after": since, "first_available": first}
                    self.wfile.write(f"event: gap\ndata: {json.dumps(gap)}\n\n".encode())
                if frames:
                    self.wfile.write(b"".join(frames))
                    since = first + len(frames) - 1
                elif not over:
                    self.wfile.write(b": keepalive\n\n")
                self.wfile.flush()
                if over:
                    server.final_served.set()
                    return

        def _json(self, status: int, document: Any, headers: dict[str, str] | None = None) -> None:
            body = json.dumps(document, default=str).encode()
            self._send(status, "application/json", body, headers)

        def _send(
            self,
            status: int,
            content_type: str,
            body: bytes,
            headers: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if not self.head_only:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are not the build's business; errors reach the client

    return Handler


def _reason(body: bytes, content_type: str) -> str | None:
    """The cancel reason in a request body: "" for none, None when the body is unreadable."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return ""
    if "json" in content_type or text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            return None
        if not isinstance(document, dict) or not isinstance(document.get("reason", ""), str):
            return None
        return str(document.get("reason", "")).strip()[:200]
    return text.splitlines()[0][:200]
