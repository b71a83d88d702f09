"""Attempts of a retried build: what a build's ``build_start`` says of the attempt it is.

A retry ladder (``--retry``) makes each attempt a build of its own, with its own id, in one
journal; the attempt after the first names, in its ``build_start`` attributes, its number, the
build id of the attempt before it and why that one was retried. Every view reads them here:
the span links the attempt to the previous attempt's span (OpenTelemetry's way for a retry),
``/status``, ``replay`` and the MCP tools show them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ATTEMPT = "trt.attempt"
"""The attempt's number, from 1 (only a ladder's builds carry it)."""
ATTEMPTS = "trt.attempts"
"""How many attempts the ladder has at most."""
PREVIOUS_BUILD_ID = "trt.retry.previous_build_id"
RETRY_REASON = "trt.retry.reason"
"""Why the previous attempt was retried: its outcome and reason."""
RUNG = "trt.retry.options"
"""The options this attempt laid over the first attempt's (none on the first)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int
    of: int
    previous_build_id: str | None
    retry_reason: str | None
    options: str | None


def attempt_of(attributes: Mapping[str, Any]) -> Attempt | None:
    """The attempt a build's attributes describe, or None for a build outside a ladder (or
    attributes that do not hold together: they come from a file)."""
    number, of = attributes.get(ATTEMPT), attributes.get(ATTEMPTS)
    if type(number) is not int or type(of) is not int or not 1 <= number <= of:
        return None  # a bool is no number, nor a text, nor a float
    previous = attributes.get(PREVIOUS_BUILD_ID)
    reason = attributes.get(RETRY_REASON)
    options = attributes.get(RUNG)
    return Attempt(
        number,
        of,
        previous if isinstance(previous, str) and number > 1 else None,
        reason if isinstance(reason, str) else None,
        options if isinstance(options, str) else None,
    )
