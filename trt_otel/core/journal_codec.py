"""The journal's format and codec: what its lines are, and how an event becomes one and back.

Format (version 1), one JSON object per line, UTF-8:

* line 1, the header: ``{"format": "trt-otel-journal", "version": 1, "created_wall_ns": N,
  "producer": "trt-otel X.Y.Z", "writer_pid": N, "writer_host": "...", "touch_interval_s": 10,
  "checked": true}`` (the writer's fields let ``watch`` tell a silent build from a lost one, and
  while open the writer touches the file every ``touch_interval_s``; ``checked`` says whether
  the callbacks were checked against TensorRT's protocol as they were recorded, see
  :data:`CHECKED_FIELD`; readers ignore keys they do not know, so adding them needed no new
  version)
* every other line, one event: ``type`` (``build_start``, ``phase_start``, ``step``,
  ``phase_finish``, ``cancel``, ``anomaly``, ``log``, ``build_end``, ``gpu``), ``seq``,
  ``wall_ns``, ``mono_ns``, ``thread``, then the fields of that event type (see
  :mod:`trt_otel.core.events`). Keys may come in any order; unknown keys are ignored.

The codec is ``msgspec``'s, driven by the event structs themselves: a batch is encoded in one
call, and a line decodes straight into its event with every field's type checked, so a line
with ``"step": "3"`` is a corrupt line, never a wrong event or a crash.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from trt_otel.core.events import (
    EVENT_TYPES,
    Anomaly,
    BuildFinished,
    BuildOutput,
    BuildStarted,
    CancelRequested,
    Event,
    GpuSample,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)

FORMAT_NAME = "trt-otel-journal"


FORMAT_VERSION = 1


CHECKED_FIELD = "checked"
"""The header's word on the journal's callbacks. ``false``: recorded as they came, not checked
against TensorRT's protocol (the C++ monitor records only), so every reader takes them through
the one way in, which finds the anomalies and numbers the events as a Python build's (see
:mod:`trt_otel.capture.checked`). ``true``, or absent (every journal written before the field
was, the C++ monitor's of then included, which checked them itself): the events are the checked
ones, read as they are, never checked twice."""


AnyEvent = (
    BuildStarted
    | PhaseStarted
    | StepCompleted
    | PhaseFinished
    | CancelRequested
    | Anomaly
    | LogMessage
    | BuildFinished
    | GpuSample
    | ProcessSample
    | BuildOutput
)
"""Every event type, as the decoder tells them apart (by their ``type`` tag)."""


_ENCODER = msgspec.json.Encoder(enc_hook=str)
"""``enc_hook``: a build attribute that is not JSON (a path, say) is written as its text rather
than failing the batch."""


DECODER = msgspec.json.Decoder(AnyEvent)


class JournalError(Exception):
    """A journal that cannot be read at all (missing, not a journal, a newer version)."""


class CorruptLineError(ValueError):
    """A line that is not an event; ``kind`` is ``corrupt_line`` or ``unknown_type``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def encode_events(events: Sequence[Event]) -> bytes:
    """Journal lines for ``events``, each ending in a newline, in one call."""
    return _ENCODER.encode_lines(events)


def encode_event(event: Event) -> bytes:
    """One event's JSON object (no newline): a journal line, an SSE frame's data."""
    return _ENCODER.encode(event)


def event_to_dict(event: Event) -> dict[str, Any]:
    """The journal's JSON object for one event, as Python values (enumerations as strings)."""
    record: dict[str, Any] = msgspec.to_builtins(event)
    return record


def decode_event(raw: bytes | str) -> Event:
    """The event one journal line (or SSE frame) describes; raises :class:`CorruptLineError`."""
    try:
        event: Event = DECODER.decode(raw)
    except msgspec.ValidationError as error:
        raise CorruptLineError(*_classify(raw, error)) from None
    except msgspec.DecodeError as error:
        raise CorruptLineError("corrupt_line", f"corrupt line: {error}") from None
    except RecursionError:
        raise CorruptLineError("corrupt_line", "corrupt line: nested too deeply") from None
    return event


def _classify(raw: bytes | str, error: msgspec.ValidationError) -> tuple[str, str]:
    """Why a well-formed JSON line is not an event: a type this version does not know (from a
    newer writer: skipped, and said so) or a field of the wrong type or missing."""
    try:
        record = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        record = None
    if isinstance(record, dict) and "type" in record and record["type"] not in EVENT_TYPES:
        return "unknown_type", f"unknown event type {record['type']!r}"
    return "corrupt_line", f"corrupt line: {error}"
