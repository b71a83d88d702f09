"""BuildMonitor: TensorRT's ``IProgressMonitor``, turning each callback into events.

TensorRT calls the three callbacks from its builder threads, each time re-acquiring the GIL, and
treats anything but a real ``bool`` from ``step_complete`` (an exception, ``None``) as a cancel.
So every callback here does the minimum (validate, stamp, append, fold, read a flag) under one
short lock, never blocks on I/O, never raises, and ``step_complete`` always returns a ``bool``.

A monitor is an ``IProgressMonitor`` of the builder library the build uses: ``BuildMonitor(...)``
returns an instance of a subclass that also derives from that library's ``IProgressMonitor``
(whose ``__init__`` it calls, as pybind11 requires), so ``config.progress_monitor =
BuildMonitor()`` just works. Which library:

- ``BuildMonitor(backend=tensorrt_rtx)`` (the module) or ``backend="tensorrt-rtx"`` (its name);
- else one the program has already imported (``tensorrt`` first), else the first installed
  (``tensorrt``, then ``tensorrt_rtx``: see :mod:`trt_otel.capture.backends`);
- with neither installed, or ``backend="none"``, a plain monitor (the simulator's builder takes
  any object; a build's supervisor needs no library).

A subclass of ``BuildMonitor`` is bound the same way; ``MyMonitor.bound_to(module)`` gives its
class bound to one library, for a subclass whose ``__init__`` takes no ``backend``.
``import trt_otel`` imports neither library: the base class is bound when the first monitor is
created.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import msgspec

from trt_otel.capture.binding import BackendChoice, ProgressMonitorBase
from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.events import (
    Anomaly,
    AnomalyKind,
    BuildFinished,
    BuildOutput,
    BuildStarted,
    CancelRequested,
    CancelSource,
    Event,
    LogMessage,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    StepCompleted,
)
from trt_otel.core.log import EventLog, current_thread_name
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState

_logger = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
Stamp = tuple[int, int, str]
"""When and where an event was made: (wall_ns, mono_ns, thread)."""
BuildOpen = Callable[[], bool]
"""Whether the build is still open (asked under the log's lock): no sample follows its end."""
CancelListener = Callable[[CancelRequested], None]
CallbackRecord = tuple[Any, ...]
"""A callback made elsewhere: its kind (``phase_start``, ``step``, ``phase_finish``, ``log``,
``end``, ``output``), wall and monotonic time, thread, then its arguments; or ``event``, with
an event its recorder made itself (a build's start, a cancel it acted on, its own note of a
loss), taken as it is but for its ``seq``."""


class BuildMonitor(ProgressMonitorBase):
    """A progress monitor whose every callback is an event in its :class:`EventLog`.

    ``BuildMonitor()`` with no arguments is a working monitor: read :attr:`state` during or after
    the build, :meth:`cancel` it from any thread, attach followers to :attr:`log`.

    The callbacks are called by TensorRT's builder threads; they never block and never raise.
    """

    def __init__(
        self,
        *,
        log: EventLog | None = None,
        clock: Clock = SYSTEM_CLOCK,
        build_id: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        backend: BackendChoice | None = None,
        forget_closed: bool = False,
        model: ReadModel | None = None,
    ) -> None:
        """``backend``: the library to be an ``IProgressMonitor`` of (used by ``__new__``).
        ``model``: a read model to be this monitor's fold, for a monitor that replays
        callbacks made elsewhere (see :class:`~trt_otel.core.readmodel.ReadModel`); its state is
        then :attr:`state`, and ``forget_closed`` is the model's choice."""
        self._init_native()
        self.log = log if log is not None else EventLog(clock=clock)
        # Only this build's events: the log may already hold earlier builds (``trt-otel run``).
        if model is None:
            # forget_closed: the state keeps the open phases and what the gauges read, not
            # every phase the build ever started (the command's choice: flat memory).
            self.state = BuildState(forget_closed=forget_closed)
            self.log.add_fold(self.state.apply, replay_retained=False)
        else:
            self.state = model.state
            model.fold_of(self.log)
        self.model = model
        """The read model that is this monitor's fold, if any."""
        self.build_id = build_id or uuid.uuid4().hex
        self._attributes = dict(attributes or {})
        self._cancelled = False
        self._cancel_lock = threading.Lock()
        """Guards the cancel's own state; taken after the log's lock when both are."""
        self._ended = False
        self._cancel_listeners: tuple[CancelListener, ...] = ()
        self.hold_cancels = False
        """Set by a transport that replays callbacks made elsewhere while it may be behind
        them (the supervisor): a cancel decided here is then held, and appended only once the
        replay reaches the moment it was decided (:meth:`release_cancel`), so that in the log
        it follows every callback made before it and precedes every one made after."""
        self._held_cancel: CancelRequested | None = None
        self.internal_errors = 0
        self.reads_a_record = False
        """Set by a reader that takes a build's records from its journal
        (:mod:`trt_otel.capture.checked`): a Ctrl-C inside :meth:`record` then interrupts the
        reader (``replay``, ``watch``), rather than being recorded as a cancel of a build that
        runs, or ran, elsewhere and never got it."""
        # The monitor's own cost, for its health metrics (written under the log's lock).
        self.callbacks_total = 0
        self.callback_ns_total = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, **attributes: Any) -> None:
        """Record the build's start (done implicitly by the first callback if not called)."""
        with self.log.lock:
            self._start_locked(self._now(), attributes)

    def start_at(self, wall_ns: int, mono_ns: int, thread: str) -> None:
        """Record the build's start at the time it began elsewhere (a program's build, which
        began when the program called the builder, not when its message arrived)."""
        with self.log.lock:
            self._start_locked((wall_ns, mono_ns, thread))

    def _now(self) -> Stamp:
        """The time and thread of an event made here, now (the caller holds the log's lock:
        the log's order is the time's)."""
        clock = self.log.clock
        return clock.wall_ns(), clock.mono_ns(), current_thread_name()

    def _append(self, stamp: Stamp, make: Callable[..., E], /, **fields: Any) -> E:
        return self.log.append(make, *stamp, **fields)

    def _start_locked(self, stamp: Stamp, extra: Mapping[str, Any] | None = None) -> None:
        if self.state.build_id is None:
            attributes = {**self._attributes, **(extra or {})}
            self._append(stamp, BuildStarted, build_id=self.build_id, attributes=attributes)

    def end(
        self, outcome: Outcome | None = None, detail: str = "", error_type: str | None = None
    ) -> Outcome:
        """Record the build's end; closes the phases still open. Returns the outcome recorded.

        With no ``outcome``, a cancelled build ends as a cancellation (or a timeout, when the
        cancel was one) and any other as a success. Calling it again changes nothing.
        """
        with self.log.lock:
            return self._end_locked(self._now(), outcome, detail, error_type)

    def _end_locked(
        self, stamp: Stamp, outcome: Outcome | None, detail: str, error_type: str | None
    ) -> Outcome:
        if self.state.outcome is not None:
            return self.state.outcome
        self._start_locked(stamp)
        self._release_cancel_locked()
        cancel = self.state.cancel
        if outcome is None:
            if cancel is None:
                outcome = Outcome.SUCCESS
            else:
                outcome = Outcome.TIMEOUT if cancel.timeout else Outcome.CANCELLATION
        if not detail and cancel is not None and outcome is not Outcome.SUCCESS:
            detail = cancel.reason
        if error_type is None and outcome is Outcome.TIMEOUT:
            error_type = "timeout"
        self._append(stamp, BuildFinished, outcome=outcome, detail=detail, error_type=error_type)
        self._ended = True
        return outcome

    @property
    def outcome_detail(self) -> str:
        return self.state.outcome_detail

    def record_output(self, attributes: dict[str, Any]) -> None:
        """Record what the build produced (``engine.sha256``, ...), before its end: a
        :class:`~trt_otel.core.events.BuildOutput` event. Once the build ended, nothing."""
        with self.log.lock:
            self._output_locked(self._now(), attributes)

    def _output_locked(self, stamp: Stamp, attributes: dict[str, Any]) -> None:
        if self._ended or self.state.build_id is None:
            return
        self._append(stamp, BuildOutput, attributes=dict(attributes))

    def sample(
        self, make: Callable[..., E], build_open: BuildOpen | None = None, /, **fields: Any
    ) -> E | None:
        """Record a reading of the builder's process or its GPU (a sampler's thread), stamped
        now; nothing when ``build_open`` (asked under the log's lock) says the build ended, so
        that no sample follows its end."""
        with self.log.lock:
            if build_open is not None and not build_open():
                return None
            return self._append(self._now(), make, **fields)

    def mirror(self, events: Iterable[Event]) -> None:
        """Take events numbered by the log they were recorded in (a build followed through
        its journal or its event stream), keeping their ``seq`` and stamps, so that what is
        served from here has the build's own numbers. An event already taken is skipped; a
        jump forward (events that log's reader lost, and reported) continues from it."""
        log = self.log
        with log.batch():
            for event in events:
                if event.seq >= log.next_seq:
                    log.append(_as_is(event), event.wall_ns, event.mono_ns, event.thread,
                               seq=event.seq)  # fmt: skip

    def close(self, timeout_s: float = 5.0) -> bool:
        """Flush and stop every follower of the log; True if they all finished in time."""
        return self.log.close(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.end()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.cancel("interrupted by the user", source=CancelSource.SIGNAL)
            self.end(Outcome.CANCELLATION)
        else:
            self.end(Outcome.FAILURE, f"{exc_type.__name__}: {exc}", error_type=exc_type.__name__)
        self.close()

    # -- cancellation --------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(
        self,
        reason: str,
        *,
        source: str = CancelSource.USER,
        timeout: bool = False,
        policy: str = "",
    ) -> bool:
        """Ask TensorRT to stop: the next ``step_complete`` answers False. Safe from any thread.

        Only the first request is recorded as the reason; returns True if this one was it. Once
        the build has ended there is nothing to cancel: nothing is recorded, and False.
        ``source`` is a :class:`~trt_otel.core.events.CancelSource` (or a string of the caller's
        own); the event holds it as a plain string, as the journal does.
        """
        source = str(source)
        event: CancelRequested
        if self.hold_cancels:
            # Held, not appended: no need to wait for the log's lock, which a replay holds
            # for a whole batch (the decision must reach the worker at once).
            with self._cancel_lock:
                if self._cancelled or self._ended:
                    return False
                event = CancelRequested(-1, *self._now(), reason, source, timeout, policy)
                self._held_cancel = event
                self._cancelled = True
        else:
            with self.log.lock, self._cancel_lock:
                if self._cancelled or self._ended:
                    return False
                event = self._append(
                    self._now(),
                    CancelRequested,
                    reason=reason,
                    source=source,
                    timeout=timeout,
                    policy=policy,
                )
                self._cancelled = True
        for listener in self._cancel_listeners:
            try:
                listener(event)
            except Exception:
                _logger.exception("a cancel listener failed")
        return True

    def on_cancel(self, listener: CancelListener) -> None:
        """Call ``listener`` (on the cancelling thread) when the cancel is first requested.

        While :attr:`hold_cancels` is set the event it gets is the one held: its ``seq`` is -1.
        """
        self._cancel_listeners = (*self._cancel_listeners, listener)

    @property
    def held_cancel(self) -> CancelRequested | None:
        """The cancel decided but not yet in the log (see :attr:`hold_cancels`), if any."""
        return self._held_cancel

    def release_cancel(self) -> None:
        """Append the held cancel, at the time it was decided. Safe from any thread."""
        with self.log.lock:
            self._release_cancel_locked()

    def _release_cancel_locked(self) -> None:
        with self._cancel_lock:
            held, self._held_cancel = self._held_cancel, None
        if held is None:
            return
        self._append(  # at the time it was decided
            (held.wall_ns, held.mono_ns, held.thread),
            CancelRequested,
            reason=held.reason,
            source=held.source,
            timeout=held.timeout,
            policy=held.policy,
        )

    # -- TensorRT's callbacks (builder threads) -------------------------------------------------

    # Each is a record (its kind, the time and thread it was made at, its arguments), taken
    # under the log's lock by the one way in, :meth:`_take_locked`, as a record made elsewhere
    # is (:meth:`record`). The clock is read under the lock: the log's order is the time's.

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        """TensorRT callback, on a builder thread: a phase began. Never raises."""
        began_ns = time.perf_counter_ns()
        try:
            log = self.log
            with log.lock:
                clock = log.clock
                error = self._take_locked(
                    (
                        "phase_start",
                        clock.wall_ns(),
                        clock.mono_ns(),
                        current_thread_name(),
                        phase_name,
                        parent_phase,
                        num_steps,
                    )
                )
                self.callbacks_total += 1
                self.callback_ns_total += time.perf_counter_ns() - began_ns
        except BaseException as caught:
            error = caught
        if error is not None:
            self._internal_error("phase_start", error)

    def step_complete(self, phase_name: str, step: int) -> bool:
        """TensorRT callback, on a builder thread: a step of a phase completed.

        Returns False when the build must stop. O(1), never blocks, never raises, and always
        returns a real ``bool`` (anything else would cancel the build).
        """
        began_ns = time.perf_counter_ns()
        try:
            log = self.log
            with log.lock:
                clock = log.clock
                error = self._take_locked(
                    (
                        "step",
                        clock.wall_ns(),
                        clock.mono_ns(),
                        current_thread_name(),
                        phase_name,
                        step,
                    )
                )
                self.callbacks_total += 1
                self.callback_ns_total += time.perf_counter_ns() - began_ns
        except BaseException as caught:
            error = caught
        if error is not None:
            self._internal_error("step_complete", error)
        return not self._cancelled

    def phase_finish(self, phase_name: str) -> None:
        """TensorRT callback, on a builder thread: a phase ended. Never raises."""
        began_ns = time.perf_counter_ns()
        try:
            log = self.log
            with log.lock:
                clock = log.clock
                error = self._take_locked(
                    (
                        "phase_finish",
                        clock.wall_ns(),
                        clock.mono_ns(),
                        current_thread_name(),
                        phase_name,
                    )
                )
                self.callbacks_total += 1
                self.callback_ns_total += time.perf_counter_ns() - began_ns
        except BaseException as caught:
            error = caught
        if error is not None:
            self._internal_error("phase_finish", error)

    def log_message(self, severity: str, message: str) -> None:
        """Record a message of the builder's logger (any thread). Never raises."""
        try:
            log = self.log
            with log.lock:
                clock = log.clock
                error = self._take_locked(
                    (
                        "log",
                        clock.wall_ns(),
                        clock.mono_ns(),
                        current_thread_name(),
                        severity,
                        message,
                    )
                )
        except BaseException as caught:
            error = caught
        if error is not None:
            self._internal_error("log_message", error)

    # -- the one way in --------------------------------------------------------------------------

    def record(self, records: Iterable[CallbackRecord]) -> None:
        """Take callbacks made elsewhere (a build's worker, a program ``trt-otel run``
        instruments, a recorded trace), each at the time and on the thread where it was made,
        exactly as if it had been made here, in one batch of the log (the followers get them
        together). A held cancel (see :attr:`hold_cancels`) goes into the log before the first
        callback made after it was decided. Never raises."""
        interrupted = False
        log = self.log
        take = self._take_locked
        with log.batch():
            for record in records:
                held = self._held_cancel
                if held is not None and record[2] > held.mono_ns:
                    self._release_cancel_locked()
                error = take(record)
                if error is not None:
                    interrupted |= self._internal_error_locked(str(record[0]), error)
        if interrupted and not self.reads_a_record:
            # Ctrl-C landed inside the replay: honour it as a graceful cancel, not a crash.
            self.cancel("interrupted by the user", source=CancelSource.SIGNAL)
        elif interrupted:
            raise KeyboardInterrupt

    def _take_locked(self, record: CallbackRecord) -> BaseException | None:
        """The one way a callback enters the log, whichever capture made it: checked against
        the protocol once (the state's checks), appended with its time and thread, folded.
        Under the log's lock; returns the error it raised (for the caller to record outside
        TensorRT's call), if any.

        Most records, by far, go straight in: their arguments of the right types, the build
        started and not ended, and none of the anomalies the state's checks look for. The
        rest go the long way (:meth:`_checked_locked`), which records what is wrong. (One
        function, not two: it runs for every callback of a build.)"""
        state = self.state
        make: Callable[..., Event] | None = None
        if not self._ended and state.build_id is not None:
            kind, size = record[0], len(record)
            if kind == "step" and size == 6:
                name, step = record[4], record[5]
                if type(name) is str and type(step) is int and not state.check_step(name, step):
                    make = StepCompleted
            elif kind == "phase_start" and size == 7:
                name, parent, num_steps = record[4], record[5], record[6]
                if (
                    type(name) is str
                    and type(num_steps) is int
                    and num_steps >= 1
                    and (parent is None or type(parent) is str)
                    and not state.check_phase_start(name, parent)
                ):
                    make = PhaseStarted
            elif kind == "phase_finish" and size == 5:
                name = record[4]
                if type(name) is str and not state.check_phase_finish(name):
                    make = PhaseFinished
        if make is None:
            return self._checked_locked(record)
        try:
            self.log.append(make, *record[1:])
        except BaseException as caught:
            return caught
        return None

    def _checked_locked(self, record: CallbackRecord) -> BaseException | None:
        """A record the fast path did not take: its arguments checked and coerced, what is
        wrong recorded as anomalies, every event stamped with the record's time and thread."""
        try:
            kind, wall_ns, mono_ns, thread, *arguments = record
            stamp: Stamp = (wall_ns, mono_ns, thread)
            if kind == "step":
                self._step_locked(stamp, *arguments)
            elif kind == "phase_start":
                self._phase_start_locked(stamp, *arguments)
            elif kind == "phase_finish":
                self._phase_finish_locked(stamp, *arguments)
            elif kind == "log":
                severity, message = arguments
                self._append(stamp, LogMessage, severity=str(severity), message=str(message))
            elif kind == "end":
                outcome, detail, error_type = arguments
                self._end_locked(stamp, Outcome(outcome), detail, error_type)
            elif kind == "output":
                (attributes,) = arguments
                if isinstance(attributes, dict):
                    self._output_locked(stamp, attributes)
            elif kind == "event":
                (event,) = arguments
                self._recorded_locked(event)
        except BaseException as caught:
            return caught
        return None

    def _phase_start_locked(
        self, stamp: Stamp, phase_name: object, parent_phase: object, num_steps: object
    ) -> None:
        self._before_callback(stamp)
        name = self._text(stamp, phase_name, "phase_name")
        parent = None if parent_phase is None else self._text(stamp, parent_phase, "parent_phase")
        steps = self._count(stamp, num_steps, "num_steps", name)
        for kind, detail in self.state.check_phase_start(name, parent):
            self._append(stamp, Anomaly, kind=kind, detail=detail, phase=name)
        self.log.append(PhaseStarted, *stamp, name, parent, steps)

    def _step_locked(self, stamp: Stamp, phase_name: object, step: object) -> None:
        self._before_callback(stamp)
        name = self._text(stamp, phase_name, "phase_name")
        number = self._count(stamp, step, "step", name, minimum=None)
        for kind, detail in self.state.check_step(name, number):
            self._append(stamp, Anomaly, kind=kind, detail=detail, phase=name)
        self.log.append(StepCompleted, *stamp, name, number)

    def _phase_finish_locked(self, stamp: Stamp, phase_name: object) -> None:
        self._before_callback(stamp)
        name = self._text(stamp, phase_name, "phase_name")
        for kind, detail in self.state.check_phase_finish(name):
            self._append(stamp, Anomaly, kind=kind, detail=detail, phase=name)
        self.log.append(PhaseFinished, *stamp, name)

    def _recorded_locked(self, event: Event) -> None:
        """An event a recorder elsewhere made itself, appended as it is (numbered in this log).
        Its cancel is this monitor's: a later ``step_complete`` here would be refused too."""
        if type(event) is CancelRequested:
            with self._cancel_lock:
                if self._cancelled:
                    return  # only the first cancel is an event
                self._cancelled = True
        self.log.append(_renumbered(event), event.wall_ns, event.mono_ns, event.thread)

    # -- helpers (called with the log's lock held) ---------------------------------------------

    def _before_callback(self, stamp: Stamp) -> None:
        if self._ended:
            self._append(
                stamp,
                Anomaly,
                kind=AnomalyKind.CALLBACK_OUTSIDE_BUILD,
                detail="a callback arrived after the build ended; one monitor serves one build",
            )
        else:
            self._start_locked(stamp)

    def _text(self, stamp: Stamp, value: object, argument: str) -> str:
        if type(value) is str:
            return value
        self._append(
            stamp,
            Anomaly,
            kind=AnomalyKind.INVALID_ARGUMENT,
            detail=f"{argument} is a {type(value).__name__}, not a str",
        )
        return str(value)

    def _count(
        self, stamp: Stamp, value: object, argument: str, phase: str, minimum: int | None = 1
    ) -> int:
        try:
            number = int(value)  # type: ignore[call-overload]
            assert isinstance(number, int)
        except (TypeError, ValueError, OverflowError):
            number = 0
        if type(value) is not int or (minimum is not None and number < minimum):
            self._append(
                stamp,
                Anomaly,
                kind=AnomalyKind.INVALID_ARGUMENT,
                detail=f"{argument} {value!r} is not a valid count",
                phase=phase,
            )
        return number

    def _internal_error(self, callback: str, error: BaseException) -> None:
        with self.log.lock:
            interrupted = self._internal_error_locked(callback, error)
        if interrupted:
            # Ctrl-C landed inside a callback: honour it as a graceful cancel, not a crash.
            self.cancel("interrupted by the user", source=CancelSource.SIGNAL)

    def _internal_error_locked(self, callback: str, error: BaseException) -> bool:
        """Count and record the monitor's own failure; True when it was a Ctrl-C, which the
        caller turns into a cancel once the lock is released."""
        self.internal_errors += 1
        if isinstance(error, KeyboardInterrupt):
            return True
        with contextlib.suppress(BaseException):
            self._append(
                self._now(),
                Anomaly,
                kind=AnomalyKind.MONITOR_ERROR,
                detail=f"{callback}: {type(error).__name__}: {error}",
            )
        if self.internal_errors == 1:
            _logger.error("trt-otel monitor error in %s: %r (build continues)", callback, error)
        return False


def _as_is(event: Event) -> Callable[..., Event]:
    """Makes ``event`` as it is (its ``seq`` kept: see :meth:`EventLog.append`)."""

    def make(*_numbered: object) -> Event:
        return event

    return make


def _renumbered(event: Event) -> Callable[..., Event]:
    """Makes ``event`` again with the ``seq`` a log gives it (see :meth:`EventLog.append`)."""

    def make(seq: int, *_stamp: object) -> Event:
        return msgspec.structs.replace(event, seq=seq)

    return make
