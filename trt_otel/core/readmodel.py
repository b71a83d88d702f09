"""The read model: the build folded once, on the follower side, for every view of it.

One follower of the event log folds each event into a :class:`~trt_otel.core.state.BuildState`, the
build's phase boundaries (for the ETA) and the summaries of repeated phases, and then tells its
subscribers (the span projection, the plain console lines) what the event did. Views that draw
on demand (the live console, ``/status``, the ETA gauge) read the model under :attr:`lock`
instead. The monitor's own fold, under the log's lock on TensorRT's threads, stays the minimum
that answering a callback needs; everything people look at comes from here.

Repeated phases are folded by one rule (:meth:`ReadModel.tree`), so the terminal and ``/status``
show one build the same way: finished siblings that share a name under one parent (TensorRT
starts "Measuring tactic time" over a thousand times) become one node with their count and total
time, once there are two of them. Open and aborted phases are always shown on their own.

What the model keeps of a closed phase lives in two places only: its :class:`Phase` record and
its :class:`SiblingGroup`, so a later bound on memory can drop the first and keep the second.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from trt_otel.core.builds import BuildCut
from trt_otel.core.eta import BoundaryTracker, BuildEta, History, estimate
from trt_otel.core.events import (
    BuildFinished,
    BuildStarted,
    Event,
    PhaseFinished,
    PhaseStarted,
    StepCompleted,
)
from trt_otel.core.followers import FollowerHealth
from trt_otel.core.gaps import MIN_GAP_NS, Gaps
from trt_otel.core.log import EventLog
from trt_otel.core.projection import Projection, project
from trt_otel.core.state import BuildState, Phase, PhaseStatus

_logger = logging.getLogger(__name__)

_PROGRESS = frozenset({BuildStarted, PhaseStarted, StepCompleted, PhaseFinished, BuildFinished})


@dataclass(slots=True)
class SiblingGroup:
    """The finished phases of one name under one parent (None: the roots)."""

    name: str
    parent_id: int | None
    count: int = 0
    total_ns: int = 0
    longest_ns: int = 0

    def add(self, phase: Phase) -> None:
        duration = phase.duration_ns() or 0
        self.count += 1
        self.total_ns += duration
        self.longest_ns = max(self.longest_ns, duration)


TreeNode = Phase | SiblingGroup
"""What a tree shows at a place: one phase, or the finished phases of a name folded together."""

PHASE_EVENTS_CLOSING = "closing"
"""A subscriber's ``phase_events``: told of a phase's start or finish only where it closes a
phase (its own, or one it supersedes): the span export, whose spans are the closed phases."""
PHASE_EVENTS_NONE = "none"
"""A subscriber's ``phase_events``: told of no phase's start or finish (after the build's first
event): the log records, which phases do not make."""


class Subscriber(Protocol):
    """Told of the events after the model folded them, on the thread that folds, in ``seq``
    order.

    It reads the model without taking :attr:`ReadModel.lock` (only that thread writes it), must
    not change it, and should be quick: the views that read the model wait for it.

    Most events are steps that change nothing a subscriber draws but the counts: those *quiet*
    steps (a step closes no phase; any step before a cancel) are not told one by one. The next
    other event tells of them too (the model it is told with has folded them); a run of them
    that ends a batch the model folds is told once, by its last (:meth:`on_steps`).

    A subscriber that draws nothing from a phase's start or finish of its own may say so with
    a class attribute ``phase_events`` (:data:`PHASE_EVENTS_CLOSING` or
    :data:`PHASE_EVENTS_NONE`; every phase event, when it has none): a build is mostly phases,
    and a call that does nothing, per phase, per subscriber, is a build's cost for nothing.
    A build's first event is told to every subscriber, whatever it is.
    """

    @property
    def name(self) -> str: ...

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        """Every event but the quiet steps. ``closed``: the phases it closed, innermost
        first."""
        ...

    def on_steps(self, last: StepCompleted) -> None:
        """A batch ended with quiet steps; ``last`` is the latest of them."""
        ...

    def close(self) -> None:
        """The log ended: after the last event."""
        ...


class ReadModel:
    """A follower of the log (``log.follow(model)``), fed directly with :meth:`handle` (a
    replayed journal, a watched build), or the log's own fold (:meth:`fold`, through
    ``BuildMonitor(model=...)``).

    The fold is for a monitor whose callbacks are not TensorRT's own (a build's supervisor,
    which replays the callbacks its worker process made): the build is then folded once, on
    the thread that appends, and the monitor checks each callback against the same state the
    views read. A monitor on TensorRT's threads keeps the minimum there, and the model follows.
    """

    # Slots: read on every event (see BuildState's).
    __slots__ = (
        "_builds",
        "_closed",
        "_forget_closed",
        "_groups",
        "_quiet_step",
        "_subscribers",
        "_told_closing",
        "_told_first",
        "_told_phases",
        "boundaries",
        "gaps",
        "history",
        "is_fold",
        "lock",
        "state",
        "subscriber_errors",
    )

    name = "model"

    def __init__(self, history: History | None = None, *, forget_closed: bool = True) -> None:
        self.history = history
        self._closed: list[Phase] = []
        # Closed phases no view shows are forgotten (their summaries stay, below), and only
        # the latest boundary is kept: the model's memory follows what is open.
        self._forget_closed = forget_closed
        self._builds = BuildCut()
        self._begin_build()
        self.lock = threading.Lock()
        """Held while an event is folded in; readers on other threads hold it while they look."""
        self._subscribers: tuple[Subscriber, ...] = ()
        self._told_phases: tuple[Subscriber, ...] = ()
        """The subscribers told of every phase's start and finish."""
        self._told_closing: tuple[Subscriber, ...] = ()
        """The subscribers told of a phase's start or finish that closes a phase."""
        self._quiet_step: StepCompleted | None = None
        """The latest quiet step the subscribers have not been told of."""
        self.is_fold = False
        """Set when the model is the log's fold: then :meth:`close` is its owner's to call."""
        self.subscriber_errors: dict[str, tuple[int, str]] = {}
        """Per failing subscriber: how many events it failed on, and its last error."""

    # -- the fold --------------------------------------------------------------------------------

    @property
    def build_number(self) -> int:
        """Which build of the log :attr:`state` is: 1 from the first ``build_start``."""
        return self._builds.number

    def _begin_build(self) -> None:
        """A build's own fold: its state, its boundaries and its phases' summaries (a log of
        several builds shows the latest; what came before it is in the log)."""
        self.state = BuildState(
            on_close=self._closed.append,
            forget_closed=self._forget_closed,
            on_forget=self._forget_groups,
        )
        self.boundaries = BoundaryTracker(keep_all=not self._forget_closed)
        self.gaps = Gaps()
        """The build's gaps between callbacks: its silent windows, for the timeline."""
        self._groups: dict[int | None, dict[str, SiblingGroup]] = {}
        self._told_first = False
        """Whether the build's first event was told (to every subscriber)."""

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers = (*self._subscribers, subscriber)
        phase_events = getattr(subscriber, "phase_events", None)
        if phase_events is None:
            self._told_phases = (*self._told_phases, subscriber)
        if phase_events != PHASE_EVENTS_NONE:
            self._told_closing = (*self._told_closing, subscriber)

    def apply(self, event: Event) -> Sequence[Phase]:
        """Fold one event in (events in ``seq`` order); the phases it closed, innermost first."""
        closed = self._closed
        closed.clear()
        with self.lock:
            kind = type(event)
            if kind is BuildStarted and self._builds.begins_another(event):
                self._begin_build()
            gaps, state = self.gaps, self.state
            gaps.seen(event.mono_ns)
            if kind in _PROGRESS:  # before the fold: the gap's phases are those open through it
                gaps.progressed(state.last_progress_mono_ns, event.mono_ns, state)
            state.apply(event)
            if kind is not StepCompleted and kind is not PhaseStarted:  # no boundary there
                self.boundaries.apply(event, state)
            for phase in closed:
                if phase.status is PhaseStatus.FINISHED:
                    self._group(phase).add(phase)
        return tuple(closed) if closed else ()

    def _group(self, phase: Phase) -> SiblingGroup:
        groups = self._groups.get(phase.parent_id)
        if groups is None:
            groups = self._groups[phase.parent_id] = {}
        group = groups.get(phase.name)
        if group is None:
            group = groups[phase.name] = SiblingGroup(phase.name, phase.parent_id)
        return group

    def _forget_groups(self, phase_id: int) -> None:
        """The state forgot what was under ``phase_id``: so do its summaries."""
        self._groups.pop(phase_id, None)

    def fold_of(self, log: EventLog) -> None:
        """Be ``log``'s fold (the build folded once, on the appending thread), for a log that
        holds only this build's events; then :meth:`close` is its owner's to call."""
        self.is_fold = True
        log.add_fold(self.fold, replay_retained=False)
        log.add_batch_consumer(lambda _events: self.end_batch())

    def handle(self, events: Sequence[Event]) -> None:
        """As a follower: fold a batch in, and tell the subscribers."""
        fold = self.fold
        for event in events:
            fold(event)
        self.end_batch()

    def fold(self, event: Event) -> None:
        """Fold one event in and tell the subscribers, except of a quiet step (see
        :class:`Subscriber`): the next other event tells of it, else :meth:`end_batch`."""
        state = self.state
        if type(event) is StepCompleted and state.cancel is None:
            # A step closes no phase and passes no boundary, and nothing is left to forget
            # (below): it changes counts only, which a reader may see a step early or late,
            # so it is folded without the lock (most events are steps).
            last = state.last_progress_mono_ns
            if last is None or event.mono_ns - last >= MIN_GAP_NS:  # it ends a gap, or starts
                self.gaps.progressed(last, event.mono_ns, state)
            state.step(event)
            self._quiet_step = event
            return
        self._quiet_step = None  # told with this event
        closed = self.apply(event)
        told = self._subscribers
        kind = type(event)
        if (kind is PhaseStarted or kind is PhaseFinished) and self._told_first:  # most events
            told = self._told_closing if closed else self._told_phases
        self._told_first = True
        for subscriber in told:
            try:
                subscriber.on_event(event, closed)
            except Exception as error:  # one view's bug costs that view, not the others
                self._failed(subscriber.name, error)
        if closed:
            with self.lock:  # the views have seen the closed phases: forget them now
                self.state.forget_closed_now()

    def end_batch(self) -> None:
        """Tell the subscribers of the quiet steps that ended the batch, if any."""
        last, self._quiet_step = self._quiet_step, None
        if last is None:
            return
        for subscriber in self._subscribers:
            try:
                subscriber.on_steps(last)
            except Exception as error:
                self._failed(subscriber.name, error)

    def close(self) -> None:
        self.end_batch()
        for subscriber in self._subscribers:
            try:
                subscriber.close()
            except Exception as error:
                self._failed(subscriber.name, error)

    def health(self) -> FollowerHealth:
        """How the model is doing as the log's fold, in a follower's terms (it has no queue:
        it folds each event as it is appended); its errors are its subscribers'."""
        errors = self.subscriber_errors
        last_error = next(iter(errors.values()))[1] if errors else None
        return FollowerHealth(
            name=self.name,
            handled=self.state.last_seq + 1,
            dropped=0,
            errors=sum(count for count, _ in errors.values()),
            queued=0,
            last_error=last_error,
        )

    def _failed(self, name: str, error: Exception) -> None:
        count, _ = self.subscriber_errors.get(name, (0, ""))
        self.subscriber_errors[name] = (count + 1, f"{type(error).__name__}: {error}")
        if count == 0:
            _logger.warning(
                "trt-otel %s failed (%s: %s); the build goes on, further errors are only counted",
                name,
                type(error).__name__,
                error,
            )

    # -- queries (hold :attr:`lock` from another thread) ------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[ReadModel]:
        """The model held still while the caller looks at it."""
        with self.lock:
            yield self

    def tree(self, parent_id: int | None = None) -> list[TreeNode]:
        """The nodes under a phase (None: the roots), in start order, repeated phases folded:
        a name's finished phases become one :class:`SiblingGroup` where the first of them
        started, once there are two or more."""
        state = self.state
        ids = state.roots if parent_id is None else state.phases[parent_id].children
        nodes: list[TreeNode] = []
        shown: set[str] = set()
        groups = self._groups.get(parent_id, {})
        for phase_id in ids:
            phase = state.phases[phase_id]
            if phase.status is PhaseStatus.FINISHED:
                group = groups.get(phase.name)
                if group is not None and group.count > 1:
                    if phase.name not in shown:
                        shown.add(phase.name)
                        nodes.append(group)
                    continue
            nodes.append(phase)
        return nodes

    def estimate_locked(self, now_mono_ns: int) -> BuildEta:
        """Every estimate of the time left, at ``now_mono_ns`` (the caller holds the lock, or
        is the model's own thread)."""
        return estimate(self.state, self.boundaries, now_mono_ns, self.history)

    def estimate(self, now_mono_ns: int) -> BuildEta:
        """Every estimate of the time left, at ``now_mono_ns``; from any thread."""
        with self.lock:
            return self.estimate_locked(now_mono_ns)

    def project(self, now_mono_ns: int) -> Projection | None:
        """When the build is expected to end, for a deadline to decide by; from any thread."""
        with self.lock:
            return project(self.state, self.boundaries, now_mono_ns, self.history)
