"""The supervisor: a build in a worker process that can be stopped from outside.

TensorRT honours a cancel only at its next ``step_complete``, and real builds go silent for
minutes. So the build runs in a worker process, and everything else (the event log, projections,
policies) stays in this one. When a cancelled build has not stopped within the grace period, the
worker is terminated (SIGTERM, then SIGKILL), which frees the GPU at once.

How the two processes talk:

- The worker's monitor (:class:`~trt_otel.capture.worker.RecordingMonitor`) only records each
  callback, as a tuple with its time and thread, and a thread appends them in compact frames to a
  spool file (:mod:`trt_otel.capture.transport`: why a file). This process reads the frames at its
  own pace and replays them into its own monitor (:meth:`BuildMonitor.record`): the protocol
  checks, the events and every projection happen here, as if the callbacks had been made here, at
  the times they were made. ``CLOCK_MONOTONIC`` is system-wide, so the worker's times and this
  process's policies agree. The builder's process does nothing per callback but an append, never
  waits for this one, and keeps one frame in memory; this one reads a frame only when its
  followers have room for it, so a backlog waits on disk, not in either process.
- A cancel goes the other way through shared memory: the reason, then a flag. The worker's
  ``step_complete`` reads the flag (a memory read, no message to wait for), so the very next step
  after a decision answers False. The cancel event is stamped here at decision time and held
  (:attr:`BuildMonitor.hold_cancels`) until the replay reaches that time: after every callback
  made before it, before every one made after, even when the replay is seconds behind. A
  silent worker still says how far it got (an empty frame), so the cancel shows at once.
- The pipe carries only the worker's result.
- The worker ignores SIGINT, SIGHUP and SIGUSR1 (blocked from its start, ignored once it runs):
  Ctrl-C in a terminal, a hangup and a scheduler's time-limit warning reach the whole process
  group, and deciding what they mean is this process's job.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trt_otel.capture.transport import (
    SpoolError,
    SpoolReader,
)
from trt_otel.capture.worker import (
    FORWARD_INTERVAL_S,
    NOTE_BYTES,
    WORKER_IGNORES,
    Target,
    unlink_quietly,
    worker_main,
)
from trt_otel.core.events import CancelRequested, CancelSource

if TYPE_CHECKING:
    # The worker imports this module too: it records, and needs none of the monitor's machinery.
    from trt_otel.capture.monitor import BuildMonitor
    from trt_otel.core.followers import FollowerWorker

_logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0
DEFAULT_KILL_AFTER_S = 5.0
FOLLOWER_ROOM = 50_000
"""Replay waits while a follower has more events than this queued: the backlog stays on disk."""
HELD_CANCEL_PATIENCE_S = 0.5
"""A held cancel goes into the log at the latest this long after its decision once the spool
is read to its end (a worker that cannot say how far it got, stopped or dying)."""


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
    grace_s: float = DEFAULT_GRACE_S
    """The grace the cancel had before the worker was stopped (a signal's may be shorter)."""

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


@contextlib.contextmanager
def _started_with_them_blocked() -> Iterator[None]:
    """:data:`WORKER_IGNORES` blocked while the worker is started. It inherits the mask through
    its exec, so a Ctrl-C to the whole group while it starts (unpickling, importing, before it
    ignores them) waits in it instead of killing it with a traceback; here they are delivered
    as soon as it has started. Only the calling thread's mask changes: it is the one the worker
    inherits, and the process's other threads take signals meanwhile as before."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORES)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _write_job(target: Target, args: tuple[Any, ...]) -> str:
    """The target and its arguments, pickled into a file of their own (0600) for the worker:
    not through the pipe that starts it, which ``multiprocessing`` writes while it still holds
    the pipe's other end, so that a worker killed as it starts left this process blocked for
    ever on a job larger than the pipe's buffer (the model's bytes, a simulator's plan)."""
    descriptor, path = tempfile.mkstemp(prefix="trt-otel-", suffix=".job")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            pickle.dump((target, args), handle, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:
        unlink_quietly(path)
        raise
    return path


# -- the supervisor side -----------------------------------------------------------------------


class _Inbox:
    def __init__(self) -> None:
        self.value: Any = None
        self.returned = False
        self.error: str | None = None
        self.error_type: str | None = None
        self.garbled: str | None = None
        self.spool_open = threading.Event()


def _read_worker(connection: multiprocessing.connection.Connection, inbox: _Inbox) -> None:
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
        if message[0] == "spool_open":
            inbox.spool_open.set()
        elif message[0] == "result":
            inbox.value, inbox.returned = message[1], True
        elif message[0] == "error":
            inbox.error_type, inbox.error = message[1], message[2]


class _Replay:
    """This process's end of the spool: frames into the monitor, on a thread of its own, each
    only when the log's followers have room for it."""

    def __init__(self, reader: SpoolReader, monitor: BuildMonitor, inbox: _Inbox) -> None:
        self.reader = reader
        self.monitor = monitor
        self.inbox = inbox
        self.worker_ended = threading.Event()
        """Set once the worker process has exited: what the spool holds then is all there is."""
        self.finished = False
        self.progress = 0
        """Frames replayed so far (the supervisor waits while this moves)."""
        self._stuck: set[FollowerWorker] = set()
        self._seen: dict[FollowerWorker, tuple[int, float]] = {}
        self.thread = threading.Thread(target=self._run, name="trt-otel-worker-events")

    def _run(self) -> None:
        monitor = self.monitor
        try:
            while True:
                frames = self.reader.read(max_frames=1)  # each replayed as soon as decoded
                for frame in frames:
                    self._wait_for_room()
                    monitor.record(frame.records)
                    # The cost that matters is the callbacks' own, in the worker.
                    monitor.callbacks_total = frame.callbacks_total
                    monitor.callback_ns_total = frame.callback_ns_total
                    held = monitor.held_cancel
                    if held is not None and frame.watermark_ns > held.mono_ns:
                        monitor.release_cancel()
                    self.progress += 1
                    if frame.final:
                        return
                if frames:
                    continue
                if self.worker_ended.is_set():
                    if not self.reader.read(max_frames=1):  # nothing came in meanwhile
                        if self.reader.torn:
                            self.inbox.garbled = "the build's process stopped mid-write"
                        return
                    continue
                held = monitor.held_cancel
                if held is not None and time.monotonic_ns() - held.mono_ns > (
                    HELD_CANCEL_PATIENCE_S * 1e9
                ):
                    monitor.release_cancel()
                self.worker_ended.wait(FORWARD_INTERVAL_S / 2)
        except SpoolError as error:
            self.inbox.garbled = f"unreadable records from the build's process ({error})"
        finally:
            monitor.release_cancel()
            self.finished = True

    def _wait_for_room(self) -> None:
        """Wait while a follower is far behind and catching up. One that has handled nothing
        for a second (hung) is no longer waited for: its own queue's bound drops and counts."""
        stuck = self._stuck
        while True:
            behind = [
                w for w in self.monitor.log.workers if w.queued > FOLLOWER_ROOM and w not in stuck
            ]
            if not behind:
                return
            now = time.monotonic()
            for worker in behind:
                handled, since = self._seen.get(worker, (-1, now))
                if worker.handled != handled:
                    self._seen[worker] = (worker.handled, now)
                elif now - since > 1.0:
                    stuck.add(worker)
            time.sleep(0.005)


def run_isolated(
    target: Target,
    *args: Any,
    monitor: BuildMonitor,
    grace_s: float = DEFAULT_GRACE_S,
    kill_after_s: float = DEFAULT_KILL_AFTER_S,
    poll_s: float = 0.1,
    backend: str | None = None,
    on_start: Callable[[int], None] | None = None,
    signal_grace_s: float | None = None,
) -> IsolatedResult:
    """Run ``target(worker_monitor, *args)`` in a worker process, with ``monitor`` (here) fed
    every event of the worker's monitor.

    ``target`` must be importable by name (a module-level function) and its arguments and
    result picklable. A cancel of ``monitor`` (a policy, a signal, ``monitor.cancel``) reaches
    the worker's next ``step_complete``; if the worker is still running ``grace_s`` later, it is
    sent SIGTERM, and SIGKILL ``kill_after_s`` after that. A KeyboardInterrupt here (a second
    Ctrl-C) stops the worker the same way at once; so does a :class:`StopNow` (a second
    SIGTERM), which the result tells apart (``stopped_now``). ``backend`` names the library the
    worker's monitor is an ``IProgressMonitor`` of (``tensorrt``, ``tensorrt-rtx``, ``none``;
    None: the default one). ``on_start`` is told the worker's process id once it runs (the
    builder's process sampler watches it). ``signal_grace_s`` is the grace of a cancel by a
    signal (its source ``signal``), when a scheduler's budget for a stop is shorter than
    ``grace_s``: the next signal it sends is harder.
    """
    context = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    cancel = _CancelChannel(context, monitor, grace_s, signal_grace_s)
    flag, note = cancel.flag, cancel.note
    # The spool: created here, opened by the worker, and unlinked as soon as it has (so
    # nothing is left behind, whoever dies); this process reads it through its own descriptor.
    spool_fd, spool_path = tempfile.mkstemp(prefix="trt-otel-", suffix=".spool")
    job_path = _write_job(target, args)
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(
        target=worker_main,
        args=(sending, flag, note),
        kwargs={
            "job_path": job_path,
            "spool_path": spool_path,
            "parent_pid": os.getpid(),
            "backend": backend,
        },
        name="trt-otel-builder",
    )
    inbox = _Inbox()
    pipe_reader = threading.Thread(
        target=_read_worker, args=(receiving, inbox), name="trt-otel-worker-result"
    )
    replay = _Replay(SpoolReader(spool_fd), monitor, inbox)
    monitor.hold_cancels = True
    try:
        with _main_module_kept_from(target), _no_resource_tracker(), _started_with_them_blocked():
            process.start()
        if on_start is not None and process.pid is not None:
            on_start(process.pid)
        sending.close()
        pipe_reader.start()
        replay.thread.start()
        spool_path, ending = _until_the_worker_ends(
            process, inbox, spool_path, cancel, kill_after_s=kill_after_s, poll_s=poll_s
        )
        replay.worker_ended.set()
        # What the worker recorded before it ended is all in the spool: replay every frame,
        # however far behind, as long as the replay is moving.
        _join_while_moving(replay)
        pipe_reader.join(30.0)
    finally:
        monitor.hold_cancels = False
        monitor.release_cancel()
        receiving.close()
        os.close(spool_fd)
        if spool_path:
            unlink_quietly(spool_path)
        unlink_quietly(job_path)  # the worker's, unless it died before it read it
    return _result(process, inbox, ending, cancel.grace_s)


def _result(process: Any, inbox: _Inbox, ending: _Ending, grace_s: float) -> IsolatedResult:
    if inbox.garbled is not None and not inbox.returned and process.exitcode == 0:
        inbox.error_type, inbox.error = "WorkerProtocolError", inbox.garbled
    return IsolatedResult(
        value=inbox.value,
        returned=inbox.returned,
        error=inbox.error,
        error_type=inbox.error_type,
        exitcode=process.exitcode,
        stopped_with=ending.stopped_with,
        interrupted=ending.interrupted,
        stopped_now=ending.stopped_now,
        pid=process.pid,
        grace_s=grace_s,
    )


@contextlib.contextmanager
def _main_module_kept_from(target: Target) -> Iterator[None]:
    """Start the worker without it running this process's main module again (``spawn`` runs
    it as ``__mp_main__``): for the ``trt-otel`` command that is the whole command line's
    imports, a quarter of a second of every build, for a worker that needs only ``target``'s
    module. Kept when ``target`` lives in the main module, which the worker then needs."""
    main = sys.modules.get("__main__")
    if main is None or getattr(target, "__module__", "__main__") == "__main__":
        yield
        return
    saved = {name: getattr(main, name) for name in ("__spec__", "__file__") if hasattr(main, name)}
    main.__spec__ = None
    if "__file__" in saved:
        del main.__file__
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(main, name, value)


_TRACKER_LOCK = threading.Lock()


@contextlib.contextmanager
def _no_resource_tracker() -> Iterator[None]:
    """Start the worker without starting multiprocessing's resource tracker: spawn starts one,
    a Python process of its own (some 40 ms of CPU, every build), to clean up the named
    semaphores and shared memory segments a process leaves behind, and neither side makes
    any (the cancel flag and note are anonymous shared memory, made with ``lock=False``; the
    result comes through a pipe). The worker is handed ``/dev/null`` as its tracker's pipe,
    and this process is left as it was: its tracker starts as usual when something needs it.
    Where a tracker runs already, or this Python's tracker is not the one this knows, nothing
    is changed."""
    try:
        from multiprocessing import resource_tracker

        tracker: Any = resource_tracker._resource_tracker
    except (ImportError, AttributeError):  # Windows, or another Python's multiprocessing
        yield
        return
    with _TRACKER_LOCK:
        if getattr(tracker, "_fd", 0) is not None or getattr(tracker, "_pid", 0) is not None:
            yield
            return
        null = os.open(os.devnull, os.O_WRONLY)
        tracker._fd = null  # what ensure_running() takes for a running tracker
        try:
            yield
        finally:
            tracker._fd = None
            os.close(null)


class _CancelChannel:
    """How a cancel decided here reaches the worker: raw shared memory, no lock (one writer,
    this process), a note of the decision and a byte flag written last, which the worker's
    ``step_complete`` reads. ``cancelled_at``: when, for the grace period; ``grace_s``: that
    cancel's grace (a signal's, where one is given, else the build's)."""

    def __init__(
        self, context: Any, monitor: BuildMonitor, grace_s: float, signal_grace_s: float | None
    ) -> None:
        self.flag: Any = context.Value(ctypes.c_byte, 0, lock=False)
        self.note: Any = context.Array(ctypes.c_char, NOTE_BYTES, lock=False)
        self.cancelled_at: float | None = None
        self.grace_s = grace_s
        self._signal_grace_s = signal_grace_s
        monitor.on_cancel(self.pass_on)
        if monitor.cancelled:  # cancelled before the worker existed: it must not start building
            self.flag.value = 1
            self.cancelled_at = time.monotonic()

    def pass_on(self, event: CancelRequested) -> None:
        payload = {
            "reason": event.reason[:1000],
            "source": event.source[:100],
            "timeout": event.timeout,
            "policy": event.policy[:1000],
        }
        self.note.value = json.dumps(payload).encode()[: NOTE_BYTES - 1]
        self.flag.value = 1
        if event.source == CancelSource.SIGNAL and self._signal_grace_s is not None:
            self.grace_s = min(self.grace_s, self._signal_grace_s)
        # Told once: a monitor tells its listeners of its first cancel only.
        self.cancelled_at = time.monotonic()


@dataclass(slots=True)
class _Ending:
    """How the worker was stopped from here, if it was."""

    stopped_with: str | None = None
    interrupted: bool = False
    stopped_now: str | None = None


def _until_the_worker_ends(
    process: Any,
    inbox: _Inbox,
    spool_path: str,
    cancel: _CancelChannel,
    *,
    kill_after_s: float,
    poll_s: float,
) -> tuple[str, _Ending]:
    """Until the worker ends; stopped from here once a cancel's grace period has passed, or at
    once on a second Ctrl-C (KeyboardInterrupt) or SIGTERM (StopNow). Returns what is left of
    the spool's path to unlink, and how the worker was stopped."""
    ending = _Ending()
    try:
        spool_path = _wait_for_worker(process, inbox, spool_path, cancel, poll_s=poll_s)
        if process.is_alive():  # the grace period has passed
            ending.stopped_with = _stop(process, kill_after_s)
    except StopNow as stop:
        ending.stopped_now = stop.signal_name
        ending.stopped_with = _stop(process, kill_after_s)
    except KeyboardInterrupt:
        ending.interrupted = True
        ending.stopped_with = _stop(process, kill_after_s)
    return spool_path, ending


def _wait_for_worker(
    process: Any,
    inbox: _Inbox,
    spool_path: str,
    cancel: _CancelChannel,
    *,
    poll_s: float,
) -> str:
    """Until the worker ends, or a cancel's grace period has passed; the spool's path is
    unlinked as soon as the worker has it open (returns what is left of it to unlink)."""
    while process.is_alive():
        process.join(poll_s)
        if spool_path and inbox.spool_open.is_set():
            spool_path = unlink_quietly(spool_path)
        cancelled_at = cancel.cancelled_at
        if cancelled_at is not None and time.monotonic() - cancelled_at >= cancel.grace_s:
            break
    return spool_path


def _join_while_moving(replay: _Replay, patience_s: float = 30.0) -> None:
    """Wait for the replay to finish; give up only if it stops moving for ``patience_s``."""
    last, since = -1, time.monotonic()
    while replay.thread.is_alive():
        replay.thread.join(0.2)
        if replay.progress != last:
            last, since = replay.progress, time.monotonic()
        elif time.monotonic() - since > patience_s:
            _logger.error("the build's records stopped replaying; the rest are lost")
            return


def _stop(process: Any, kill_after_s: float) -> str | None:
    """The worker stopped from outside (see :func:`~trt_otel.control.stopping.stop_process`)."""
    from trt_otel.control.stopping import stop_process  # psutil: this side's, not the worker's

    if not process.is_alive():
        return None

    def gone_within(timeout_s: float) -> bool:
        process.join(timeout_s)  # also reaps it
        return not process.is_alive()

    return stop_process(process.pid, gone_within, kill_after_s)
