"""OTLP over HTTP, counted as accepted only when the collector answers with a 2xx.

The SDK's HTTP exporters send without following redirects, and take any status under 400 as the
collector's acceptance: behind an http-to-https ingress (a 301, 302, 307 or 308), every span and
record was counted exported while none reached a collector. OTLP/HTTP's success is a 2xx answer,
so the exporters send through :class:`AcceptedOn2xx`, a ``requests`` session that turns any
other answer the SDK would take for a success into an error of the request: the export fails
(it is not retried: a redirect answers the same the next time), it is counted as failed, and
what the collector answered is kept (:attr:`AcceptedOn2xx.refusal`) for the warning. Imported
only where an OTLP/HTTP exporter is made.
"""

from __future__ import annotations

from typing import Any

import requests

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

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        response = super().send(request, **kwargs)
        status = response.status_code
        if 200 <= status < 300 or status >= 400:
            return response
        response.close()
        self.refusal = refusal_of(response)
        raise NotAccepted(self.refusal, response=response)


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
