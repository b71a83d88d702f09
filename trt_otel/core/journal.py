"""The journal: a durable JSON Lines record of the event log, its codec and its one line reader.

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

The writer runs as a log follower, off the callback thread; it flushes at phase boundaries,
cancels and the end of the build, and fsyncs when closed. A process killed mid-write leaves a
usable prefix. :class:`LineReader`, shared by ``replay``, ``watch`` and ``demo --trace``, reports
(never hides) a torn last line, a corrupt line, an unknown event type, a gap in ``seq`` and a
repeated ``seq`` (a duplicated line, skipped so nothing counts twice), and carries on.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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
from trt_otel.core.files import (
    MAX_LINE_BYTES,
    FileKindError,
    open_regular_for_reading,
    regular_file_or_absent,
)
from trt_otel.core.version import __version__
from trt_otel.core.writer import Toucher, writer_fields

FORMAT_NAME = "trt-otel-journal"
FORMAT_VERSION = 1
CHECKED_FIELD = "checked"
"""The header's word on the journal's callbacks. ``false``: recorded as they came, not checked
against TensorRT's protocol (the C++ monitor records only), so every reader takes them through
the one way in, which finds the anomalies and numbers the events as a Python build's (see
:mod:`trt_otel.capture.checked`). ``true``, or absent (every journal written before the field
was, the C++ monitor's of then included, which checked them itself): the events are the checked
ones, read as they are, never checked twice."""

_FLUSH_ON = frozenset({PhaseStarted, PhaseFinished, CancelRequested, BuildFinished})
_READ_CHUNK_BYTES = 1 << 20

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
_DECODER = msgspec.json.Decoder(AnyEvent)


class JournalError(Exception):
    """A journal that cannot be read at all (missing, not a journal, a newer version)."""


class CorruptLineError(ValueError):
    """A line that is not an event; ``kind`` is ``corrupt_line`` or ``unknown_type``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# -- the codec -----------------------------------------------------------------------------------


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
        event: Event = _DECODER.decode(raw)
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


# -- writing -------------------------------------------------------------------------------------


ENCODED_AHEAD_EVENTS = 1 << 17
"""Events a journal keeps encoded ahead of its writing, at most (about 20 MiB): more than a
supervisor lets its followers fall behind before it waits for them."""


@dataclass(frozen=True, slots=True)
class _Encoded:
    """Journal lines of a run of events, encoded ahead of their writing."""

    first_seq: int
    count: int
    lines: bytes
    flush: bool
    """Whether one of them is worth a flush (a phase boundary, a cancel, the end)."""


def _lines(events: Sequence[Event]) -> tuple[bytes, bool]:
    """The journal lines of ``events``, and whether one of them is worth a flush (a phase
    boundary, a cancel, the end: the file is then a prefix of the log a reader can follow)."""
    return _ENCODER.encode_lines(events), not _FLUSH_ON.isdisjoint(map(type, events))


class JournalWriter:
    """A log follower that appends every event to a JSON Lines file.

    The file is opened (and the header written) when the writer is created, so an unwritable
    path fails before the build starts. Runs on its follower thread; may raise on I/O errors,
    which the follower machinery reports once and counts.
    """

    name = "journal"

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False) -> None:
        """``append``: go on after what the journal holds (the next attempt of a retried
        build: its log starts at ``seq`` 0 again, which a reader takes as a new log), rather
        than start it afresh."""
        self.path = Path(path)
        # No folder is made for it: a typo in the path would otherwise leave folders wherever
        # it pointed (the engine's folder must exist too). FileNotFoundError says it.
        # Batch-sized writes, our own flushes: the file is a prefix of the log at any kill.
        self._file: IO[bytes] = _open_for_writing(self.path, append=append)
        if self._file.tell() == 0:
            header = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "created_wall_ns": time.time_ns(),
                "producer": f"trt-otel {__version__}",
                **writer_fields(),
                CHECKED_FIELD: True,
            }
            self._file.write(_ENCODER.encode(header) + b"\n")
            self._file.flush()
        self.lines_written = 0
        self.lines_encoded_ahead = 0
        """Of :attr:`lines_written`, those encoded ahead (see :meth:`encode_ahead`)."""
        self._ahead: deque[_Encoded] = deque()
        self._ahead_events = 0
        self._ahead_lock = threading.Lock()
        # Signs of life for `watch` while the build is silent (see trt_otel.capture.liveness).
        self._toucher = Toucher(self.path)

    def encode_ahead(self, events: list[Event]) -> None:
        """Encode ``events`` now, on the thread that made them (a supervisor's replay, a batch
        at a time, through :meth:`EventLog.add_batch_consumer`), for :meth:`handle` to write
        when they reach it: encoding them there, out of the cache, cost several times as much.
        Keeps at most :data:`ENCODED_AHEAD_EVENTS` events' worth; past that, :meth:`handle`
        encodes what it gets, as without it."""
        if not events or self._ahead_events + len(events) > ENCODED_AHEAD_EVENTS:
            return
        chunk = _Encoded(events[0].seq, len(events), *_lines(events))
        with self._ahead_lock:
            self._ahead.append(chunk)
            self._ahead_events += chunk.count

    def handle(self, events: Sequence[Event]) -> None:
        start = 0
        if self._ahead:
            start = self._write_encoded_ahead(events)
        if start < len(events):
            lines, flush = _lines(events[start:])
            self._file.write(lines)
            if flush:
                self._file.flush()
        self.lines_written += len(events)

    def _write_encoded_ahead(self, events: Sequence[Event]) -> int:
        """Write the chunks encoded ahead that are exactly the next of ``events`` (their seqs
        run on without a gap); the number of events written. A chunk of events this writer
        never got (its queue dropped them) or already wrote is discarded."""
        first_seq, written, flush = events[0].seq, 0, False
        with self._ahead_lock:
            while self._ahead:
                chunk = self._ahead[0]
                at = chunk.first_seq - first_seq
                if at < written:  # behind what arrives now: discard
                    self._ahead.popleft()
                    self._ahead_events -= chunk.count
                    continue
                end = at + chunk.count
                if at != written or end > len(events) or events[end - 1].seq != first_seq + end - 1:
                    break  # not the next events, or not all of them have arrived yet
                self._ahead.popleft()
                self._ahead_events -= chunk.count
                self._file.write(chunk.lines)
                written, flush = end, flush or chunk.flush
        if flush:
            self._file.flush()
        self.lines_encoded_ahead += written
        return written

    def close(self) -> None:
        self._toucher.stop()
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()


class JournalBusyError(OSError):
    """The journal is being written by another writer (it holds the file's lock)."""


def _open_for_writing(path: Path, *, append: bool = False) -> IO[bytes]:
    """The journal opened for writing, emptied, and locked for this writer's life.

    Only a regular file is written: a named pipe would block the open (with no reader) and a
    device is no journal, so either is an error (:class:`~trt_otel.core.files.FileKindError`)
    before the build starts. The file is locked (``flock``, advisory, released when it is
    closed or its writer dies) before it is truncated: a second build given the same journal
    is refused (:class:`JournalBusyError`, naming the writer from the header) rather than
    cutting the first one's journal in two."""
    regular_file_or_absent(path, "journal")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    descriptor = os.open(path, flags, 0o666)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):  # swapped in after the check above
            raise FileKindError(path, "journal", mode)
        os.set_blocking(descriptor, True)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalBusyError(
                errno.EBUSY, f"already being written by {_writer_of(path)}", os.fspath(path)
            ) from None
        if append:
            os.lseek(descriptor, 0, os.SEEK_END)
        else:
            os.ftruncate(descriptor, 0)
        return os.fdopen(descriptor, "wb")
    except BaseException:
        os.close(descriptor)
        raise


def _writer_of(path: Path) -> str:
    """Who writes the journal at ``path``, as its header says."""
    header: Any = None
    with (
        contextlib.suppress(OSError, msgspec.DecodeError, RecursionError),
        open_regular_for_reading(path, "journal") as handle,
    ):
        header = msgspec.json.decode(handle.readline(MAX_HEADER_BYTES))
    if not is_journal_header(header):
        return "another trt-otel"
    pid, host = header.get("writer_pid"), header.get("writer_host")
    where = f" on host {host!s:.64}" if host is not None else ""
    return f"trt-otel pid {pid!s:.20}{where} (give each build its own journal)"


def journal_in_use(path: str | os.PathLike[str]) -> str | None:
    """Who writes the journal at ``path`` now (see :func:`_open_for_writing`), or None when
    no one does (or it is not there, or not a regular file): a check before a build starts;
    the writer's own lock is what settles it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _writer_of(Path(path))
        return None
    finally:
        os.close(descriptor)  # and with it the lock, if it was taken


# -- reading -------------------------------------------------------------------------------------


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
        decode = _DECODER.decode
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

_NO_HEADER: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION}


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
