"""Stopping a build's process from outside, once: is it still there, and SIGTERM, then SIGKILL.

TensorRT honours a cancel only at its next callback, and a real build can be silent for minutes:
a build that must stop now is stopped from outside its process. The worker of ``build``, the
program of ``run`` and a journal's writer followed by ``watch`` are all stopped by
:func:`stop_process`, and :func:`process_running` is the one answer to "is that process still
the one we mean" (psutil: no hand-parsed ``/proc``).
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


def holds_open(pid: int, path: os.PathLike[str] | str) -> bool | None:
    """Whether process ``pid`` has the file ``path`` open (the same file: device and inode, not
    the same name); None where its open files cannot be read. A journal's writer holds its
    journal open for the whole build, so only that process is provably the writer a header
    names: a header is text anyone can write."""
    try:
        target = os.stat(path)
    except OSError:
        return False
    fd_dir = f"/proc/{pid}/fd"
    if os.path.isdir("/proc/self/fd"):
        try:
            names = os.listdir(fd_dir)
        except FileNotFoundError:
            return False
        except OSError:
            return None
        for name in names:
            with contextlib.suppress(OSError):  # closed meanwhile, or not ours to look at
                opened = os.stat(os.path.join(fd_dir, name))  # stat only: a FIFO never blocks
                if (opened.st_dev, opened.st_ino) == (target.st_dev, target.st_ino):
                    return True
        return False
    try:
        files = psutil.Process(pid).open_files()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return None
    for file in files:
        with contextlib.suppress(OSError):
            if os.path.samefile(file.path, path):
                return True
    return False


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
