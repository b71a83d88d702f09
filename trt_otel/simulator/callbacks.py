"""A build's callbacks as data: what the simulator replays, read from traces and journals.

Two formats are read: the recorded TensorRT traces (one ``{"cb": "phase_start" | "step_complete"
| "phase_finish", ...}`` object per line, no timestamps) and trt-otel's own journal, whose
monotonic timestamps become the delays between callbacks. Both are read as bytes and decoded
by ``msgspec`` with every field's type checked: a binary file, a wrong type or a line nested too
deeply is a :class:`TraceError` naming the line, never a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

from trt_otel.events import PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.journal import JournalError, is_journal_header, read_journal

CallbackKind = Literal["phase_start", "step_complete", "phase_finish"]


class TraceError(ValueError):
    """A trace file that cannot be replayed."""


@dataclass(frozen=True, slots=True)
class Callback:
    """One call TensorRT makes on its progress monitor.

    ``delay_s`` is the builder's work before this call (``None``: let the time model decide).
    """

    kind: CallbackKind
    name: str
    parent: str | None = None
    num_steps: int = 0
    step: int = 0
    delay_s: float | None = None


class _TracePhaseStart(msgspec.Struct, tag_field="cb", tag="phase_start"):
    phase_name: str
    parent_phase: str | None
    num_steps: int


class _TraceStep(msgspec.Struct, tag_field="cb", tag="step_complete"):
    phase_name: str
    step: int


class _TracePhaseFinish(msgspec.Struct, tag_field="cb", tag="phase_finish"):
    phase_name: str


_TRACE_LINE = msgspec.json.Decoder(_TracePhaseStart | _TraceStep | _TracePhaseFinish)
"""A recorded trace's line (its other keys, ``seq``, ``depth``, ``inferred``, are notes)."""


def load_trace(path: str | os.PathLike[str]) -> list[Callback]:
    """The callbacks of a recorded trace or a trt-otel journal (told apart by the first line)."""
    where = Path(path)
    try:
        with open(where, "rb") as handle:
            first = handle.readline()
    except OSError as error:
        raise TraceError(f"cannot read trace {os.fspath(path)!r}: {error.strerror}") from None
    try:
        head = msgspec.json.decode(first) if first.strip() else None
    except (msgspec.DecodeError, RecursionError):
        head = None
    if is_journal_header(head):
        try:
            return _callbacks_of_journal(where)
        except JournalError as error:
            raise TraceError(str(error)) from None
    return _callbacks_of_trace(where)


def _callbacks_of_trace(path: Path) -> list[Callback]:
    callbacks: list[Callback] = []
    decode = _TRACE_LINE.decode
    with open(path, "rb") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = decode(line)
            except (msgspec.DecodeError, RecursionError) as error:  # ValidationError included
                reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
                raise TraceError(f"{path}:{line_no}: not a trace callback ({reason})") from None
            if isinstance(record, _TraceStep):
                callbacks.append(Callback("step_complete", record.phase_name, step=record.step))
            elif isinstance(record, _TracePhaseStart):
                callbacks.append(
                    Callback(
                        "phase_start",
                        record.phase_name,
                        parent=record.parent_phase,
                        num_steps=record.num_steps,
                    )
                )
            else:
                callbacks.append(Callback("phase_finish", record.phase_name))
    if not callbacks:
        raise TraceError(f"{path}: no callbacks in this trace")
    return callbacks


def _callbacks_of_journal(path: Path) -> list[Callback]:
    journal = read_journal(path)
    callbacks: list[Callback] = []
    previous_ns: int | None = None
    for event in journal.events:
        if not isinstance(event, PhaseStarted | StepCompleted | PhaseFinished):
            continue
        delay_s = 0.0 if previous_ns is None else max(0, event.mono_ns - previous_ns) / 1e9
        previous_ns = event.mono_ns
        if isinstance(event, PhaseStarted):
            callbacks.append(
                Callback("phase_start", event.name, event.parent, event.num_steps, delay_s=delay_s)
            )
        elif isinstance(event, StepCompleted):
            callbacks.append(
                Callback("step_complete", event.name, step=event.step, delay_s=delay_s)
            )
        else:
            callbacks.append(Callback("phase_finish", event.name, delay_s=delay_s))
    if not callbacks:
        raise TraceError(f"{path}: the journal holds no callbacks")
    return callbacks
