"""The supervisor: a build in a worker process that can be stopped from outside.

TensorRT honours a cancel only at its next ``step_complete``, and real builds go silent for
minutes. So the build runs in a worker process, and everything else (the event log, projections,
policies) stays in this one. When a cancelled build has not stopped within the grace period, the
worker is terminated (SIGTERM, then SIGKILL), which frees the GPU at once.

How the two processes talk:

- The worker's monitor (:class:`RecordingMonitor`) only records each callback, as a tuple with
  its time and thread, and a thread sends them through a pipe in batches. This process replays
  them into its own monitor (:meth:`BuildMonitor.replay`): the protocol checks, the events and
  every projection happen here, as if the callbacks had been made here, at the times they were
  made. ``CLOCK_MONOTONIC`` is system-wide, so the worker's times and this process's policies
  agree. The builder's process does nothing per callback but an append.
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
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trt_otel.events import CancelRequested, Outcome
from trt_otel.log import current_thread_name
from trt_otel.monitor import BuildMonitor, CallbackRecord

_logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
DEFAULT_KILL_AFTER_S = 5.0
_NOTE_BYTES = 4096

Target = Callable[..., Any]


class StopNow(KeyboardInterrupt):
    """A second SIGTERM: stop the build's process at once, as a cancel (exit 3), not as the
    user's interrupt (exit 130). A KeyboardInterrupt, so everything that stops on Ctrl-C stops
    on it too."""

    def __init__(self, signal_name: str = "SIGTERM") -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


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
    stopped_now: str | None = None
    """Stopped at once on a second signal that is not the user's (``SIGTERM``)."""

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


@dataclass(frozen=True, slots=True)
class OddArgument:
    """A callback argument of a type that should not cross the pipe, as its text. It is not
    a ``str``, so the supervisor's monitor flags it as the invalid argument it was."""

    type_name: str
    text: str

    def __str__(self) -> str:
        return self.text


_PLAIN = (str, int, float, bool, bytes, type(None))
_wall_ns, _mono_ns, _perf_ns = time.time_ns, time.monotonic_ns, time.perf_counter_ns


def _plain(value: object) -> object:
    return value if type(value) in _PLAIN else OddArgument(type(value).__name__, repr(value))


class RecordingMonitor(BuildMonitor):
    """The monitor in the build's worker: each callback is a tuple appended to a deque, no
    more (an append is atomic, so no lock either). Everything the monitor does with a callback,
    protocol checks and the fold included, happens in the supervisor, which replays the
    records into its own monitor with their times and threads (:meth:`BuildMonitor.replay`).

    ``step_complete`` answers False once the supervisor's flag is up: a memory read.
    """

    def __init__(self, flag: Any, note: Any) -> None:
        super().__init__()
        self._flag = flag
        self._note = note
        self.records: deque[CallbackRecord] = deque()

    def _record(self, kind: str, *arguments: Any) -> None:
        self.records.append((kind, _wall_ns(), _mono_ns(), current_thread_name(), *arguments))

    # The three callbacks are written out in full, without helper calls on the usual path:
    # each call costs a Python function call's time, which is what this monitor is about.

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        began_ns = _perf_ns()
        try:
            if (
                type(phase_name) is str
                and type(num_steps) is int
                and (parent_phase is None or type(parent_phase) is str)
            ):
                stamp = (_wall_ns(), _mono_ns(), current_thread_name())
                self.records.append(("phase_start", *stamp, phase_name, parent_phase, num_steps))
            else:
                self._record(
                    "phase_start", _plain(phase_name), _plain(parent_phase), _plain(num_steps)
                )
            self.callbacks_total += 1
            self.callback_ns_total += _perf_ns() - began_ns
        except BaseException:  # never into TensorRT; the supervisor sees the gap in the build
            self.internal_errors += 1

    def step_complete(self, phase_name: str, step: int) -> bool:
        began_ns = _perf_ns()
        try:
            if type(phase_name) is str and type(step) is int:
                self.records.append(
                    ("step", _wall_ns(), _mono_ns(), current_thread_name(), phase_name, step)
                )
            else:
                self._record("step", _plain(phase_name), _plain(step))
            self.callbacks_total += 1
            self.callback_ns_total += _perf_ns() - began_ns
        except BaseException:
            self.internal_errors += 1
        return not self._flag.value

    def phase_finish(self, phase_name: str) -> None:
        began_ns = _perf_ns()
        try:
            name = phase_name if type(phase_name) is str else _plain(phase_name)
            self.records.append(
                ("phase_finish", _wall_ns(), _mono_ns(), current_thread_name(), name)
            )
            self.callbacks_total += 1
            self.callback_ns_total += _perf_ns() - began_ns
        except BaseException:
            self.internal_errors += 1

    def log_message(self, severity: str, message: str) -> None:
        with contextlib.suppress(Exception):
            self._record("log", str(severity), str(message))

    @property
    def cancelled(self) -> bool:
        """Whether the supervisor asked for a cancel (so ``end_with_result(None)``, inherited,
        ends the build as a cancel rather than a failure)."""
        return bool(self._flag.value)

    def end(
        self, outcome: Outcome | None = None, detail: str = "", error_type: str | None = None
    ) -> Outcome:
        if outcome is None:
            outcome = self._cancel_outcome() if self._flag.value else Outcome.SUCCESS
        self._record("end", outcome.value, detail, error_type)
        self._ended = True
        return outcome

    def _cancel_outcome(self) -> Outcome:
        try:
            note = json.loads(bytes(self._note.value).decode("utf-8", "replace"))
            return Outcome.TIMEOUT if note.get("timeout") else Outcome.CANCELLATION
        except Exception:  # a torn note is still a cancel
            return Outcome.CANCELLATION


def _forward(
    monitor: RecordingMonitor,
    connection: multiprocessing.connection.Connection,
    done: threading.Event,
    interval_s: float = 0.05,
) -> None:
    """The worker's only other thread: send the records in batches (tuples of ints and
    strings pickle in C, so this competes little with the callbacks for the GIL)."""
    records = monitor.records
    while True:
        finished = done.wait(interval_s)
        batch = []
        with contextlib.suppress(IndexError):
            while True:
                batch.append(records.popleft())
        if batch:
            connection.send(("records", batch, monitor.callbacks_total, monitor.callback_ns_total))
        if finished and not records:
            return


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
    monitor = RecordingMonitor(flag, note)
    done = threading.Event()
    forwarder = threading.Thread(
        target=_forward, args=(monitor, connection, done), name="trt-otel-forwarder"
    )
    forwarder.start()
    message: tuple[Any, ...]
    try:
        message = ("result", target(monitor, *args))
    except BaseException as error:
        message = ("error", type(error).__name__, str(error))
    done.set()
    forwarder.join()
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
        if message[0] == "records":
            _, records, callbacks, callback_ns = message
            for record in records:
                monitor.replay(record)
            # The cost that matters is the callbacks' own, in the worker.
            monitor.callbacks_total, monitor.callback_ns_total = callbacks, callback_ns
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
        Ctrl-C) stops the worker the same way at once; so does a :class:`StopNow` (a second
    SIGTERM), which the result tells apart (``stopped_now``).
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
    stopped_now: str | None = None
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
    except StopNow as stop:
        stopped_now = stop.signal_name
        stopped_with = _stop(process, kill_after_s)
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
        stopped_now=stopped_now,
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
