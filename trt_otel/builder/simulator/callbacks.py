"""A build's callbacks as data: what the simulator replays, read from traces and journals.

Two formats are read: the recorded TensorRT traces (one ``{"cb": "phase_start" | "step_complete"
| "phase_finish", ...}`` object per line, no timestamps) and trt-otel's own journal, whose
monotonic timestamps become the delays between callbacks. Both are read as bytes and decoded
by ``msgspec`` with every field's type checked: a binary file, a wrong type or a line nested too
deeply is a :class:`TraceError` naming the line, never a traceback.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, NoReturn, overload

import msgspec

from trt_otel.core.events import PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.core.files import MAX_LINE_BYTES, open_regular_for_reading
from trt_otel.core.journal_codec import JournalError
from trt_otel.core.journal_reader import is_journal_header, read_journal

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


class _TracePhaseStart(msgspec.Struct, frozen=True, gc=False, tag_field="cb", tag="phase_start"):
    phase_name: str
    parent_phase: str | None
    num_steps: int


class _TraceStep(msgspec.Struct, frozen=True, gc=False, tag_field="cb", tag="step_complete"):
    phase_name: str
    step: int


class _TracePhaseFinish(msgspec.Struct, frozen=True, gc=False, tag_field="cb", tag="phase_finish"):
    phase_name: str


_TRACE_LINE = msgspec.json.Decoder(_TracePhaseStart | _TraceStep | _TracePhaseFinish)
"""A recorded trace's line (its other keys, ``seq``, ``depth``, ``inferred``, are notes).
Its records are frozen (hashable by type and fields): a trace's callbacks are interned by the
records themselves."""


class InternedPlan(Sequence[Callback]):
    """A long callback sequence in little memory: each distinct callback once, and the order
    as 4-byte indexes. A recorded trace repeats a few hundred distinct callbacks (a phase-dense
    build of a million steps holds about 6,000), so this takes 4 bytes a callback where a list
    of callbacks takes about 100, iterating it makes no object, and it pickles as one block
    of bytes: the demo parses a trace once and hands it to the build's process like this."""

    __slots__ = ("_distinct", "_order")

    def __init__(self, distinct: list[Callback], order: array[int]) -> None:
        self._distinct = distinct
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    @overload
    def __getitem__(self, index: int) -> Callback: ...

    @overload
    def __getitem__(self, index: slice) -> list[Callback]: ...

    def __getitem__(self, index: int | slice) -> Callback | list[Callback]:
        if isinstance(index, slice):
            distinct = self._distinct
            return [distinct[i] for i in self._order[index]]
        return self._distinct[self._order[index]]

    def __iter__(self) -> Iterator[Callback]:
        return map(self._distinct.__getitem__, self._order)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, InternedPlan | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[InternedPlan], tuple[list[Callback], array[int]]]:
        return (InternedPlan, (self._distinct, self._order))


def load_trace(path: str | os.PathLike[str]) -> Sequence[Callback]:
    """The callbacks of a recorded trace or a trt-otel journal (told apart by the first line).

    A recorded trace comes back as an :class:`InternedPlan`; a journal, whose callbacks each
    carry their own delay, as a list."""
    where = Path(path)
    try:
        with open_regular_for_reading(where, "trace") as handle:
            first = handle.readline(MAX_LINE_BYTES)
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


def _callbacks_of_trace(path: Path) -> InternedPlan:
    distinct: list[Callback] = []
    index_of: dict[object, int] = {}
    order = array("I")
    add = order.append
    for record in _trace_records(path):
        index = index_of.get(record)
        if index is None:
            index = index_of[record] = len(distinct)
            distinct.append(_callback_of(record))
        add(index)
    if not order:
        raise TraceError(f"{path}: no callbacks in this trace")
    return InternedPlan(distinct, order)


_CHUNK_BYTES = 1 << 22


def _trace_records(path: Path) -> Iterator[_TracePhaseStart | _TraceStep | _TracePhaseFinish]:
    """The trace's records, decoded a few MiB of whole lines at a time (one call each); a
    chunk that does not decode is read again line by line, to say which line is wrong."""
    lines_before, tail = 0, b""
    try:
        handle = open_regular_for_reading(path, "trace")
    except OSError as error:
        raise TraceError(f"cannot read trace {os.fspath(path)!r}: {error.strerror}") from None
    with handle:
        while data := _read_chunk(handle, path):
            buffer = tail + data
            cut = buffer.rfind(b"\n") + 1
            chunk, tail = buffer[:cut], buffer[cut:]
            if len(tail) > MAX_LINE_BYTES:  # no newline in sight: never held whole
                line_no = lines_before + chunk.count(b"\n") + 1
                raise TraceError(f"{path}:{line_no}: a line over {MAX_LINE_BYTES:,} bytes")
            yield from _decoded(path, chunk, lines_before)
            lines_before += chunk.count(b"\n")
    yield from _decoded(path, tail, lines_before)  # a last line without its newline


def _read_chunk(handle: BinaryIO, path: Path) -> bytes:
    try:
        return handle.read(_CHUNK_BYTES)
    except OSError as error:
        raise TraceError(f"cannot read trace {os.fspath(path)!r}: {error.strerror}") from None


def _decoded(
    path: Path, chunk: bytes, lines_before: int
) -> list[_TracePhaseStart | _TraceStep | _TracePhaseFinish]:
    try:
        return _TRACE_LINE.decode_lines(chunk)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        _raise_for_line(path, chunk, lines_before)


def _raise_for_line(path: Path, chunk: bytes, lines_before: int) -> NoReturn:
    for line_no, line in enumerate(chunk.splitlines(), start=lines_before + 1):
        if not line.strip():
            continue
        try:
            _TRACE_LINE.decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as error:
            reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
            raise TraceError(f"{path}:{line_no}: not a trace callback ({reason})") from None
    raise TraceError(f"{path}: not a trace (its lines do not decode together)")


def _callback_of(record: _TracePhaseStart | _TraceStep | _TracePhaseFinish) -> Callback:
    if isinstance(record, _TraceStep):
        return Callback("step_complete", record.phase_name, step=record.step)
    if isinstance(record, _TracePhaseStart):
        return Callback(
            "phase_start",
            record.phase_name,
            parent=record.parent_phase,
            num_steps=record.num_steps,
        )
    return Callback("phase_finish", record.phase_name)


def _callbacks_of_journal(path: Path) -> list[Callback]:
    # The callbacks as written: the simulator makes them again into a monitor, whose one way
    # in checks them (a C++ journal's unchecked ones too); its anomalies are not callbacks.
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
