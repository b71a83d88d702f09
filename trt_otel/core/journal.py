"""The journal's writer: the event log, durable, as JSON Lines (the format and its codec are
:mod:`trt_otel.core.journal_codec`'s, the reading back :mod:`trt_otel.core.journal_reader`'s).

The writer runs as a log follower, off the callback thread; it flushes at phase boundaries,
cancels and the end of the build, and fsyncs when closed. A process killed mid-write leaves a
usable prefix. One writer a journal at a time: the file is locked while it is written, and the
header names the writer (its pid and host), which it touches every ``touch_interval_s`` so that
``watch`` tells a silent build from a lost one.
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from trt_otel.core.events import (
    BuildFinished,
    CancelRequested,
    Event,
    PhaseFinished,
    PhaseStarted,
)
from trt_otel.core.files import (
    FileKindError,
    open_regular_for_reading,
    regular_file_or_absent,
)
from trt_otel.core.journal_codec import (
    _ENCODER,
    CHECKED_FIELD,
    FORMAT_NAME,
    FORMAT_VERSION,
)
from trt_otel.core.journal_reader import (
    MAX_HEADER_BYTES,
    is_journal_header,
)
from trt_otel.core.version import __version__
from trt_otel.core.writer import Toucher, writer_fields

_FLUSH_ON = frozenset({PhaseStarted, PhaseFinished, CancelRequested, BuildFinished})


# -- the codec -----------------------------------------------------------------------------------


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
