"""The peers the soak (``soak.py``) points builds at, each a real server on the loopback: sinks
that are dead, that drip their answer a byte at a time, that redirect, and hostile clients of a
build's own HTTP view."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

DRIP_EVERY_S = 0.5
"""How often a dripping peer sends its next byte: slower than any deadline trt-otel keeps."""


def dead_url() -> str:
    """A URL where nothing listens: a port bound, then let go."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class Peer:
    """A server on the loopback answering every connection on a thread of its own."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"soak-{self.kind}", daemon=True)
        self._thread.start()

    kind = "peer"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve_closing, args=(client,), daemon=True).start()

    def _serve_closing(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            client.settimeout(5)
            self.serve(client)

    def serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        self._thread.join(5)


def _read_request(client: socket.socket) -> None:
    """The request's head and as much of its body as it says it has (bounded)."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 1 << 20:
        chunk = client.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value.strip())
    left = min(length, 1 << 24) - len(body)
    while left > 0:
        chunk = client.recv(min(left, 65536))
        if not chunk:
            return
        left -= len(chunk)


class Dripping(Peer):
    """Answers each request a byte every :data:`DRIP_EVERY_S`, for as long as it is read."""

    kind = "dripping"

    def serve(self, client: socket.socket) -> None:
        _read_request(client)
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        for index in range(len(answer) * 1000):
            if self._closed.is_set():
                return
            client.sendall(answer[index % len(answer) : index % len(answer) + 1])
            time.sleep(DRIP_EVERY_S)


class Redirecting(Peer):
    """Answers every request with a 307 to a collector elsewhere (an http-to-https ingress)."""

    kind = "redirecting"

    def serve(self, client: socket.socket) -> None:
        _read_request(client)
        client.sendall(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: https://collector.example/\r\n"
            b"Content-Length: 0\r\nConnection: close\r\n\r\n"
        )


SINK_KINDS = ("dead", "dripping", "redirecting")


@contextlib.contextmanager
def sink(kind: str) -> Iterator[str]:
    """The URL of a sink of ``kind`` (one of :data:`SINK_KINDS`) for as long as it is used."""
    if kind == "dead":
        yield dead_url()
        return
    peer: Peer = Dripping() if kind == "dripping" else Redirecting()
    try:
        yield peer.url
    finally:
        peer.close()


@dataclass
class Hostility:
    """What the hostile clients of one build's HTTP view saw."""

    healthz_asked: int = 0
    healthz_answered: int = 0
    refused: list[tuple[str, int]] = field(default_factory=list)
    """What each refusal was (with its time since the clients began), and when: the monotonic
    clock's nanoseconds, which the journal's ``mono_ns`` are on."""

    def refused_before(self, mono_ns: int) -> list[str]:
        """The refusals before ``mono_ns`` (the build's end: the view closes after it)."""
        return [what for what, at_ns in self.refused if at_ns < mono_ns]


@contextlib.contextmanager
def hostile_clients(
    host: str, port: int, alive: Callable[[], bool], trickling: int = 300
) -> Iterator[Hostility]:
    """Clients that hold the HTTP view's connections (``trickling`` of them send their headers
    a byte every :data:`DRIP_EVERY_S`, some send garbage, one a 1 MiB header), and one that
    asks ``GET /healthz`` all along: the owner's controls must stay answered."""
    seen = Hostility()
    stop = threading.Event()
    began_ns = time.monotonic_ns()
    held: list[socket.socket] = []

    def trickle() -> None:
        for _ in range(trickling):
            with contextlib.suppress(OSError):
                sock = socket.create_connection((host, port), timeout=2)
                sock.sendall(b"GET /status HTTP/1.1\r\n")
                held.append(sock)
        head = b"X-Slow: " + b"a" * 10_000
        for index in range(len(head)):
            if stop.wait(DRIP_EVERY_S):
                return
            for sock in list(held):
                with contextlib.suppress(OSError):
                    sock.send(head[index : index + 1])

    def garbage() -> None:
        payloads = [b"\x00\xff" * 512, b"GET /" + b"A" * (1 << 20) + b" HTTP/1.1\r\n\r\n",
                    b"POST /cancel HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nx",
                    b"GET /status HTTP/1.1\r\nHost: evil.example\r\n\r\n"]  # fmt: skip
        while not stop.is_set():
            for payload in payloads:
                with contextlib.suppress(OSError), socket.create_connection((host, port), 2) as s:
                    s.sendall(payload)
                    s.recv(4096)
            stop.wait(0.5)

    def refused(what: str) -> None:
        now_ns = time.monotonic_ns()
        seen.refused.append((f"{what} at {(now_ns - began_ns) / 1e9:.1f}s", now_ns))

    def healthz() -> None:
        while not stop.wait(1.0):
            seen.healthz_asked += 1
            connection = http.client.HTTPConnection(host, port, timeout=3)
            try:
                connection.request("GET", "/healthz")
                answer = connection.getresponse()
                if answer.status == 200:
                    seen.healthz_answered += 1
                else:
                    refused(f"HTTP {answer.status}")
            except (OSError, http.client.HTTPException) as error:
                if alive():  # not a build whose process has ended
                    refused(type(error).__name__)
            finally:
                connection.close()

    threads = [threading.Thread(target=target, daemon=True) for target in (trickle, garbage)]
    threads.append(threading.Thread(target=healthz, daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield seen
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        for sock in held:
            sock.close()
