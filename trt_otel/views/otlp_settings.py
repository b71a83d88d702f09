"""Where OTLP exports go, as typed settings: resolved from options and ``OTEL_*`` variables,
checked before anything starts. Apart from the exports themselves (:mod:`~trt_otel.views.otlp`)
so that reading a command's options imports none of OpenTelemetry's SDK: a build that exports
nothing never pays for it."""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

DEFAULT_LOGS_LEVEL = "warning"
"""The least severe of the builder's messages exported as log records, by default."""
DEFAULT_SPAN_BUDGET = 10_000
"""Spans exported per build at most: past it, short leaves are folded into their parent."""
DEFAULT_FOLD_UNDER_NS = 1_000_000_000
"""Leaves shorter than this are folded first when a build would pass the budget."""


if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from trt_otel.views.otlp_http import AcceptedOn2xx

GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
PROTOCOLS = (GRPC, HTTP_PROTOBUF)
DEFAULT_REQUEST_TIMEOUT_S = 5.0
TRACES = "traces"
LOGS = "logs"
METRICS = "metrics"
TRACES_PATH = f"/v1/{TRACES}"

Warn = Callable[[str], None]


class OtlpConfigError(ValueError):
    """An OTLP setting (option or ``OTEL_*`` variable) that cannot work."""


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    """Where and how spans go. ``endpoint`` is the full URL for HTTP, ``host:port`` for gRPC."""

    endpoint: str
    protocol: str
    request_timeout_s: float | None
    """None leaves the exporter to ``OTEL_EXPORTER_OTLP_TIMEOUT``."""
    span_budget: int = DEFAULT_SPAN_BUDGET
    fold_under_ns: int = DEFAULT_FOLD_UNDER_NS
    logs_level: str | None = None
    """The least severe builder message exported as a log record, None when none is: such
    messages keep their phase's span from being folded, and are no span events."""

    @classmethod
    def resolve(
        cls,
        endpoint: str | None = None,
        protocol: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        span_budget: int = DEFAULT_SPAN_BUDGET,
        fold_under_ns: int = DEFAULT_FOLD_UNDER_NS,
        signal: str = TRACES,
        logs_level: str | None = None,
    ) -> OtlpSettings | None:
        """Settings from the options and the environment; None when the ``signal`` (``traces``,
        ``logs`` or ``metrics``) is not wanted (no endpoint anywhere, ``OTEL_SDK_DISABLED=true``
        or ``OTEL_TRACES_EXPORTER=none``, ``OTEL_LOGS_EXPORTER``, ...). The signal's own
        variables (``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT``) win over the general ones."""
        env = os.environ if environ is None else environ
        upper = signal.upper()
        if endpoint is None:
            if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
                return None
            if env.get(f"OTEL_{upper}_EXPORTER", "").strip().lower() == "none":
                return None
        signal_endpoint = env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT", "").strip()
        base_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        if endpoint is not None:
            url, is_signal_url, origin = endpoint.strip(), False, "--otlp-endpoint"
        elif signal_endpoint:
            url, is_signal_url = signal_endpoint, True
            origin = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
        elif base_endpoint:
            url, is_signal_url, origin = base_endpoint, False, "OTEL_EXPORTER_OTLP_ENDPOINT"
        else:
            return None
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as error:  # "http://[::1": an unclosed IPv6 address, a bad port
            raise OtlpConfigError(f"{origin} {url!r} is not a valid URL ({error})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OtlpConfigError(f"{origin} {url!r} is not an http:// or https:// URL")
        chosen = (
            protocol
            or env.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL", "").strip()
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        )
        if not chosen:
            # The specification's default is http/protobuf; 4317 is the registered gRPC port,
            # where an HTTP request would only fail.
            chosen = GRPC if port == 4317 else HTTP_PROTOBUF
        if chosen not in PROTOCOLS:
            raise OtlpConfigError(
                f"OTLP protocol {chosen!r} is not supported; use {' or '.join(PROTOCOLS)}"
            )
        if chosen == HTTP_PROTOBUF and not is_signal_url:
            url = url.rstrip("/") + f"/v1/{signal}"
        timeout_variables = ("OTEL_EXPORTER_OTLP_TIMEOUT", f"OTEL_EXPORTER_OTLP_{upper}_TIMEOUT")
        timeout_set = any(env.get(name) for name in timeout_variables)
        return cls(
            endpoint=url,
            protocol=chosen,
            request_timeout_s=None if timeout_set else DEFAULT_REQUEST_TIMEOUT_S,
            span_budget=span_budget,
            fold_under_ns=fold_under_ns,
            logs_level=logs_level,
        )

    def http_session(self) -> AcceptedOn2xx | None:
        """The session an export to these settings sends through (what the collector answered
        to an export it did not accept is kept there); None over gRPC."""
        if self.protocol != HTTP_PROTOBUF:
            return None
        from trt_otel.views.otlp_http import AcceptedOn2xx

        return AcceptedOn2xx()

    def make_exporter(self, session: AcceptedOn2xx | None = None) -> SpanExporter:
        """The SDK's exporter for these settings; over HTTP, one that counts only a 2xx answer
        as accepted, through ``session`` (a new one when None)."""
        if self.protocol == GRPC:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )

            return GrpcSpanExporter(endpoint=self.endpoint, timeout=self.request_timeout_s)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        from trt_otel.views.otlp_http import AcceptedOn2xx

        return HttpSpanExporter(
            endpoint=self.endpoint,
            timeout=self.request_timeout_s,
            session=AcceptedOn2xx() if session is None else session,
        )


# -- export queue ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanExportHealth:
    exported: int
    dropped: int
    """Spans that found the queue full, or were still queued when the flush deadline passed."""
    failed: int
    """Spans in batches the collector did not accept."""
    queued: int
    last_error: str | None


def unreachable_because(endpoint: str, timeout_s: float = 1.0) -> str | None:
    """Why the collector at ``endpoint`` (a URL or ``host:port``) cannot be reached, or None
    when a connection opens. The SDK's exporters answer only SUCCESS or FAILURE; this says
    which of the usual reasons it was, without reading their log."""
    parts = urllib.parse.urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    host = parts.hostname or "localhost"
    port: int | str = "?"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as error:
        return f"cannot resolve {host} ({error.strerror})"
    except TimeoutError:
        return f"no answer from {host}:{port} within {timeout_s:g}s"
    except (OSError, ValueError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        return f"cannot connect to {host}:{port} ({reason})"
