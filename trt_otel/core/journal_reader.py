"""The journal's reader: one line reader for every command that reads a journal back.

:class:`LineReader`, shared by ``replay``, ``watch``, ``demo --trace`` and the fleets, reports
(never hides) a torn last line, a corrupt line, an unknown event type, a gap in ``seq`` and a
repeated ``seq`` (a duplicated line, skipped so nothing counts twice), and carries on. A journal
is untrusted: its header is read bounded and checked for what it is, a file is checked to be a
regular one before it is opened, and the NULs a crash can leave at its start are skipped, said.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from trt_otel.core.events import (
    BuildStarted,
    Event,
)
from trt_otel.core.files import (
    MAX_LINE_BYTES,
    open_regular_for_reading,
)
from trt_otel.core.journal_codec import (
    CHECKED_FIELD,
    DECODER,
    FORMAT_NAME,
    FORMAT_VERSION,
    CorruptLineError,
    JournalError,
    decode_event,
)

_NO_HEADER: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
"""What a first line that is no header reads as: a journal of this format, with no more said."""

_READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class JournalProblem:
    """Something in a journal that was skipped; ``line`` is 1-based."""

    line: int
    kind: str  # torn_tail, corrupt_line, long_line, unknown_type, seq_gap, seq_repeat, nul_prefix
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class LineReader:
    """Journal lines in, events and problems out, in order: the one reader of journal lines.

    Feed it bytes as they come (a whole file in chunks, or what a growing file gained); a line
    is read once its newline has arrived, and :meth:`finish` reads a last line without one
    (a torn tail when it does not decode). Line numbers count the header as line 1.

    Within one build ``seq`` is contiguous. A jump is reported, unless corrupt lines skipped
    just before explain it; a ``seq`` at or below one already read is a repeated line, reported
    and skipped; a new event with ``seq`` 0 starts a new sequence (one journal may hold the logs
    of several builds).
    """

    def __init__(self) -> None:
        self.line_no = 1
        self._pending = b""
        self._expected_seq = -1
        self._skipped = 0
        self._first: Event | None = None
        self._discarding = False
        """Within a line over :data:`MAX_LINE_BYTES`, reported and skipped up to its newline."""

    def feed(self, chunk: bytes) -> list[Event | JournalProblem]:
        if self._discarding:
            cut = chunk.find(b"\n")
            if cut < 0:
                return []
            chunk, self._discarding = chunk[cut + 1 :], False
        data = self._pending + chunk if self._pending else chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        out: list[Event | JournalProblem] = []
        overlong = len(self._pending) > MAX_LINE_BYTES  # no newline in sight: never held whole
        if overlong:
            self._pending, self._discarding = b"", True
        # A whole line over the bound is skipped too, as it is when its newline comes in a
        # later chunk: what is read never depends on how the bytes were cut.
        bounded = len(data) <= MAX_LINE_BYTES
        decode = DECODER.decode
        append = out.append
        for raw in lines:
            self.line_no += 1
            if not bounded and len(raw) > MAX_LINE_BYTES:
                self._long_line(out)
                continue
            try:
                event: Event = decode(raw)
                seq = event.seq
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                self._problem(raw, out)
                continue
            if seq != self._expected_seq or seq == 0:
                if not self._sequence(event, out):
                    continue
            else:
                self._skipped = 0
            self._expected_seq = seq + 1
            append(event)
        if overlong:
            self.line_no += 1
            self._long_line(out)
        return out

    def _long_line(self, out: list[Event | JournalProblem]) -> None:
        out.append(
            JournalProblem(self.line_no, "long_line", f"a line over {MAX_LINE_BYTES:,} bytes")
        )
        self._skipped += 1

    def finish(self) -> list[Event | JournalProblem]:
        """Read the last line if it has no newline; the reader is then at the end."""
        pending, self._pending = self._pending, b""
        self._discarding = False
        if not pending.strip():
            return []
        out = self.feed(pending + b"\n")
        last = out[-1] if out else None
        if isinstance(last, JournalProblem) and last.kind in ("corrupt_line", "unknown_type"):
            out[-1] = JournalProblem(
                self.line_no, "torn_tail", "torn last line (the writer was stopped mid-write)"
            )
        return out

    def _problem(self, raw: bytes, out: list[Event | JournalProblem]) -> None:
        try:
            decode_event(raw)
        except CorruptLineError as error:
            out.append(JournalProblem(self.line_no, error.kind, str(error)))
        self._skipped += 1

    def _sequence(self, event: Event, out: list[Event | JournalProblem]) -> bool:
        """Check an event whose ``seq`` is not the next one; False when it is to be skipped."""
        expected, seq = self._expected_seq, event.seq
        if seq == 0 and event != self._first:
            self._first = event  # another build's log, appended to the same journal
        elif expected < 0:
            pass  # the first event read (a journal may start after events were trimmed)
        elif seq < expected:
            out.append(
                JournalProblem(
                    self.line_no,
                    "seq_repeat",
                    f"seq {seq} again after {expected - 1} (a repeated line): skipped",
                )
            )
            return False
        elif seq - expected != self._skipped:
            missing = seq - expected
            out.append(
                JournalProblem(
                    self.line_no,
                    "seq_gap",
                    f"seq jumps from {expected - 1} to {seq} ({missing} events missing)",
                )
            )
        self._skipped = 0
        return True


@dataclass(slots=True)
class Journal:
    """A journal read back: its header, its events in order, and what was skipped."""

    path: Path
    header: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    problems: list[JournalProblem] = field(default_factory=list)


def is_journal_header(record: object) -> bool:
    return isinstance(record, dict) and record.get("format") == FORMAT_NAME


def callbacks_checked(header: dict[str, Any]) -> bool:
    """Whether the journal's callbacks were checked when recorded (:data:`CHECKED_FIELD`)."""
    return header.get(CHECKED_FIELD) is not False


def read_journal(path: str | os.PathLike[str]) -> Journal:
    """Read a whole journal, its events as written. Problems in the body are collected, not
    raised. A reader that shows or judges the build reads it through
    :func:`trt_otel.capture.checked.read_journal`, which takes a C++ monitor's unchecked
    callbacks through the one way in."""
    items = iter_journal(path)
    header = next(items)
    assert isinstance(header, dict)  # iter_journal yields the header first or raises
    journal = Journal(Path(path), header)
    events, problems = journal.events, journal.problems
    for item in items:
        if isinstance(item, JournalProblem):
            problems.append(item)
        else:
            events.append(item)  # type: ignore[arg-type]
    return journal


def iter_journal(path: str | os.PathLike[str]) -> Iterator[dict[str, Any] | Event | JournalProblem]:
    """Yield the header (a dict), then each event or problem, reading the file in chunks.

    Only a regular file is read (a named pipe or a device is a :class:`JournalError`, never a
    hang), a bounded piece at a time. A journal truncated in place while it was written (as
    logrotate's ``copytruncate`` does) starts with a run of NUL bytes where its header and
    first events were: the run is reported, as a problem on line 1, and what follows is read.
    """
    try:
        handle = open_regular_for_reading(path, "journal")
    except OSError as error:
        raise JournalError(f"cannot read journal {os.fspath(path)!r}: {error.strerror}") from None
    with handle:
        nuls = skip_nul_prefix(handle)
        first = handle.readline(MAX_HEADER_BYTES)
        if not nuls:
            yield parse_header(first, path)
            yield from _body(handle, LineReader())
            return
        header = _header_after_nuls(first)
        yield dict(header)
        yield JournalProblem(1, "nul_prefix", nul_prefix_message(nuls))
        if header is not _NO_HEADER:
            yield from _body(handle, LineReader())
            return
        reader = LineReader()  # no header left: the first line is an event's, after the NULs
        reader.line_no = 0
        yield from _after_cut(_body(handle, reader, first))


def _body(
    handle: IO[bytes], reader: LineReader, first: bytes = b""
) -> Iterator[Event | JournalProblem]:
    """The events and problems of the rest of the file, a chunk at a time."""
    if first:
        yield from reader.feed(first)
    while chunk := handle.read(_READ_CHUNK_BYTES):
        yield from reader.feed(chunk)
    yield from reader.finish()


TRUNCATED_ATTRIBUTE = "trt_otel.journal.truncated"
"""Set on the stand-in ``build_start`` of a build whose start was cut away."""


def _after_cut(items: Iterator[Event | JournalProblem]) -> Iterator[Event | JournalProblem]:
    """What is left of a journal truncated in place, led by a stand-in for the ``build_start``
    that was cut away (marked :data:`TRUNCATED_ATTRIBUTE`, its times those of the first event
    left), so the phases left are folded and shown as a build's."""
    for item in items:
        if isinstance(item, Event) and type(item) is not BuildStarted:
            yield BuildStarted(
                seq=max(0, item.seq - 1),
                wall_ns=item.wall_ns,
                mono_ns=item.mono_ns,
                thread=item.thread,
                build_id="unknown (its start was cut away)",
                attributes={TRUNCATED_ATTRIBUTE: True},
            )
            yield item
            break
        yield item
        if isinstance(item, Event):
            break
    yield from items


MAX_HEADER_BYTES = 64 * 1024
"""The longest header line read (a header is a few hundred bytes)."""


def _header_after_nuls(first: bytes) -> dict[str, Any]:
    """The header on the first line after a NUL run, if it is one (a writer that started over),
    else a stand-in (the header was in what was cut away)."""
    try:
        record = msgspec.json.decode(first)
    except (msgspec.DecodeError, RecursionError):
        return _NO_HEADER
    return record if is_journal_header(record) else _NO_HEADER


def skip_nul_prefix(handle: IO[bytes]) -> int:
    """Move ``handle`` past the NUL bytes it starts with; how many there were.

    A file truncated in place while its writer goes on writing at its own offset (logrotate's
    ``copytruncate``) has a hole there: it is skipped with ``SEEK_DATA`` where the filesystem
    keeps holes, and read a bounded chunk at a time where it does not."""
    start = handle.tell()
    descriptor = handle.fileno()
    try:
        handle.seek(os.lseek(descriptor, start, os.SEEK_DATA))
    except OSError as error:
        if error.errno == errno.ENXIO:  # a hole to the end: nothing but NULs
            handle.seek(0, os.SEEK_END)
            return handle.tell() - start
        # no SEEK_DATA on this filesystem: read on
    while True:
        at = handle.tell()
        chunk = handle.read(_READ_CHUNK_BYTES)
        stripped = chunk.lstrip(b"\0")
        if stripped or not chunk:
            handle.seek(at + len(chunk) - len(stripped))
            return handle.tell() - start


def nul_prefix_message(count: int) -> str:
    return (
        f"starts with {count:,} NUL bytes (truncated in place while written, as logrotate's "
        "copytruncate does): its header and first events are lost; reading what follows"
    )


def parse_header(first: bytes, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The journal header on ``first`` (line 1), or a JournalError saying why it is not one."""
    where = os.fspath(path)
    try:
        header = msgspec.json.decode(first)
    except (msgspec.DecodeError, RecursionError):
        header = None
    if not is_journal_header(header):
        raise JournalError(f"{where!r} is not a trt-otel journal (no header on line 1)")
    assert isinstance(header, dict)
    version = header.get("version")
    if type(version) is not int or version < 1:
        # A crafted or damaged header: no newer trt-otel would read it either.
        raise JournalError(
            f"{where!r} has a header whose version is {str(version)[:40]!r}, not a whole "
            "number from 1: not a journal trt-otel wrote"
        )
    if version > FORMAT_VERSION:
        raise JournalError(
            f"{where!r} is journal version {version!r}; this trt-otel reads up to "
            f"{FORMAT_VERSION}: upgrade trt-otel"
        )
    if type(header.get(CHECKED_FIELD, True)) is not bool:
        raise JournalError(
            f"{where!r} has a header whose {CHECKED_FIELD!r} is "
            f"{str(header[CHECKED_FIELD])[:40]!r}, not true or false: not a journal trt-otel wrote"
        )
    return header
