"""The supervisor: a build in a worker process that can be stopped from outside.

TensorRT honours a cancel only at its next ``step_complete``, and real builds go silent for
minutes. So the build runs in a worker process, and everything else (the event log, projections,
policies) stays in this one. When a cancelled build has not stopped within the grace period, the
worker is terminated (SIGTERM, then SIGKILL), which frees the GPU at once.

How the two processes talk:

- The worker's monitor is an ordinary :class:`BuildMonitor` (anomaly checks included); a follower
  forwards its events through a pipe, and this process *adopts* them into its own log (they keep
  their stamps and get this log's ``seq``). ``CLOCK_MONOTONIC`` is system-wide, so the worker's
  times and this process's policies agree.
- A cancel goes the other way through shared memory: the reason, then a flag. The worker's
  ``step_complete`` reads the flag (a memory read, no message to wait for), so the very next step
  after a decision answers False. The cancel event itself is recorded here, at decision time, so
  it shows everywhere even while TensorRT is silent.
- The worker ignores SIGINT: Ctrl-C in a terminal reaches the whole process group, and deciding
  what it means is this process's job.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.connection
import operator
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trt_otel.events import (
    EVENT_TYPES,
    BuildStarted,
    CancelRequested,
    Event,
    fast_constructor,
)
from trt_otel.monitor import BuildMonitor

_logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
DEFAULT_KILL_AFTER_S = 5.0
_NOTE_BYTES = 4096

Target = Callable[..., Any]


@dataclass(frozen=True, slots=True)
class IsolatedResult:
    """How the worker ended."""

    value: Any
    """What the target returned (None when it did not return)."""
    returned: bool
    error: str | None
    """The exception the target raised in the worker, as text."""
    error_type: str | None
    exitcode: int | None
    stopped_with: str | None
    """The last signal this process sent to stop the worker (``SIGTERM`` or ``SIGKILL``)."""
    interrupted: bool
    """Stopped at once on the user's second interrupt, rather than after the grace period."""
    pid: int | None

    @property
    def died(self) -> str | None:
        """How the worker died on its own, if it did: ``killed by SIGKILL``, ``exit code 1``."""
        if self.returned or self.error is not None or self.stopped_with is not None:
            return None
        if self.exitcode is None:
            return "vanished"
        if self.exitcode < 0:
            try:
                return f"killed by {signal.Signals(-self.exitcode).name}"
            except ValueError:
                return f"killed by signal {-self.exitcode}"
        return f"exit code {self.exitcode}"


# -- the worker side ---------------------------------------------------------------------------


class WorkerMonitor(BuildMonitor):
    """The monitor in the worker: answers False once the supervisor's flag is up."""

    def __init__(self, flag: Any, note: Any) -> None:
        super().__init__()
        self._flag = flag
        self._note = note

    def step_complete(self, phase_name: str, step: int) -> bool:
        if self._flag.value and not self._cancelled:
            self._take_supervisor_cancel()
        return super().step_complete(phase_name, step)

    def _take_supervisor_cancel(self) -> None:
        try:
            note = json.loads(bytes(self._note.value).decode("utf-8", "replace"))
            self.cancel(
                str(note["reason"]),
                source=str(note["source"]),
                timeout=bool(note["timeout"]),
                policy=str(note.get("policy", "")),
            )
        except Exception:  # a torn note still cancels: never let this reach TensorRT
            self.cancel("cancelled by the supervisor", source="supervisor")


# Events cross the pipe as plain tuples (type, then every field in order): pickling a tuple of
# ints and strings is C all the way, while pickling a slotted dataclass goes through copyreg
# in Python, and that work would compete with TensorRT's callbacks for the worker's GIL.
_FIELDS = {
    cls: operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))
    for cls in EVENT_TYPES.values()
}
_MAKERS = {cls.type: fast_constructor(cls) for cls in EVENT_TYPES.values()}


def encode(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    return [(event.type, *_FIELDS[type(event)](event)) for event in events]


def decode(records: Sequence[tuple[Any, ...]]) -> list[Event]:
    return [_MAKERS[record[0]](*record[1:]) for record in records]


class _Forwarder:
    """Sends the worker's events to the supervisor. Build start, end and cancel are the
    supervisor's to record... except the end, which only the worker knows."""

    name = "forwarder"

    def __init__(self, connection: multiprocessing.connection.Connection) -> None:
        self._connection = connection

    def handle(self, events: Sequence[Event]) -> None:
        batch = [e for e in events if not isinstance(e, BuildStarted | CancelRequested)]
        if batch:
            self._connection.send(encode(batch))

    def close(self) -> None:
        pass


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this worker if the supervisor dies (even by SIGKILL), so an
    orphaned build never holds the GPU. Linux only; elsewhere the supervisor's end is noticed
    at the next event sent."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(1)


def _worker_main(
    connection: multiprocessing.connection.Connection,
    flag: Any,
    note: Any,
    target: Target,
    args: tuple[Any, ...],
    *,
    parent_pid: int,
) -> None:
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    monitor = WorkerMonitor(flag, note)
    monitor.log.follow(_Forwarder(connection), capacity=10_000_000, min_interval_s=0.05)
    message: tuple[Any, ...]
    try:
        message = ("result", target(monitor, *args))
    except BaseException as error:
        message = ("error", type(error).__name__, str(error))
    monitor.log.close(timeout_s=60.0)
    try:
        connection.send(message)
    except Exception as error:  # an unpicklable result: say so rather than vanish
        connection.send(("error", type(error).__name__, f"cannot return the result: {error}"))
    connection.close()


# -- the supervisor side -----------------------------------------------------------------------


class _Inbox:
    def __init__(self) -> None:
        self.value: Any = None
        self.returned = False
        self.error: str | None = None
        self.error_type: str | None = None
        self.garbled: str | None = None


def _read_worker(
    connection: multiprocessing.connection.Connection, monitor: BuildMonitor, inbox: _Inbox
) -> None:
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        except Exception as error:  # a garbled message: the rest cannot be trusted either
            # Most likely the worker was killed mid-send, which its exit status will say; if it
            # exits cleanly anyway, this is the reason its result is missing.
            inbox.garbled = f"unreadable message from the build's process ({error})"
            return
        if isinstance(message, list):
            monitor.log.adopt(decode(message))
        elif message[0] == "result":
            inbox.value, inbox.returned = message[1], True
        elif message[0] == "error":
            inbox.error_type, inbox.error = message[1], message[2]


def run_isolated(
    target: Target,
    *args: Any,
    monitor: BuildMonitor,
    grace_s: float = DEFAULT_GRACE_S,
    kill_after_s: float = DEFAULT_KILL_AFTER_S,
    poll_s: float = 0.1,
) -> IsolatedResult:
    """Run ``target(worker_monitor, *args)`` in a worker process, with ``monitor`` (here) fed
    every event of the worker's monitor.

    ``target`` must be importable by name (a module-level function) and its arguments and
    result picklable. A cancel of ``monitor`` (a policy, a signal, ``monitor.cancel``) reaches
    the worker's next ``step_complete``; if the worker is still running ``grace_s`` later, it is
    sent SIGTERM, and SIGKILL ``kill_after_s`` after that. A KeyboardInterrupt here (a second
    Ctrl-C) stops the worker the same way at once.
    """
    context = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    # Raw shared memory, no lock: one writer (this process), and a byte flag written last.
    flag: Any = context.Value(ctypes.c_byte, 0, lock=False)
    note: Any = context.Array(ctypes.c_char, _NOTE_BYTES, lock=False)
    cancelled_at: list[float] = []

    def pass_cancel_on(event: CancelRequested) -> None:
        payload = {
            "reason": event.reason[:1000],
            "source": event.source[:100],
            "timeout": event.timeout,
            "policy": event.policy[:1000],
        }
        note.value = json.dumps(payload).encode()[: _NOTE_BYTES - 1]
        flag.value = 1
        cancelled_at.append(time.monotonic())

    monitor.on_cancel(pass_cancel_on)
    if monitor.cancelled:  # cancelled before the worker existed: it must not start building
        flag.value = 1
        cancelled_at.append(time.monotonic())
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(
        target=_worker_main,
        args=(sending, flag, note, target, args),
        kwargs={"parent_pid": os.getpid()},
        name="trt-otel-builder",
    )
    inbox = _Inbox()
    reader = threading.Thread(
        target=_read_worker, args=(receiving, monitor, inbox), name="trt-otel-worker-events"
    )
    stopped_with: str | None = None
    interrupted = False
    process.start()
    sending.close()
    reader.start()
    try:
        while process.is_alive():
            process.join(poll_s)
            if cancelled_at and time.monotonic() - cancelled_at[0] >= grace_s:
                if process.is_alive():
                    stopped_with = _stop(process, kill_after_s)
                break
    except KeyboardInterrupt:
        interrupted = True
        stopped_with = _stop(process, kill_after_s)
    # What the worker sent before it ended is still in the pipe: take all of it.
    reader.join(30.0)
    receiving.close()
    if inbox.garbled is not None and not inbox.returned and process.exitcode == 0:
        inbox.error_type, inbox.error = "WorkerProtocolError", inbox.garbled
    return IsolatedResult(
        value=inbox.value,
        returned=inbox.returned,
        error=inbox.error,
        error_type=inbox.error_type,
        exitcode=process.exitcode,
        stopped_with=stopped_with,
        interrupted=interrupted,
        pid=process.pid,
    )


def _stop(process: Any, kill_after_s: float) -> str | None:
    """SIGTERM, then SIGKILL if the worker is still there ``kill_after_s`` later. Returns the
    last signal sent (None when it had already ended)."""
    if not process.is_alive():
        return None
    sent = "SIGTERM"
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    process.join(kill_after_s)
    if process.is_alive():
        sent = "SIGKILL"
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.join(10.0)
    return sent
