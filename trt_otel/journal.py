"""The journal: a durable JSON Lines record of the event log, and its reader.

Format (version 1), one JSON object per line, UTF-8:

* line 1, the header: ``{"format": "trt-otel-journal", "version": 1, "created_wall_ns": N,
  "producer": "trt-otel X.Y.Z"}``
* every other line, one event: ``seq``, ``type`` (``build_start``, ``phase_start``, ``step``,
  ``phase_finish``, ``cancel``, ``anomaly``, ``log``, ``build_end``), ``wall_ns``, ``mono_ns``,
  ``thread``, then the fields of that event type (see :mod:`trt_otel.events`).

The writer runs as a log follower, off the callback thread; it flushes at phase boundaries,
cancels and the end of the build, and fsyncs when closed. A process killed mid-write leaves a
usable prefix: the reader reports a torn last line and skips it, and reports (never hides) a
corrupt line, an unknown event type or a gap in ``seq``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import operator
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trt_otel import __version__
from trt_otel.events import (
    EVENT_TYPES,
    AnomalyKind,
    BuildFinished,
    CancelRequested,
    Event,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    fast_constructor,
)

FORMAT_NAME = "trt-otel-journal"
FORMAT_VERSION = 1

_FLUSH_ON = (PhaseStarted, PhaseFinished, CancelRequested, BuildFinished)
_ENUM_FIELDS: dict[str, type[enum.Enum]] = {"outcome": Outcome, "kind": AnomalyKind}
_FIELD_NAMES: dict[type[Event], tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in EVENT_TYPES.values()
}


class JournalError(Exception):
    """A journal that cannot be read at all (missing, not a journal, a newer version)."""


_FIELD_GETTERS = {
    cls: (names[1:], operator.attrgetter(*names[1:])) for cls, names in _FIELD_NAMES.items()
}
"""Per event class, its fields after ``seq`` and a getter of their values (C, not a loop)."""


def event_to_dict(event: Event) -> dict[str, Any]:
    """The journal's JSON object for one event (also the SSE payload).

    Enumerated values (``outcome``, ``kind``) are string enums, so they are their own JSON.
    """
    names, values = _FIELD_GETTERS[type(event)]
    record: dict[str, Any] = {"seq": event.seq, "type": event.type}
    record.update(zip(names, values(event), strict=True))
    return record


_READERS = {
    cls: (operator.itemgetter(*names), fast_constructor(cls))
    for cls, names in _FIELD_NAMES.items()
    if not any(name in _ENUM_FIELDS for name in names)
}
"""For event types without enumerated fields: all fields at once, straight into an event."""


def event_from_dict(record: dict[str, Any]) -> Event:
    """The event a journal object describes. Raises ValueError when it is not one."""
    cls = EVENT_TYPES.get(record.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {record.get('type')!r}")
    reader = _READERS.get(cls)
    if reader is not None:
        try:
            values = reader[0](record)
        except KeyError:
            pass  # a field left out (an older writer, a default): the careful way below
        else:
            if type(values[0]) is int and type(values[1]) is int and type(values[2]) is int:
                return reader[1](*values)
            raise ValueError("seq, wall_ns and mono_ns must be integers")
    kwargs: dict[str, Any] = {}
    for name in _FIELD_NAMES[cls]:
        if name in record:
            value = record[name]
            enum_type = _ENUM_FIELDS.get(name)
            kwargs[name] = enum_type(value) if enum_type is not None else value
    try:
        event = cls(**kwargs)
    except TypeError as error:
        raise ValueError(f"{cls.type} event is missing a field: {error}") from None
    for name in ("seq", "wall_ns", "mono_ns"):
        if type(getattr(event, name)) is not int:
            raise ValueError(f"{name} is not an integer")
    return event


class JournalWriter:
    """A log follower that appends every event to a JSON Lines file.

    The file is opened (and the header written) when the writer is created, so an unwritable
    path fails before the build starts. Runs on its follower thread; may raise on I/O errors,
    which the follower machinery reports once and counts.
    """

    name = "journal"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-sized writes, our own flushes: the file is a prefix of the log at any kill.
        self._file: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "created_wall_ns": time.time_ns(),
            "producer": f"trt-otel {__version__}",
        }
        self._file.write(json.dumps(header) + "\n")
        self._file.flush()
        self.lines_written = 0

    def handle(self, events: Sequence[Event]) -> None:
        dumps = json.dumps
        self._file.write("".join(dumps(event_to_dict(e)) + "\n" for e in events))
        self.lines_written += len(events)
        if any(isinstance(e, _FLUSH_ON) for e in events):
            self._file.flush()

    def close(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()


@dataclass(frozen=True, slots=True)
class JournalProblem:
    """Something in a journal that was skipped; ``line`` is 1-based."""

    line: int
    kind: str  # torn_tail, corrupt_line, unknown_type, seq_gap
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(slots=True)
class Journal:
    """A journal read back: its header, its events in order, and what was skipped."""

    path: Path
    header: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    problems: list[JournalProblem] = field(default_factory=list)


def is_journal_header(record: object) -> bool:
    return isinstance(record, dict) and record.get("format") == FORMAT_NAME


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read a whole journal. Problems in the body are collected, not raised."""
    journal: Journal | None = None
    for item in iter_journal(path):
        if isinstance(item, dict):
            journal = Journal(Path(path), item)
        elif journal is not None:
            if isinstance(item, JournalProblem):
                journal.problems.append(item)
            else:
                journal.events.append(item)
    assert journal is not None  # iter_journal yields the header first or raises
    return journal


def iter_journal(path: str | os.PathLike[str]) -> Iterator[dict[str, Any] | Event | JournalProblem]:
    """Yield the header (a dict), then each event or problem, reading line by line."""
    try:
        handle = open(path, "rb")  # noqa: SIM115
    except OSError as error:
        raise JournalError(f"cannot read journal {os.fspath(path)!r}: {error.strerror}") from None
    with handle:
        first = handle.readline()
        header = parse_header(first, path)
        yield header
        expected_seq: int | None = None
        skipped_lines = 0  # since the last good event: a gap they explain is not reported twice
        line_no = 1
        for raw in handle:
            line_no += 1
            torn = not raw.endswith(b"\n")
            try:
                record = json.loads(raw)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                event = event_from_dict(record)
            except (ValueError, UnicodeDecodeError) as error:
                if torn:
                    yield JournalProblem(
                        line_no, "torn_tail", "torn last line (the writer was stopped mid-write)"
                    )
                elif str(error).startswith("unknown event type"):
                    yield JournalProblem(line_no, "unknown_type", str(error))
                else:
                    yield JournalProblem(line_no, "corrupt_line", f"corrupt line: {error}")
                skipped_lines += 1
                continue
            missing = event.seq - expected_seq if expected_seq is not None else 0
            if expected_seq is not None and missing != skipped_lines:
                yield JournalProblem(
                    line_no,
                    "seq_gap",
                    f"seq jumps from {expected_seq - 1} to {event.seq}"
                    + (f" ({missing} events missing)" if missing > 0 else ""),
                )
            expected_seq = event.seq + 1
            skipped_lines = 0
            yield event


def parse_header(first: bytes, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The journal header on ``first`` (line 1), or a JournalError saying why it is not one."""
    where = os.fspath(path)
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not is_journal_header(header):
        raise JournalError(f"{where!r} is not a trt-otel journal (no header on line 1)")
    assert isinstance(header, dict)
    version = header.get("version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise JournalError(
            f"{where!r} is journal version {version!r}; this trt-otel reads up to "
            f"{FORMAT_VERSION}: upgrade trt-otel"
        )
    return header
