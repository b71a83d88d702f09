"""HTTP calls within a :class:`~trt_otel.core.deadlines.Deadline`, from the connect to the last
byte.

:func:`connection` is an http.client connection whose connect gets what is left of the deadline
and whose socket the deadline guards (the TLS handshake, a proxy's tunnel, the request, the head
and the body alike); :func:`call` is one request through urllib over such connections (the
proxies of the environment honoured unless told otherwise), read whole within the deadline, that
answers every status as it came: a redirect is never followed here, it is the caller's to
refuse. A call past its deadline raises :class:`~trt_otel.core.deadlines.DeadlineExceededError`,
whatever the library made of the shut-down socket.

Imported where a URL is called: http.client brings ssl and email along.
"""

from __future__ import annotations

import base64
import functools
import http.client
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from typing import Any

from trt_otel.core.deadlines import Deadline
from trt_otel.core.urls import credentials

MAX_LOCATION_CHARS = 200
"""The longest redirect target quoted in a message."""


class _Guarded(http.client.HTTPConnection):
    """A connection bounded by ``deadline``: its connect is given no more than what is left, and
    its socket is shut down when the deadline passes."""

    def __init__(self, host: str, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        kwargs["timeout"] = deadline.check()
        super().__init__(host, *args, **kwargs)
        self.deadline = deadline
        # http.client connects (a proxy's tunnel and TLS included) through this attribute.
        self._create_connection = self._connect_within

    def _connect_within(
        self,
        address: tuple[str, int],
        timeout: float | None = None,
        source_address: tuple[str, int] | None = None,
    ) -> socket.socket:
        left = self.deadline.check()
        if isinstance(timeout, int | float):
            left = min(left, timeout)
        sock = socket.create_connection(address, left, source_address)
        self.deadline.guard(sock)
        return sock


class _GuardedHTTPS(_Guarded, http.client.HTTPSConnection):
    """:class:`_Guarded` over TLS: the handshake happens on the guarded socket."""


def connection(url: str, deadline: Deadline) -> http.client.HTTPConnection:
    """A connection (not yet opened) to the host of ``url`` (``http://`` or ``https://``),
    bounded by ``deadline``; the caller sends the request and reads the answer, and closes it."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return _GuardedHTTPS(parts.netloc, deadline=deadline)
    return _Guarded(parts.netloc, deadline=deadline)


@dataclass(frozen=True, slots=True)
class Answer:
    """What a peer answered: its status, reason, headers and (at most the bytes asked for of)
    its body."""

    status: int
    reason: str
    headers: Message
    body: bytes

    def redirect(self) -> str | None:
        """``307 Temporary Redirect, to 'https://...'`` when the answer is a redirect."""
        if not 300 <= self.status < 400:
            return None
        said = f"{self.status} {self.reason}".rstrip()
        location = self.headers.get("Location")
        if location:
            shown = location if len(location) <= MAX_LOCATION_CHARS else location[:197] + "..."
            said += f", to {shown!r}"
        return said


def call(
    request: urllib.request.Request | str,
    deadline: Deadline,
    *,
    max_bytes: int,
    proxies: bool = True,
) -> Answer:
    """Send ``request`` and read its answer (``max_bytes`` of its body at most), all within
    ``deadline``; any status is an answer. ``proxies``: whether the environment's proxy
    variables apply (``http_proxy``, ``no_proxy``, ...), as they do for urllib. Raises
    DeadlineExceededError past the deadline, OSError or http.client.HTTPException otherwise.

    A user and password in the URL (``https://ci:secret@push.example``) go as HTTP basic auth,
    the way curl and prometheus_client's ``basic_auth_handler`` send them; never in the URL."""
    request = _with_credentials_as_header(request)
    handlers: list[urllib.request.BaseHandler] = [
        _HTTPHandler(deadline),
        _HTTPSHandler(deadline),
        _EveryStatus(),
    ]
    if not proxies:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(request, timeout=deadline.check()) as response:
            body = response.read(max_bytes)
            answer = Answer(response.status, response.reason or "", response.headers, body)
    except (OSError, http.client.HTTPException) as error:
        if deadline.passed():
            raise deadline.exceeded() from None
        if isinstance(error, urllib.error.URLError) and isinstance(error.reason, OSError):
            raise error.reason from None  # "[Errno 111] Connection refused", not urllib's wrap
        raise
    if deadline.expired:  # a body cut short at the deadline reads as a shorter one
        raise deadline.exceeded()
    return answer


def _with_credentials_as_header(
    request: urllib.request.Request | str,
) -> urllib.request.Request | str:
    """``request`` with its URL's user and password (if any) moved into an Authorization
    header (http.client would take them for part of the host)."""
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    bare, user, password = credentials(url)
    if user is None and password is None:
        return request
    if isinstance(request, str):
        request = urllib.request.Request(request)
    request.full_url = bare
    pair = f"{user or ''}:{password or ''}".encode()
    request.add_header("Authorization", "Basic " + base64.b64encode(pair).decode("ascii"))
    return request


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_Guarded, deadline=self._deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_GuardedHTTPS, deadline=self._deadline), req)


class _EveryStatus(urllib.request.HTTPErrorProcessor):
    """Every answer is returned as it came: no status raises, no redirect is followed."""

    def http_response(
        self, request: urllib.request.Request, response: http.client.HTTPResponse
    ) -> http.client.HTTPResponse:
        return response

    https_response = http_response
