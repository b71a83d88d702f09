"""The build's worker process: TensorRT's callbacks recorded, and nothing more.

The worker runs the build (the supervisor, :mod:`trt_otel.capture.supervisor`, runs everything
else). Its monitor (:class:`RecordingMonitor`) appends each callback, as a tuple with its time
and thread, to a deque; one thread (:func:`forward`) appends them in compact frames to the spool
file the supervisor reads (:mod:`trt_otel.capture.transport`). A cancel arrives through shared
memory: the very next ``step_complete`` reads the flag and answers False. The worker ignores
Ctrl-C, a hangup and a scheduler's time-limit warning (the supervisor decides what they mean),
dies with its supervisor, and imports what its target needs and no more: it starts bare, and
every module is paid for by every build.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

from trt_otel.capture.binding import ProgressMonitorBase
from trt_otel.capture.transport import (
    MAX_RECORDS_PER_FRAME,
    SpoolWriter,
    encode_frame,
)
from trt_otel.core.events import Outcome
from trt_otel.core.exiting import exit_without_teardown
from trt_otel.core.log import current_thread_name

if TYPE_CHECKING:
    # The monitor's record is a type here: the worker needs none of the monitor's machinery.
    from trt_otel.capture.monitor import CallbackRecord

NOTE_BYTES = 4096
"""The shared memory a cancel's note (its reason, whether it is a timeout) is written to."""
FORWARD_INTERVAL_S = 0.02
"""How often the worker's forwarder appends what was recorded (an idle tick costs nothing)."""
FRAMES_PER_WRITE = 16
"""Frames the forwarder joins into one write (8,192 records at most, about half a MiB)."""

Target = Callable[..., Any]
"""A build: called in the worker with its monitor and its arguments."""


@dataclass(frozen=True, slots=True)
class OddArgument:
    """A callback argument of a type that should not cross the pipe, as its text. It is not
    a ``str``, so the supervisor's monitor flags it as the invalid argument it was."""

    type_name: str
    text: str

    def __str__(self) -> str:
        return self.text


_wall_ns, _mono_ns = time.time_ns, time.monotonic_ns
_PLAIN = (str, int, float, bool, bytes, type(None))


def _plain(value: object) -> object:
    return value if type(value) in _PLAIN else OddArgument(type(value).__name__, repr(value))


class RecordingMonitor(ProgressMonitorBase):
    """The monitor in the build's worker: each callback is a tuple appended to a deque, no
    more (an append is atomic, so no lock either). Everything the monitor does with a callback,
    protocol checks and the fold included, happens in the supervisor, which replays the
    records into its own monitor with their times and threads (:meth:`BuildMonitor.record`).

    ``step_complete`` answers False once the supervisor's flag is up: a memory read.
    """

    def __init__(self, flag: Any, note: Any, *, backend: str | None = None) -> None:
        """``backend``: the library to be an ``IProgressMonitor`` of (see
        :mod:`~trt_otel.capture.binding`)."""
        self._init_native()
        self._flag = flag
        self._note = note
        self.records: deque[CallbackRecord] = deque()
        self._append = self.records.append
        self.not_callbacks = 0
        """Records that are not callbacks (log messages, the end): the forwarder counts the
        callbacks from the records, so that a callback need not."""
        self._heap_frozen = False
        self._ended = False
        self._outcome_detail = ""
        self.internal_errors = 0
        self.callbacks_total = 0
        """Counted by the forwarder, from the records (see :func:`forward`)."""
        self.callback_ns_total = 0

    def _record(self, kind: str, *arguments: Any) -> None:
        self._append((kind, _wall_ns(), _mono_ns(), current_thread_name(), *arguments))

    # The three callbacks are written out in full, without helper calls on the usual path:
    # each call costs a Python function call's time, which is what this monitor is about.

    # A record's monotonic stamp is also when its callback began, for the monitor's own cost:
    # one clock read less per callback. Every time trt-otel measures is on this clock (on
    # Linux, the clock ``perf_counter`` reads too).

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        mono_ns = _mono_ns()
        if not self._heap_frozen:
            # What exists at the build's first callback (the builder library, the parsed
            # network) outlives the build: out of the collector's sight, so the collections the
            # records set off do not walk it each time (a third of a callback's cost at full
            # speed). Only here, in the worker trt-otel owns: never in a user's process.
            self._heap_frozen = True
            gc.freeze()
        try:
            if (
                type(phase_name) is str
                and type(num_steps) is int
                and (parent_phase is None or type(parent_phase) is str)
            ):
                self._append(
                    (
                        "phase_start",
                        _wall_ns(),
                        mono_ns,
                        current_thread_name(),
                        phase_name,
                        parent_phase,
                        num_steps,
                    )
                )
            else:
                self._record(
                    "phase_start", _plain(phase_name), _plain(parent_phase), _plain(num_steps)
                )
            self.callback_ns_total += _mono_ns() - mono_ns
        except BaseException:  # never into TensorRT; the supervisor sees the gap in the build
            self.internal_errors += 1

    def step_complete(self, phase_name: str, step: int) -> bool:
        mono_ns = _mono_ns()
        try:
            if type(phase_name) is str and type(step) is int:
                self._append(("step", _wall_ns(), mono_ns, current_thread_name(), phase_name, step))
            else:
                self._record("step", _plain(phase_name), _plain(step))
            self.callback_ns_total += _mono_ns() - mono_ns
        except BaseException:
            self.internal_errors += 1
        return not self._flag.value

    def phase_finish(self, phase_name: str) -> None:
        mono_ns = _mono_ns()
        try:
            name = phase_name if type(phase_name) is str else _plain(phase_name)
            self._append(("phase_finish", _wall_ns(), mono_ns, current_thread_name(), name))
            self.callback_ns_total += _mono_ns() - mono_ns
        except BaseException:
            self.internal_errors += 1

    def log_message(self, severity: str, message: str) -> None:
        with contextlib.suppress(Exception):
            self._record("log", str(severity), str(message))
            self.not_callbacks += 1

    @property
    def cancelled(self) -> bool:
        """Whether the supervisor asked for a cancel (so ``end_with_result(None)`` ends the
        build as a cancel rather than a failure)."""
        return bool(self._flag.value)

    def record_output(self, attributes: dict[str, Any]) -> None:
        """What the build produced, for the supervisor's monitor to record before the end."""
        self._record("output", dict(attributes))
        self.not_callbacks += 1

    def end(
        self, outcome: Outcome | None = None, detail: str = "", error_type: str | None = None
    ) -> Outcome:
        if outcome is None:
            outcome = self._cancel_outcome() if self._flag.value else Outcome.SUCCESS
        self._record("end", outcome.value, detail, error_type)
        self.not_callbacks += 1
        self._ended = True
        self._outcome_detail = detail
        return outcome

    @property
    def outcome_detail(self) -> str:
        return self._outcome_detail

    def _cancel_outcome(self) -> Outcome:
        try:
            note = json.loads(bytes(self._note.value).decode("utf-8", "replace"))
            return Outcome.TIMEOUT if note.get("timeout") else Outcome.CANCELLATION
        except Exception:  # a torn note is still a cancel
            return Outcome.CANCELLATION


def forward(
    monitor: RecordingMonitor,
    spool: SpoolWriter,
    done: threading.Event,
    interval_s: float = FORWARD_INTERVAL_S,
) -> None:
    """The worker's only other thread: append the records to the spool in frames. Each round
    takes a watermark before its first record and puts it on its last frame (the others
    carry 0), so every callback stamped before it is in that frame or an earlier one. Once a
    cancel is asked for, an idle tick writes an empty frame, so the supervisor learns that no
    callback it has not seen came before the cancel."""
    records = monitor.records
    flag = monitor._flag
    popleft = records.popleft
    taken = 0
    while True:
        finished = done.wait(interval_s)
        wrote = False
        if records:
            # One watermark per round, on its last frame only: a round can take more frames
            # than one (512 records each), and the records left for the next frame were
            # stamped before the watermark too.
            watermark_ns = _mono_ns()
            frames = []
            while records:
                # Taken from the left in C; only this thread takes, so the count holds (the
                # builder's threads append on the right meanwhile).
                batch = list(islice(iter(popleft, None), min(len(records), MAX_RECORDS_PER_FRAME)))
                last = not records
                # The callbacks are counted here, from the records, not by each callback.
                taken += len(batch)
                monitor.callbacks_total = max(0, taken - monitor.not_callbacks)
                frames.append(
                    encode_frame(
                        batch,
                        watermark_ns if last else 0,
                        monitor.callbacks_total,
                        monitor.callback_ns_total,
                    )
                )
                if len(frames) == FRAMES_PER_WRITE:
                    spool.write(b"".join(frames))
                    frames.clear()
            if frames:
                spool.write(b"".join(frames))
            wrote = True
        if finished:
            watermark_ns = _mono_ns()
            spool.write(
                encode_frame(
                    [], watermark_ns, monitor.callbacks_total, monitor.callback_ns_total, final=True
                )
            )
            return
        if not wrote and flag.value:
            spool.write(
                encode_frame([], _mono_ns(), monitor.callbacks_total, monitor.callback_ns_total)
            )


WORKER_IGNORES = (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
"""What the worker ignores: a terminal and a scheduler send them to the whole process group."""


def read_job(path: str) -> tuple[Target, tuple[Any, ...]]:
    """The worker's job (see :func:`_write_job`), its file unlinked once read."""
    try:
        with open(path, "rb") as handle:
            target, args = pickle.load(handle)  # written by this build's supervisor, 0600
    finally:
        unlink_quietly(path)
    return target, args


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


def worker_main(
    connection: multiprocessing.connection.Connection,
    flag: Any,
    note: Any,
    *,
    job_path: str,
    spool_path: str,
    parent_pid: int,
    backend: str | None,
) -> None:
    _die_with_parent(parent_pid)
    # Ctrl-C, a hangup and a scheduler's time-limit warning are the supervisor's to decide;
    # blocked since this process began (see _started_with_them_blocked), ignored from here.
    for number in WORKER_IGNORES:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORES)
    # Everything imported so far lives as long as the process: out of the collector's sight,
    # so the collections that the callbacks' records set off do not walk it again and again.
    gc.freeze()
    # Bound to the library the build uses, or to none: a simulated build must not wait for a
    # builder library to import before its first callback.
    monitor = RecordingMonitor(flag, note, backend=backend)
    spool = SpoolWriter(spool_path)
    connection.send(("spool_open",))  # the supervisor may now unlink its name
    done = threading.Event()
    forwarder = threading.Thread(
        target=forward, args=(monitor, spool, done), name="trt-otel-forwarder"
    )
    forwarder.start()
    message: tuple[Any, ...]
    try:
        target, args = read_job(job_path)
        message = ("result", target(monitor, *args))
    except BaseException as error:
        message = ("error", type(error).__name__, str(error))
    done.set()
    forwarder.join()
    spool.close()
    try:
        connection.send(message)
    except Exception as error:  # an unpicklable result: say so rather than vanish
        connection.send(("error", type(error).__name__, f"cannot return the result: {error}"))
    connection.close()
    # The supervisor waits for the worker's end: no teardown (else the worker ends as a
    # process of multiprocessing does).
    exit_without_teardown(0)


def unlink_quietly(path: str) -> str:
    with contextlib.suppress(OSError):
        os.unlink(path)
    return ""
