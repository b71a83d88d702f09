"""The ids of a build's trace and spans: pure functions of the build's id (and of the traced job
it joined, from ``TRACEPARENT``), so a build id found in a journal, a metric's exemplar or a log
record finds its trace, and a retry's span can link to the attempt before it from its id alone.

Apart from the span projection (:mod:`trt_otel.views.spans`) because the metrics and the session
need them for every build, and the projection and OpenTelemetry only where spans are exported.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

TRACEPARENT_ATTRIBUTE = "trace.parent"
"""The build attribute holding the W3C ``traceparent`` of the job that started the build."""


@dataclass(frozen=True, slots=True)
class RemoteParent:
    """The span of the job that started the build (from ``TRACEPARENT``)."""

    trace_id: int
    span_id: int
    sampled: bool


def parse_traceparent(value: str) -> RemoteParent | None:
    """A W3C ``traceparent`` header value, or None when it is not a valid one (read by the
    OpenTelemetry API's own propagator, so the rules are the specification's)."""
    if not value:
        return None  # most builds: no traced job, and no need to import the propagator
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": value})
    span = get_current_span(context).get_span_context()
    if not span.is_valid:
        return None
    return RemoteParent(
        trace_id=span.trace_id, span_id=span.span_id, sampled=span.trace_flags.sampled
    )


def trace_id_for(build_id: str, remote: RemoteParent | None = None) -> int:
    """The build's trace id: the traced job's when there is one, else the build id itself
    (a UUID's 128 bits), so a build id found in a journal or a metric finds its trace."""
    if remote is not None:
        return remote.trace_id
    if len(build_id) == 32 and all(c in "0123456789abcdef" for c in build_id):
        return int(build_id, 16) or 1
    return derived_id(128, build_id)


def build_span_context(build_id: str, remote: RemoteParent | None = None) -> tuple[int, int]:
    """The (trace id, span id) of a build's own span: a pure function of its id (and of the
    traced job it joined), so a later attempt can link to it from the id alone."""
    trace_id = trace_id_for(build_id, remote)
    return trace_id, derived_id(64, trace_id, build_id, "build")


def derived_id(bits: int, *parts: object) -> int:
    """A non-zero id of ``bits`` bits, a pure function of ``parts``."""
    return _id_of(hashlib.blake2b(_joined(parts), digest_size=bits // 8))


def _joined(parts: tuple[object, ...]) -> bytes:
    """What :func:`derived_id` hashes: the parts, ``/`` between them."""
    return "/".join(str(part) for part in parts).encode()


def _id_of(digest: hashlib.blake2b) -> int:
    """The id a hash gives: its digest as an integer, never 0."""
    value = int.from_bytes(digest.digest(), "big")
    return value or 1


def build_span_id(trace_id: int, build_id: str) -> int:
    """The span id of the build's own span."""
    return derived_id(64, trace_id, build_id, "build")


def phase_span_id(trace_id: int, build_id: str, phase_id: int) -> int:
    """The span id of a phase's span (the phase's id is its ``phase_start``'s seq)."""
    return derived_id(64, trace_id, build_id, phase_id)


class PhaseSpanIds:
    """The span ids of one build's phases (:func:`phase_span_id`), with the part of the hash
    that is the build's taken once: a build can close a span for each of 10,000 phases."""

    __slots__ = ("_build",)

    def __init__(self, trace_id: int, build_id: str) -> None:
        # derived_id(64, trace_id, build_id, phase_id) hashes "trace/build/phase": all of it
        # but the phase's id, hashed here once.
        self._build = hashlib.blake2b(_joined((trace_id, build_id, "")), digest_size=8)

    def __call__(self, phase_id: int) -> int:
        digest = self._build.copy()
        digest.update(str(phase_id).encode())
        return _id_of(digest)


def build_trace_id(attributes: dict[str, Any], build_id: str) -> tuple[int, RemoteParent | None]:
    """The build's trace id from its ``build_start`` attributes, and the traced job it joins."""
    remote = parse_traceparent(str(attributes.get(TRACEPARENT_ATTRIBUTE, "")))
    return trace_id_for(build_id, remote), remote
