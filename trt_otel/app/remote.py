"""``trt-otel watch JOURNAL`` with session options: the exporter and supervisor of a build that
runs in another process, such as a C++ program using ``trt_otel::ProgressMonitor``.

The build's journal is the log. Its events are appended, with their own ``seq``, times and
threads, to a local :class:`~trt_otel.core.log.EventLog` whose followers are those of a build run
here (spans, metrics, the HTTP view, the console, the ETA), so a build watched this way is
exported exactly as the same callbacks made in Python would be.

A decision made here (a policy, ``POST /cancel``) cannot reach TensorRT directly: it is written
to the control file that the build's monitor polls (its cancel file), as one JSON line with the
reason, source, timeout flag and policy. The build records the cancel itself, and that event
comes back through the journal like every other: the journal stays the one record of the build.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from trt_otel.app.assembly import attach_session, policy_runner
from trt_otel.app.components import Views, load_history
from trt_otel.app.config import SessionConfig, UsageError, supervises
from trt_otel.capture.liveness import DEFAULT_LOST_AFTER_S, Writer
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.process import ProcessSampler
from trt_otel.capture.watch import BuildLostError, follow_journal
from trt_otel.control.policies import MAX_REASON
from trt_otel.control.stopping import (
    holds_write_lock,
    owned_by_this_user,
    polling,
    stop_process,
)
from trt_otel.core.durations import format_duration
from trt_otel.core.events import (
    BuildFinished,
    BuildStarted,
    CancelSource,
    Event,
    Outcome,
    ProcessSample,
)
from trt_otel.core.files import open_regular_for_reading, write_atomically
from trt_otel.core.journal_codec import JournalError, encode_events
from trt_otel.core.journal_reader import JournalProblem, LineReader, callbacks_checked, parse_header
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState
from trt_otel.views.terminal import say, warn
from trt_otel.views.trace_ids import TRACEPARENT_ATTRIBUTE, parse_traceparent, trace_id_for

FIRST_EVENT_TIMEOUT_S = 30.0
CONTROL_LINE_BYTES = 800
"""The most of a control file the C++ monitor reads (``cancelFromFile`` in
``progress_monitor.h``: four bytes for each of the 200 code points of a reason it keeps)."""


def control_line(reason: str, *, source: str, timeout: bool, policy: str) -> bytes:
    """A decision as the one JSON line the build's monitor reads, whole within what it reads
    (:data:`CONTROL_LINE_BYTES`): in UTF-8 rather than ``\\u`` escapes (six bytes a character),
    the reason and policy clipped to what the monitor keeps, then the longer of them shortened
    until the line fits. A line cut by the monitor's read would not parse, and the cancel would
    lose its source, policy and timeout flag."""
    reason, policy = reason[:MAX_REASON], policy[:MAX_REASON]
    while True:
        decision = {"reason": reason, "source": source, "timeout": timeout, "policy": policy}
        line = (json.dumps(decision, ensure_ascii=False) + "\n").encode("utf-8", "replace")
        excess = len(line) - CONTROL_LINE_BYTES
        if excess <= 0:
            return line
        cut = max(1, excess // 4)  # characters: four bytes each at most
        if len(reason.encode("utf-8", "replace")) >= len(policy.encode("utf-8", "replace")):
            reason = reason[:-cut]
        else:
            policy = policy[:-cut]


class RemoteBuild:
    """A build in another process, as seen through its journal: what the views and policies read
    of a build (:class:`~trt_otel.core.observed.ObservedBuild`), and its cancel.

    Its log receives the build's own events (see :meth:`feed`), folded once, by ``model``; it
    records nothing itself. :meth:`cancel` hands the decision to the build through
    ``control_file``.
    """

    def __init__(
        self, control_file: Path | None, *, started: BuildStarted, model: ReadModel
    ) -> None:
        # Its monitor only mirrors the build's own events: it answers no callback.
        self._mirror = BuildMonitor(model=model, backend="none")
        self.log = self._mirror.log
        self.model = model
        self.build_id = started.build_id
        self.control_file = control_file
        # The callbacks' own cost is the build's process's to count, not this watch's.
        self.callbacks_total = 0
        self.callback_ns_total = 0
        self.internal_errors = 0
        self._requested = False
        self._request_lock = threading.Lock()
        self.requested = threading.Event()
        """Set once a cancel was written to the control file."""
        self.undelivered: str | None = None
        """Why a cancel decided here could not be written to the control file (then the build
        was not stopped, and watch exits 4), or None."""

    @property
    def state(self) -> BuildState:
        return self.model.state

    @property
    def cancelled(self) -> bool:
        return self._requested or self.state.cancel is not None

    def cancel(
        self,
        reason: str,
        *,
        source: str = CancelSource.USER,
        timeout: bool = False,
        policy: str = "",
    ) -> bool:
        """Write the decision to the control file, for the build's monitor to act on at its
        next poll (it records the ``cancel`` event). Only the first request is written."""
        with self._request_lock:
            if self._requested or self.state.cancel is not None:
                return False
            if self.control_file is None:
                warn(f"cannot cancel ({reason}): watch was not given --control-file")
                return False
            line = control_line(reason, source=source, timeout=timeout, policy=policy)
            try:
                write_atomically(self.control_file, line)
            except OSError as error:
                why = error.strerror or str(error)
                self.undelivered = (
                    f"the cancel ({reason}) could not be delivered: cannot write the control "
                    f"file {str(self.control_file)!r}: {why}"
                )
                warn(f"{self.undelivered}; the build goes on, and watch will exit 4")
                return False
            self._requested = True
            self.undelivered = None
            self.requested.set()
        say(f"cancel requested through {self.control_file}: {reason}")
        return True

    def feed(self, events: Sequence[Event]) -> None:
        """Append the build's events as they were recorded. A gap in ``seq`` (events its writer
        lost, which the reader has reported) continues from the next event's ``seq``."""
        self._mirror.mirror(events)


def first_event(
    path: Path, timeout_s: float = FIRST_EVENT_TIMEOUT_S
) -> tuple[dict[str, Any], BuildStarted]:
    """The journal's header and first event, its ``build_start`` (the build id and attributes
    every projection needs), waiting for a writer that has only just started."""
    deadline = time.monotonic() + timeout_s
    reader = LineReader()
    header: dict[str, Any] | None = None
    offset = 0
    while True:
        try:
            with open_regular_for_reading(path, "journal") as handle:  # a FIFO must not block
                handle.seek(offset)
                chunk = handle.read(1 << 16)
        except FileNotFoundError:
            chunk = b""
        except OSError as error:
            raise JournalError(f"cannot read journal {str(path)!r}: {error.strerror}") from None
        offset += len(chunk)
        if header is None and chunk:
            first_line, newline, rest = chunk.partition(b"\n")
            if not newline:
                offset -= len(chunk)  # the header is still being written
                chunk = b""
            else:
                header, chunk = parse_header(first_line + newline, path), rest
        for item in reader.feed(chunk) if chunk else []:
            if isinstance(item, JournalProblem):
                continue
            if isinstance(item, BuildStarted):
                assert header is not None
                return header, item
            raise JournalError(f"{path}: the first event is {item.type}, not build_start")
        if time.monotonic() > deadline:
            raise JournalError(f"{path}: no build started within {timeout_s:.0f}s")
        time.sleep(0.05)


TERMINATE_TO_KILL_S = 5.0


class Escalation:
    """Stops a cancelled build that TensorRT does not stop (a silent window) from outside, as
    ``trt-otel build`` stops its worker: ``after_s`` after the cancel was written to the control
    file, the journal's writer gets SIGTERM, then SIGKILL 5 s later. Not its own child, so only
    a process proven to be the writer: the one its header names, on this host, of this user,
    holding the journal's write lock (:func:`~trt_otel.control.stopping.holds_write_lock`),
    never a process that only reads it. Its journal then has no end, so watch ends it: a
    ``build_end`` appended as the writer's own would have been, saying how the build was
    stopped. Runs on its own thread."""

    def __init__(
        self, journal: Path, header: dict[str, Any], monitor: RemoteBuild, after_s: float
    ) -> None:
        self.journal = journal
        self.writer = Writer.from_header(header)
        self.numbered_as_written = callbacks_checked(header)
        """Whether the local log numbers the events as the journal does (a journal of
        unchecked callbacks is numbered anew when they are checked, anomalies included)."""
        self.monitor = monitor
        self.after_s = after_s
        self._stop = threading.Event()
        self.stopping_writer = threading.Event()
        """Set before the writer is signalled: its death is ours, and its end is ours to write."""
        self._thread = threading.Thread(target=self._run, name="trt-otel-escalation", daemon=True)

    def __enter__(self) -> Escalation:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self.monitor.requested.set()  # wakes the thread if no cancel ever came
        self._thread.join(2 * TERMINATE_TO_KILL_S + 5)

    def _ended(self) -> bool:
        return self.monitor.state.outcome is not None

    def _run(self) -> None:
        self.monitor.requested.wait()
        if self._stop.wait(self.after_s) or self._ended():
            return
        pid = self.writer.pid
        if pid is None or self.writer.running_here() is not True:
            warn(
                f"the build has not stopped {format_duration(self.after_s)} after its cancel, "
                "and its process cannot be stopped from here (not named in its journal, or not "
                "on this host)"
            )
            return
        if not owned_by_this_user(pid):
            warn(
                f"the build has not stopped {format_duration(self.after_s)} after its cancel, "
                f"and its process ({self.writer.describe()}) runs as another user: not stopped"
            )
            return
        if holds_write_lock(pid, self.journal) is not True:
            warn(
                f"the build has not stopped {format_duration(self.after_s)} after its cancel, "
                f"and the process its journal names ({self.writer.describe()}) does not hold "
                "the journal's write lock: it is not provably the build's writer (a reader "
                "holds the journal open too), so it is not stopped"
            )
            return
        self.stopping_writer.set()
        say(f"the build has not stopped: sending SIGTERM to its process ({self.writer.describe()})")
        writer_gone = polling(pid, self.writer.created_wall_ns)

        def gone_within(timeout_s: float) -> bool:
            # Its end may come through the journal first: the build stopped after all.
            return self._ended() or writer_gone(timeout_s)

        stopped_with = stop_process(pid, gone_within, TERMINATE_TO_KILL_S)
        if not self._ended():
            self._end_journal(stopped_with)

    def _end_journal(self, stopped_with: str | None) -> None:
        """Append the build's end to its journal, whose writer is gone: the one record stays
        complete, and every follower (this watch included) reads how the build ended."""
        cancel = self.monitor.state.cancel
        timeout = cancel.timeout if cancel is not None else False
        reason = cancel.reason if cancel is not None else "cancelled by trt-otel watch"
        how = (
            f"so its process was stopped with {stopped_with}"
            if stopped_with is not None
            else "and its process ended before it could be stopped"
        )
        detail = f"{reason}; TensorRT had not stopped {format_duration(self.after_s)} later, {how}"
        with open(self.journal, "rb+") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - (1 << 20)))
            tail = handle.read()
            last_seq = -1
            ended = False
            for item in LineReader().feed(tail.partition(b"\n")[2] if size > len(tail) else tail):
                if not isinstance(item, JournalProblem):
                    last_seq = item.seq
                    if isinstance(item, (BuildStarted, BuildFinished)):
                        ended = isinstance(item, BuildFinished)
            if ended:
                # Its writer wrote the end on its way out, before this watch had read it: the
                # record is whole, and a second end would make it two builds' worth of ends.
                return
            local_seq = self.monitor.log.next_seq - 1 if self.numbered_as_written else -1
            end = BuildFinished(
                seq=max(last_seq, local_seq) + 1,
                wall_ns=time.time_ns(),
                mono_ns=time.monotonic_ns(),
                thread="trt-otel-watch",
                outcome=Outcome.TIMEOUT if timeout else Outcome.CANCELLATION,
                detail=detail,
                error_type="timeout" if timeout else None,
            )
            # A line the kill cut short is ended first, so only it reads as corrupt.
            torn = b"" if not tail or tail.endswith(b"\n") else b"\n"
            handle.write(torn + encode_events([end]))
            handle.flush()
            os.fsync(handle.fileno())


def _sample_the_writer(
    stack: contextlib.ExitStack[Any],
    journal: Path,
    header: dict[str, Any],
    *,
    monitor: RemoteBuild,
    model: ReadModel,
    config: SessionConfig,
) -> None:
    """Sample the journal's writer when it runs on this host, for the stall and memory policies
    and the views; else say once that they have the callbacks alone. The samples are this
    watch's own observations: they are folded in here, not added to the build's log, whose
    sequence is the journal's.

    A header is text anyone can write: the process it names is sampled only when it provably
    writes the journal (it holds the journal's write lock), or another process's work would
    keep a hung build alive and its memory would stop a build that is within its limit."""
    writer = Writer.from_header(header)
    if (
        writer.pid is None
        or writer.running_here() is not True
        or holds_write_lock(writer.pid, journal) is not True
    ):
        if config.policy.options_reading("process"):
            warn(
                "the build's process cannot be sampled from here (not on this host, not named "
                "in its journal, or not provably its writer: it does not hold the journal's "
                "write lock): --stall-timeout counts callbacks alone, and the memory policies "
                "have nothing to read"
            )
        return

    def record(pid: int, fields: dict[str, object]) -> ProcessSample:
        clock = monitor.log.clock
        sample = ProcessSample(
            seq=-1, wall_ns=clock.wall_ns(), mono_ns=clock.mono_ns(), thread="trt-otel-process",
            pid=pid, **fields,  # type: ignore[arg-type]
        )  # fmt: skip
        state = model.state
        with monitor.log.lock:  # the model is the log's fold
            state.activity.sample(sample, state.last_progress_mono_ns, state.gpu)
        return sample

    interval_s = config.observe.sample_interval_s
    stack.enter_context(
        ProcessSampler(None, interval_s=interval_s, warn=warn, pid=writer.pid, record=record)
    )


def check_control_file(control_file: Path) -> None:
    """The control file can be written where it is to go, checked before the watch starts
    (exit 2): else a cancel decided later could not reach the build."""
    folder = control_file.parent
    shown = repr(str(control_file))
    if not folder.is_dir():
        what = "does not exist" if not folder.exists() else "is not a directory"
        raise UsageError(f"--control-file {shown}: its directory {str(folder)!r} {what}")
    if control_file.is_dir():
        raise UsageError(f"--control-file {shown} is a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--control-file {shown}: its directory {str(folder)!r} is not writable")


def _check_watch_options(config: SessionConfig) -> None:
    """What watch cannot do for a build elsewhere (exit 2): write its journal, sample its GPU."""
    if config.observe.journal is not None:
        raise UsageError("watch reads the build's journal; --journal does not apply to it")
    if config.observe.gpu.device is not None:
        raise UsageError("watch does not sample the GPU: the build's own process would have to")
    reading_gpu = config.policy.options_reading("gpu")
    if reading_gpu:
        raise UsageError(
            f"{' and '.join(reading_gpu)} needs the build's GPU sampled, and watch does not "
            "sample the GPU: the build's own process would have to"
        )


def watch_and_supervise(
    journal: Path,
    config: SessionConfig,
    control_file: Path | None,
    *,
    lost_after_s: float = DEFAULT_LOST_AFTER_S,
    terminate_after_s: float | None = None,
) -> BuildFinished | None:
    """Follow the build of ``journal`` to its end with everything ``config`` asks for attached;
    returns its end (None if interrupted before it). A cancel decided here that could not be
    delivered (the control file could not be written) is not a silent success: the end
    returned is then a failure saying so (exit 4), whatever the build did."""
    observe = config.observe
    _check_watch_options(config)
    policy = config.policy.policy()
    if policy is not None and control_file is None:
        raise UsageError(
            "policy options need --control-file: the file the build's monitor polls "
            "(trt_otel::Options::cancel_file), through which watch cancels it"
        )
    if terminate_after_s is not None and control_file is None:
        raise UsageError("--terminate-after needs --control-file: watch cancels through it first")
    if control_file is not None:
        check_control_file(control_file)
    header, started = first_event(journal)
    with contextlib.ExitStack() as stack:
        attributes = dict(started.attributes)
        history = load_history(observe.history, attributes)
        model = ReadModel(history)  # the build folded once, for every view below
        monitor = RemoteBuild(control_file, started=started, model=model)
        runner = policy_runner(monitor, policy)

        def announce(views: Views) -> None:
            if views.spans is not None:
                remote = parse_traceparent(str(attributes.get(TRACEPARENT_ATTRIBUTE, "")))
                say(f"trace: {trace_id_for(started.build_id, remote):032x}")
            if runner is not None:
                say(f"policy: {runner.policy.describe()} (through {control_file})")

        # As a build run here has them.
        attach_session(
            stack,
            monitor,
            observe,
            model=model,
            runner=runner,
            attributes=attributes,
            console=observe.console,
            before_following=announce,
        )
        if runner is not None:
            stack.enter_context(runner)
        _sample_the_writer(stack, journal, header, monitor=monitor, model=model, config=config)
        ending = None
        if terminate_after_s is not None:
            escalation = Escalation(journal, header, monitor, terminate_after_s)
            ending = stack.enter_context(escalation).stopping_writer
        end, lost = _follow_to_end(journal, monitor, lost_after_s, ending)
    if lost is not None:
        raise lost
    if end is not None and monitor.undelivered is not None:
        say(f"error: {monitor.undelivered} (the build ended: {end.outcome.value})", tagged=True)
        return msgspec.structs.replace(
            end, outcome=Outcome.FAILURE, detail=monitor.undelivered, error_type="CancelUndelivered"
        )
    return end


def _follow_to_end(
    journal: Path, monitor: RemoteBuild, lost_after_s: float, ending: threading.Event | None
) -> tuple[BuildFinished | None, BuildLostError | None]:
    """The build's end, or the loss of it, returned rather than raised: what was seen of a lost
    build is all there will be, so its session closes as after an end (its exports flushed, its
    open phases ended) before the loss is told."""
    try:
        end = follow_journal(
            journal, monitor.feed, warn=warn, lost_after_s=lost_after_s, ending=ending
        )
    except BuildLostError as error:
        return None, error
    return end, None


__all__ = [
    "Escalation",
    "RemoteBuild",
    "check_control_file",
    "first_event",
    "supervises",
    "watch_and_supervise",
]
