"""Files written for another reader, never seen half written: an engine, a build's control
file, the URL of its HTTP view; and files from outside (a journal, a trace), checked for what
they are before they are opened."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import secrets
import select
import stat
import time
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one.
    ``mode``: the file's permissions; else a data file's, ``0666`` less the process's umask
    (as ``open()`` makes one): an engine or a report another user's process (a server) reads
    as the umask allows, never a file only its writer can read."""
    # The pid in the name lets a supervisor that killed this process find what it left; the
    # lock held while it is written tells a later writer whether anyone still writes it.
    remove_abandoned_partials(path)
    descriptor, temporary = _new_file_beside(path)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        with os.fdopen(descriptor, "wb") as file:
            if mode is not None:
                os.fchmod(file.fileno(), mode)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _new_file_beside(path: Path) -> tuple[int, str]:
    """A new file beside ``path`` (``.NAME.PID.RANDOM.partial``), created with ``0666`` for the
    kernel to take the umask from (``mkstemp`` makes ``0600`` whatever the umask), never an
    existing file or a link."""
    directory = path.parent if str(path.parent) else Path(".")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        temporary = os.path.join(
            directory, f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial"
        )
        try:
            return os.open(temporary, flags, 0o666), temporary
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name", os.fspath(directory))


ABANDONED_AFTER_S = 10.0
"""How long a temporary file must have gone unmodified before a later writer of the same path
may take it for abandoned (on top of its writer's pid being gone and its lock being free)."""


def remove_abandoned_partials(path: Path) -> list[Path]:
    """Remove the temporary files of ``path`` that a killed writer left (a supervisor killed
    with SIGKILL takes its worker with it, mid-write, and nothing of either is left to clean
    up): the files named as :func:`write_atomically` names them, owned by this user, whose
    writer's pid is no process here, whose lock nobody holds (a writer in another pid namespace
    or on another host of a shared folder holds it) and untouched for
    :data:`ABANDONED_AFTER_S`. The files removed."""
    directory = path.parent if str(path.parent) else Path(".")
    removed: list[Path] = []
    try:
        candidates = list(directory.glob(f".{glob_escape(path.name)}.*.*.partial"))
    except OSError:
        return removed
    for candidate in candidates:
        pid = _writer_pid(candidate.name, path.name)
        if pid is None or _is_running(pid):
            continue
        if _remove_if_abandoned(candidate):
            removed.append(candidate)
    return removed


def glob_escape(name: str) -> str:
    """``name`` matched literally by :meth:`Path.glob`."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _writer_pid(temporary: str, name: str) -> int | None:
    """The pid in ``.NAME.PID.RANDOM.partial``, or None where the name is not one of ours."""
    middle = temporary[len(name) + 2 : -len(".partial")]
    pid, _, token = middle.partition(".")
    if not (pid.isdigit() and len(token) == 8 and all(c in "0123456789abcdef" for c in token)):
        return None
    return int(pid)


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_if_abandoned(candidate: Path) -> bool:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        descriptor = os.open(candidate, flags)
    except OSError:  # gone, a link, or not ours to read
        return False
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            return False
        if time.time() - info.st_mtime < ABANDONED_AFTER_S:
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its writer still holds it
            return False
        candidate.unlink(missing_ok=True)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)


# -- files from outside: checked for what they are before they are opened ------------------------

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest line read from a journal or trace (16 MiB, far over any event's): a file with no
newline (a device, a file of NULs) is read a bounded piece at a time, never whole."""


class FileKindError(OSError):
    """A path that is there but is not a regular file (a directory, a named pipe, a device, a
    socket). An :class:`OSError`, so a caller that reports ``error.strerror`` says what it is."""

    def __init__(self, path: str | os.PathLike[str], purpose: str, mode: int) -> None:
        self.kind = file_kind(mode)
        super().__init__(errno.EINVAL, f"{self.kind}, not a regular file", os.fspath(path))
        self.purpose = purpose
        self.is_directory = stat.S_ISDIR(mode)

    def __str__(self) -> str:
        return f"{self.purpose} {self.filename} is {self.kind}, not a regular file"


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def regular_file_or_absent(path: str | os.PathLike[str], purpose: str) -> None:
    """Raise :class:`FileKindError` unless ``path`` is a regular file (a link to one counts) or
    is not there: a file about to be created or written. Other errors (a permission, a missing
    directory) are left for the open to report."""
    try:
        info = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise FileKindError(path, purpose, info.st_mode)


class _ReadsWithoutWaiting(io.BufferedReader):
    """A reader of a non-blocking descriptor whose ``read`` raises, rather than returns None,
    when there is nothing to read without waiting: callers handle an OSError already."""

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        short = data is not None and (size is None or size < 0 or len(data) < size)
        # A short read of a regular file is its end; of a file that only looks regular it may be
        # all it had before it would wait (/proc/kmsg holding a few lines): the descriptor,
        # polled, says which (a regular file is always readable).
        if data is None or (short and not self._readable_now()):
            raise BlockingIOError(
                errno.EAGAIN, "nothing to read without waiting (not an ordinary file)"
            )
        return data

    def _readable_now(self) -> bool:
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        return bool(poller.poll(0))


def open_regular_for_reading(path: str | os.PathLike[str], purpose: str) -> BinaryIO:
    """``path`` opened for reading, only if it is a regular file (else :class:`FileKindError`).

    Opened without blocking and checked on the open descriptor: a named pipe with no writer
    neither blocks the open nor is read, and a path swapped after a check is still caught. It
    stays non-blocking: a file of a kernel or user-space filesystem that says it is regular
    but has nothing to read (``/proc/kmsg``) raises :class:`BlockingIOError` (an
    :class:`OSError`) rather than wait for ever. The
    caller reads it a bounded piece at a time (see :data:`MAX_LINE_BYTES`).
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise FileKindError(path, purpose, mode)
        # Left non-blocking: a regular file's reads never wait anyway, and a file that only
        # looks regular (/proc/kmsg, a FUSE file) raises BlockingIOError rather than hang.
        return _ReadsWithoutWaiting(io.FileIO(descriptor, "rb", closefd=True))
    except BaseException:
        os.close(descriptor)
        raise
