"""OTLP over HTTP, counted as accepted only when the collector answers with a 2xx.

The SDK's HTTP exporters send without following redirects, and take any status under 400 as the
collector's acceptance: behind an http-to-https ingress (a 301, 302, 307 or 308), every span and
record was counted exported while none reached a collector. OTLP/HTTP's success is a 2xx answer,
so the exporters send through :class:`AcceptedOn2xx`, a ``requests`` session that turns any
other answer the SDK would take for a success into an error of the request: the export fails
(it is not retried: a redirect answers the same the next time), it is counted as failed, and
what the collector answered is kept (:attr:`AcceptedOn2xx.refusal`) for the warning.

``requests`` bounds each read, not a request: a collector (or a proxy) that drips its answer held
an export, and its thread, for as long as it dripped. The session gives each request one deadline
(:mod:`~trt_otel.core.deadlines`) of the time the SDK allows it (what is left of the export's
timeout), connect, request, head and body together: its connections, made by
:class:`_BoundedAdapter`'s pools, hand their sockets to the deadline applied on the thread, and a
request past it fails as a timeout (which the SDK does not retry past its own deadline).
Imported only where an OTLP/HTTP exporter is made.
"""

from __future__ import annotations

import socket
from typing import Any

import requests
import requests.adapters
import urllib3.connection
import urllib3.connectionpool

from trt_otel.core import deadlines
from trt_otel.core.deadlines import Deadline

MAX_LOCATION_CHARS = 200
"""The longest redirect target quoted in a warning."""


class NotAccepted(requests.RequestException):
    """An answer outside 2xx that the SDK would have counted as accepted."""


class AcceptedOn2xx(requests.Session):
    """A session whose answers outside 2xx and under 400 (a redirect) raise
    :class:`NotAccepted`; answers of 400 and over are left to the SDK (which retries a 429 or a
    503)."""

    def __init__(self) -> None:
        super().__init__()
        self.refusal: str | None = None
        """What the collector answered, the last time it answered with no 2xx under 400."""
        adapter = _BoundedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        total_s = _total_s(kwargs.get("timeout"))
        if total_s is None:  # no timeout asked for: none imposed
            return self._accepted(super().send(request, **kwargs))
        # Not streamed, the body is read inside send: the deadline covers it too.
        kwargs["stream"] = False
        with Deadline(total_s) as deadline, deadline.applied():
            try:
                response = super().send(request, **kwargs)
            except requests.RequestException:
                if deadline.passed():  # requests' own read timeout may have noticed first
                    raise requests.Timeout(str(deadline.exceeded()), request=request) from None
                raise
            if deadline.expired:  # a body cut short at the deadline reads as a shorter one
                response.close()
                raise requests.Timeout(str(deadline.exceeded()), request=request)
        return self._accepted(response)

    def _accepted(self, response: requests.Response) -> requests.Response:
        status = response.status_code
        if 200 <= status < 300 or status >= 400:
            return response
        response.close()
        self.refusal = refusal_of(response)
        raise NotAccepted(self.refusal, response=response)


def _total_s(timeout: object) -> float | None:
    """The seconds a request may take in all, from ``requests``' ``timeout`` (a number, a
    (connect, read) pair, or None)."""
    if isinstance(timeout, int | float):
        return float(timeout)
    if isinstance(timeout, tuple) and all(isinstance(t, int | float) for t in timeout):
        return float(sum(timeout))
    return None


class _Guarded(urllib3.connection.HTTPConnection):
    """A connection whose socket the deadline applied on the thread guards: a new one as it is
    made (before TLS), a pooled one as a request starts on it."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _guard(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None:
            _guard(self.sock)
        super().request(*args, **kwargs)


class _GuardedHTTPS(_Guarded, urllib3.connection.HTTPSConnection):
    pass


def _guard(sock: socket.socket) -> None:
    deadline = deadlines.current()
    if deadline is not None:
        deadline.guard(sock)


class _Pool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _Guarded


class _HTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPS


_POOLS = {"http": _Pool, "https": _HTTPSPool}


class _BoundedAdapter(requests.adapters.HTTPAdapter):
    """``requests``' adapter, whose pools (direct, or through an HTTP proxy) make
    :class:`_Guarded` connections. A SOCKS proxy's connections are its own: bounded per read."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = _POOLS
        return manager


def refusal_of(response: requests.Response) -> str:
    """``the collector answered 307 Temporary Redirect, to https://...``, with what to do."""
    answered = f"the collector answered {response.status_code} {response.reason or ''}".rstrip()
    location = response.headers.get("Location")
    if not 300 <= response.status_code < 400:
        return f"{answered}, not a 2xx"
    if location:
        shown = location if len(location) <= MAX_LOCATION_CHARS else location[:197] + "..."
        answered += f", to {shown!r}"
    return f"{answered}: an OTLP export is not redirected; give the endpoint it names"
