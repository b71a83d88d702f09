"""A journal's events as trt-otel takes them: a C++ build's callbacks through the one way in.

The C++ monitor records each callback as it comes and checks nothing against TensorRT's
protocol; its journal's header says so (``"checked": false``, see
:data:`~trt_otel.core.journal.CHECKED_FIELD`). Every reader of a journal (``replay``, ``watch``,
``report``, ``diff``, ``--history``, the fleet's status) gets its events from here: each recorded
callback of such a journal is handed to a :class:`~trt_otel.capture.monitor.BuildMonitor` as a
record made elsewhere (:meth:`~trt_otel.capture.monitor.BuildMonitor.record`, the one way in
every capture mode takes), which checks it once, records the anomalies, closes the phases and
numbers the events exactly as for the same callbacks made in Python. A journal whose callbacks
were checked when recorded (Python's, and the C++ monitor's of before it only recorded) is
read as it is, so that nothing is checked twice.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trt_otel.capture.monitor import BuildMonitor, CallbackRecord
from trt_otel.core import journal_reader as journals
from trt_otel.core.events import (
    BuildFinished,
    BuildOutput,
    BuildStarted,
    Event,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    StepCompleted,
)
from trt_otel.core.log import EventLog


class CheckedEvents:
    """The events of one journal as the one way in takes them, a batch at a time, as a reader
    reads them or a follower sees the journal grow. One instance per journal, fed in order."""

    def __init__(self, header: dict[str, object]) -> None:
        self.checks = not journals.callbacks_checked(header)
        """Whether this journal's callbacks are taken through the one way in (else they pass
        as they are)."""
        # Only the events of the batch being fed are kept: the log retains none.
        self._log = EventLog(retain=0)
        self._taken: list[Event] = []
        self._log.add_batch_consumer(self._taken.extend)
        self._monitor: BuildMonitor | None = None

    def feed(self, events: Sequence[Event]) -> list[Event]:
        """The checked events of ``events``, the next ones read from the journal."""
        if not self.checks:
            return list(events)
        records: list[CallbackRecord] = []
        started = self._started()  # by what was taken, or by a record of this batch
        for event in events:
            if type(event) is BuildStarted:
                if started:  # a journal of several builds
                    self._take(records)
                    records = []
                    self._next_build()
                started = True
            records.append(record_of(event))
        self._take(records)
        taken, self._taken[:] = list(self._taken), []
        return taken

    def _started(self) -> bool:
        return self._monitor is not None and self._monitor.state.build_id is not None

    def _next_build(self) -> None:
        """The next build's callbacks go to a monitor of their own, in the same log."""
        if self._monitor is not None:
            self._log.remove_fold(self._monitor.state.apply)
        self._monitor = None

    def _take(self, records: list[CallbackRecord]) -> None:
        if not records:
            return
        if self._monitor is None:
            # Its build id and attributes come with the build_start it takes as it is.
            self._monitor = BuildMonitor(log=self._log, backend="none")
            self._monitor.reads_a_record = True
        self._monitor.record(records)


def record_of(event: Event) -> CallbackRecord:
    """The record of the callback (or the end, log line or output) that ``event`` recorded; an
    event the recorder made itself (the build's start, a cancel it acted on, its own note of a
    loss) is taken as it is."""
    stamp = (event.wall_ns, event.mono_ns, event.thread)
    if isinstance(event, StepCompleted):
        return ("step", *stamp, event.name, event.step)
    if isinstance(event, PhaseStarted):
        return ("phase_start", *stamp, event.name, event.parent, event.num_steps)
    if isinstance(event, PhaseFinished):
        return ("phase_finish", *stamp, event.name)
    if isinstance(event, LogMessage):
        return ("log", *stamp, event.severity, event.message)
    if isinstance(event, BuildFinished):
        return ("end", *stamp, event.outcome.value, event.detail, event.error_type)
    if isinstance(event, BuildOutput):
        return ("output", *stamp, event.attributes)
    return ("event", *stamp, event)


def read_journal(path: str | os.PathLike[str]) -> journals.Journal:
    """A whole journal as trt-otel takes it (see the module): what every reader that shows or
    judges a build reads. Problems in the body are collected, not raised; a journal that
    cannot be read at all is a :class:`~trt_otel.core.journal.JournalError`. The events are
    checked a batch at a time as they are read, so the journal's own are never all held."""
    items = journals.iter_journal(path)
    header = next(items)
    assert isinstance(header, dict)  # iter_journal yields the header first or raises
    if journals.callbacks_checked(header):
        return journals.read_journal(path)  # checked when written: read as it is, at full speed
    journal = journals.Journal(Path(path), header)
    checked = CheckedEvents(header)
    events, problems = journal.events, journal.problems
    batch: list[Event] = []
    for item in items:
        if isinstance(item, journals.JournalProblem):
            problems.append(item)
            continue
        batch.append(item)  # type: ignore[arg-type]
        if len(batch) >= _READ_BATCH_EVENTS:
            events += checked.feed(batch)
            batch = []
    events += checked.feed(batch)
    return journal


_READ_BATCH_EVENTS = 4096
"""Events read before they are checked: one batch of the log's followers."""


__all__ = ["CheckedEvents", "read_journal", "record_of"]
