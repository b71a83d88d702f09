"""Peers that drip: real TCP servers that accept a request, then send their answer one byte every
``drip_s`` (half a second by default), for as long as they are read. Every read of the client
waits less than any socket timeout, so only a deadline on the whole call ends it.

Where the drip is (``where``):

- ``headers``: an HTTP answer's head (``HTTP/1.1 200 OK``, then a header that never ends);
- ``body``: a whole head announcing 100,000 bytes, then the body a byte at a time;
- ``tls``: a TLS record's header announcing a 16 KiB handshake, then its bytes (a client's TLS
  handshake never completes);
- ``mute``: nothing at all (it accepts, reads the request, and never answers).
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

HEADS = {
    "headers": (b"", b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Padding: "),
    "body": (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n", b""),
    "tls": (b"", b"\x16\x03\x03\x40\x00"),
    "mute": (b"", b""),
}
"""Per place: what is sent at once, then what is dripped before the filler bytes."""


class DripServer:
    """See the module. ``url``: ``http://`` (``https://`` for ``tls``) to its port;
    ``requests``: connections accepted; ``served_s``: how long each was dripped to."""

    def __init__(self, where: str = "headers", drip_s: float = 0.5) -> None:
        self.where, self.drip_s = where, drip_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        scheme = "https" if where == "tls" else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.requests = 0
        self.served_s: list[float] = []
        self.stopping = threading.Event()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._accept, name="drip-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.requests += 1
            self._connections.append(connection)
            threading.Thread(
                target=self._drip, args=(connection,), name="drip", daemon=True
            ).start()

    def _drip(self, connection: socket.socket) -> None:
        began = time.monotonic()
        at_once, dripped = HEADS[self.where]
        try:
            if self.where != "tls":
                connection.recv(65536)  # the request (its start: enough to answer)
            if at_once:
                connection.sendall(at_once)
            for index in range(1_000_000):
                if self.stopping.wait(self.drip_s):
                    return
                if self.where == "mute":
                    continue
                connection.sendall(dripped[index : index + 1] or b" ")
        except OSError:
            return  # the client gave up: what is measured
        finally:
            self.served_s.append(time.monotonic() - began)

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        for connection in self._connections:
            connection.close()


@contextmanager
def dripping(where: str = "headers", drip_s: float = 0.5) -> Iterator[DripServer]:
    server = DripServer(where, drip_s)
    try:
        yield server
    finally:
        server.close()


DRIPPED_HEAD = b"HTTP/1.1 200 OK\r\nX-Padding: " + b"a" * 100_000
"""An answer's head that never ends, for a handler to drip."""


def drip_head(wfile: io.BufferedIOBase, stopping: threading.Event, drip_s: float = 0.5) -> None:
    """Write :data:`DRIPPED_HEAD` a byte every ``drip_s`` until ``stopping`` or the client goes
    (from an ``http.server`` handler that answered some requests whole)."""
    for byte in DRIPPED_HEAD:
        if stopping.wait(drip_s):
            return
        try:
            wfile.write(bytes([byte]))
            wfile.flush()
        except OSError:
            return
