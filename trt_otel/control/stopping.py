"""Stopping a build's process from outside, once: is it still there, and SIGTERM, then SIGKILL.

TensorRT honours a cancel only at its next callback, and a real build can be silent for minutes:
a build that must stop now is stopped from outside its process. The worker of ``build``, the
program of ``run`` and a journal's writer followed by ``watch`` are all stopped by
:func:`stop_process`, and :func:`process_running` is the one answer to "is that process still
the one we mean" (psutil). A process that is not our own child is signalled only when
:func:`holds_write_lock` proves it is the journal's writer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import psutil

GoneWithin = Callable[[float], bool]
"""Waits up to the given seconds for the process to end; says whether it did."""

STARTED_SLACK_S = 2.0
"""How much later than its journal a writer's process may seem to start (clock granularity)."""


def process_running(pid: int, created_wall_ns: int | None = None) -> bool | None:
    """Whether process ``pid`` runs (None: cannot tell). A zombie has ended; a process started
    after ``created_wall_ns`` (its journal's creation) is another one that took the number."""
    try:
        process = psutil.Process(pid)
        if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        if created_wall_ns is not None:
            return process.create_time() <= created_wall_ns / 1e9 + STARTED_SLACK_S
        return True
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists, owned by someone else
    except psutil.Error:
        return None


def owned_by_this_user(pid: int) -> bool:
    """Whether ``pid`` runs as this process's user: trt-otel never signals anyone else's."""
    try:
        return psutil.Process(pid).uids().real == os.getuid()
    except psutil.Error:
        return False


def holds_write_lock(pid: int, path: os.PathLike[str] | str) -> bool | None:
    """Whether process ``pid`` is the writer of the journal ``path``: it holds the file (the
    same file: device and inode, not the same name) open for writing, through a descriptor that
    holds the journal's write lock (the exclusive ``flock`` that Python's journal writer and the
    C++ monitor take for their life, see :mod:`trt_otel.core.journal`). Holding it open is not
    enough: a reader (``tail -f``, another ``watch``) holds it open too, and a header is text
    anyone can write. None where it cannot be told (no ``/proc``: the locks a process holds
    are read from ``/proc/PID/fdinfo``, Linux 3.15 and later; descriptors not ours to read)."""
    try:
        target = os.stat(path)
    except OSError:
        return False
    if not os.path.isdir("/proc/self/fdinfo"):
        return None
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    for name in names:
        try:
            opened = os.stat(os.path.join(fd_dir, name))  # stat only: a FIFO never blocks
            if (opened.st_dev, opened.st_ino) != (target.st_dev, target.st_ino):
                continue
            with open(f"/proc/{pid}/fdinfo/{name}", encoding="ascii", errors="replace") as info:
                lines = info.read(1 << 16).splitlines()
        except OSError:  # closed meanwhile, or not ours to look at
            continue
        if _writes_and_holds_the_lock(lines):
            return True
    return False


def _writes_and_holds_the_lock(fdinfo: list[str]) -> bool:
    """Whether a descriptor, as ``/proc/PID/fdinfo/N`` describes it, is open for writing and
    holds an exclusive ``flock`` (``lock:\t1: FLOCK  ADVISORY  WRITE 4242 fe:00:123 0 EOF``;
    a lock is listed only under the descriptor whose open file holds it)."""
    writing = locked = False
    for line in fdinfo:
        key, _, value = line.partition(":")
        if key == "flags":
            with contextlib.suppress(ValueError):
                writing = (int(value.strip(), 8) & os.O_ACCMODE) != os.O_RDONLY
        elif key == "lock":
            fields = value.split()
            locked = locked or (fields[1:2] == ["FLOCK"] and fields[3:4] == ["WRITE"])
    return writing and locked


def polling(pid: int, created_wall_ns: int | None = None) -> GoneWithin:
    """A :data:`GoneWithin` for a process that is not our child: polls :func:`process_running`."""

    def gone_within(timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while process_running(pid, created_wall_ns) is not False:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    return gone_within


def stop_process(pid: int, gone_within: GoneWithin, kill_after_s: float) -> str | None:
    """SIGTERM, then SIGKILL if ``pid`` is still there ``kill_after_s`` later. Returns the last
    signal sent, None when the process had already ended."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    if gone_within(kill_after_s):
        return "SIGTERM"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    gone_within(10.0)
    return "SIGKILL"
