"""BuildState: a pure fold of the event log into the phase tree, progress and outcome.

``apply`` reads nothing but its argument (no clock, no I/O), so a journal replayed through a new
BuildState ends in exactly the state of the live run. It is tolerant: every protocol departure
the monitor records as an :class:`~trt_otel.core.events.Anomaly` is also handled here the same way,
so
a replay of a journal with anomalies folds identically.

Phase names are unique only among open phases, so a phase instance is identified by the ``seq``
of its ``phase_start`` event (``Phase.id``).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from trt_otel.core.activity import Activity
from trt_otel.core.events import (
    Anomaly,
    AnomalyKind,
    BuildFinished,
    BuildStarted,
    CancelRequested,
    Event,
    GpuSample,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)


class PhaseStatus(enum.StrEnum):
    OPEN = "open"
    FINISHED = "finished"
    """TensorRT called ``phase_finish``."""
    ABORTED = "aborted"
    """Closed without ``phase_finish``: the build ended, was cancelled, or the protocol broke
    (see ``Phase.close_reason``)."""


STATUS_TEXT: dict[PhaseStatus, str] = {status: status.value for status in PhaseStatus}
"""Each status's text, read without the enum's ``value`` property (a call in Python): the
views write a phase's status once per span and per timeline instance."""


class Phase(msgspec.Struct, gc=False):
    """One instance of a TensorRT phase.

    A msgspec struct, built in C: a build can start hundreds of thousands of phases, and a
    dataclass's ``__init__`` cost the supervisor about a microsecond each. ``gc=False``: it
    holds strings, numbers and a list of ids, never a cycle.
    """

    id: int
    name: str
    parent_id: int | None
    depth: int
    num_steps: int
    start_wall_ns: int
    start_mono_ns: int
    finish_wall_ns: int | None = None
    finish_mono_ns: int | None = None
    steps_completed: int = 0
    last_step: int = -1
    skipped_steps: int = 0
    status: PhaseStatus = PhaseStatus.OPEN
    close_reason: str | None = None
    children: list[int] = msgspec.field(default_factory=list)

    @property
    def is_open(self) -> bool:
        return self.status is PhaseStatus.OPEN

    def duration_ns(self, now_mono_ns: int | None = None) -> int | None:
        end = self.finish_mono_ns if self.finish_mono_ns is not None else now_mono_ns
        return None if end is None else end - self.start_mono_ns


class BuildStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    CANCELLING = "cancelling"
    """A cancel was requested; TensorRT has not stopped yet."""
    FINISHED = "finished"


class AnotherBuildError(ValueError):
    """A ``build_start`` folded into a state that has one: a log of several builds is cut into
    builds before it is folded (:mod:`trt_otel.core.builds`), one state per build."""


class BuildState:
    """The fold of one build. Mutated only by :meth:`apply`; read by projections and people.

    ``on_close`` is told of each phase as it closes (finished or aborted), innermost first,
    inside :meth:`apply`: how a follower-side read model learns which phases an event closed
    without comparing the open phases before and after. It must not change the state.
    """

    # Slots: every event of a build reads and writes these. Held in slots instead of an
    # instance dict, the monitor and read model of a supervisor run 5.5% fewer instructions
    # (callgrind; BENCHMARKS.md, "Slots on the fold").
    __slots__ = (
        "_first_finished",
        "_forget",
        "_forgotten_roots",
        "_kept_as_latest",
        "_on_close",
        "_on_forget",
        "_to_forget",
        "activity",
        "anomalies",
        "attributes",
        "build_id",
        "cancel",
        "end_mono_ns",
        "end_wall_ns",
        "error_type",
        "gpu",
        "last_event_mono_ns",
        "last_progress_mono_ns",
        "last_progress_wall_ns",
        "last_seq",
        "latest_by_name",
        "open_by_name",
        "outcome",
        "outcome_detail",
        "phases",
        "phases_started_total",
        "roots",
        "start_mono_ns",
        "start_wall_ns",
        "steps_completed_total",
    )

    def __init__(
        self,
        *,
        on_close: Callable[[Phase], None] | None = None,
        forget_closed: bool = False,
        on_forget: Callable[[int], None] | None = None,
    ) -> None:
        self._on_close = on_close
        self._forget = forget_closed
        self._on_forget = on_forget
        self._to_forget: list[Phase] = []
        self._first_finished: dict[int | None, dict[str, int]] = {}
        self._kept_as_latest: set[int] = set()
        self._forgotten_roots = 0
        """Finished roots forgotten: each still counts, done, in :meth:`progress_ratio`."""
        self.build_id: str | None = None
        self.attributes: dict[str, Any] = {}
        self.start_wall_ns: int | None = None
        self.start_mono_ns: int | None = None
        self.end_wall_ns: int | None = None
        self.end_mono_ns: int | None = None
        self.outcome: Outcome | None = None
        self.outcome_detail: str = ""
        self.error_type: str | None = None
        self.cancel: CancelRequested | None = None
        self.phases: dict[int, Phase] = {}
        self.roots: list[int] = []
        self.open_by_name: dict[str, int] = {}
        self.latest_by_name: dict[str, int] = {}
        """The latest instance of each phase name: few (TensorRT has a dozen), for gauges."""
        self.steps_completed_total = 0
        self.phases_started_total = 0
        self.anomalies: Counter[AnomalyKind] = Counter()
        self.last_progress_wall_ns: int | None = None
        self.last_progress_mono_ns: int | None = None
        self.last_event_mono_ns: int | None = None
        self.last_seq = -1
        self.gpu: GpuSample | None = None
        """The latest GPU sample, if the build's GPU is sampled."""
        self.activity = Activity()
        """The builder's process, if it is sampled: working, idle, stopped or gone."""

    # -- the fold ------------------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Fold one event of this build in. Events must arrive in ``seq`` order; a second
        ``build_start`` raises :class:`AnotherBuildError`."""
        kind = type(event)  # events are final classes: a type is cheaper to test than a class
        if kind is StepCompleted:
            self.step(event)  # type: ignore[arg-type]
            return
        if self._to_forget:
            self._forget_closed()
        self.last_seq = event.seq
        self.last_event_mono_ns = event.mono_ns
        if kind is PhaseStarted:
            self._phase_start(event)  # type: ignore[arg-type]
        elif kind is PhaseFinished:
            self._phase_finish(event)  # type: ignore[arg-type]
        elif isinstance(event, BuildStarted):
            if self.build_id is not None:
                raise AnotherBuildError(
                    f"build {event.build_id!r} started in the state of build {self.build_id!r}"
                )
            self.build_id = event.build_id
            self.attributes = dict(event.attributes)
            self.start_wall_ns = event.wall_ns
            self.start_mono_ns = event.mono_ns
            self._progressed(event)
        elif isinstance(event, CancelRequested):
            if self.cancel is None:
                self.cancel = event
        elif isinstance(event, Anomaly):
            self.anomalies[event.kind] += 1
        elif isinstance(event, BuildFinished):
            self._build_end(event)
        elif isinstance(event, GpuSample):
            self.gpu = event
        elif isinstance(event, ProcessSample):
            self.activity.sample(event, self.last_progress_mono_ns, self.gpu)

    def step(self, event: StepCompleted) -> None:
        """:meth:`apply` of a step, for a caller that knows it has one (a build's events are
        mostly steps: the read model folds them without :meth:`apply`'s dispatch)."""
        if self._to_forget:
            self._forget_closed()
        self.last_seq = event.seq
        self.steps_completed_total += 1
        # _progressed, written out
        self.last_progress_wall_ns = event.wall_ns
        self.last_event_mono_ns = self.last_progress_mono_ns = event.mono_ns
        phase_id = self.open_by_name.get(event.name)
        if phase_id is None:
            return
        phase = self.phases[phase_id]
        phase.steps_completed += 1
        if event.step > phase.last_step:
            phase.skipped_steps += event.step - phase.last_step - 1
            phase.last_step = event.step

    def _phase_start(self, event: PhaseStarted) -> None:
        self.phases_started_total += 1
        self._progressed(event)
        if self._kept_as_latest:
            older = self.latest_by_name.get(event.name)
            if older in self._kept_as_latest:
                self._kept_as_latest.discard(older)
                del self.phases[older]
        superseded = self.open_by_name.get(event.name)
        if superseded is not None:
            self._close_subtree(superseded, event, "superseded by a phase of the same name")
        parent_id = self.open_by_name.get(event.parent) if event.parent is not None else None
        parent = self.phases.get(parent_id) if parent_id is not None else None
        phase = Phase(
            id=event.seq,
            name=event.name,
            parent_id=parent_id,
            depth=0 if parent is None else parent.depth + 1,
            num_steps=event.num_steps,
            start_wall_ns=event.wall_ns,
            start_mono_ns=event.mono_ns,
        )
        self.phases[phase.id] = phase
        self.open_by_name[phase.name] = phase.id
        self.latest_by_name[phase.name] = phase.id
        if parent is None:
            self.roots.append(phase.id)
        else:
            parent.children.append(phase.id)

    def _phase_finish(self, event: PhaseFinished) -> None:
        self._progressed(event)
        phase_id = self.open_by_name.get(event.name)
        if phase_id is None:
            return
        for child_id in self.open_descendants(phase_id):
            self._close(self.phases[child_id], event, "its parent finished first")
        self._close(self.phases[phase_id], event, None)

    def _build_end(self, event: BuildFinished) -> None:
        for phase_id in reversed(self.open_phase_ids()):
            self._close(self.phases[phase_id], event, f"build ended: {event.outcome}")
        self.outcome = event.outcome
        self.outcome_detail = event.detail
        self.error_type = event.error_type
        self.end_wall_ns = event.wall_ns
        self.end_mono_ns = event.mono_ns

    def _close_subtree(self, phase_id: int, event: Event, reason: str) -> None:
        for child_id in self.open_descendants(phase_id):
            self._close(self.phases[child_id], event, reason)
        self._close(self.phases[phase_id], event, reason)

    def _close(self, phase: Phase, event: Event, abort_reason: str | None) -> None:
        phase.finish_wall_ns = event.wall_ns
        phase.finish_mono_ns = event.mono_ns
        if abort_reason is None:
            phase.status = PhaseStatus.FINISHED
        else:
            phase.status = PhaseStatus.ABORTED
            phase.close_reason = abort_reason
        if self.open_by_name.get(phase.name) == phase.id:
            del self.open_by_name[phase.name]
        if self._on_close is not None:
            self._on_close(phase)
        if self._forget:
            self._to_forget.append(phase)

    # -- forgetting (``forget_closed``): memory that follows what is open, not what happened -------

    def forget_closed_now(self) -> None:
        """Forget what the last event closed now, rather than when the next event is folded
        (a read model does, once its views have seen the closed phases): the next event, if a
        step, then changes no structure, only counts."""
        if self._to_forget:
            self._forget_closed()

    def _forget_closed(self) -> None:
        """Drop the phases the previous event closed that no view can show any more (their
        spans are made and the journal has them; the read model keeps their summary). A
        finished phase stays while it is the only one of its name under its parent (a view
        shows it, and its children, on their own); once a second one finishes, views show
        the name's summary where the first one was, so the first stays as that place, without
        its children, and the later ones go with theirs. Aborted and open phases stay, and
        the latest instance of each name stays for the gauges."""
        pending, self._to_forget = self._to_forget, []
        phases = self.phases
        for phase in pending:
            if phase.status is not PhaseStatus.FINISHED or phases.get(phase.id) is not phase:
                continue
            firsts = self._first_finished.setdefault(phase.parent_id, {})
            first_id = firsts.get(phase.name)
            if first_id is None:
                firsts[phase.name] = phase.id
                continue
            first = phases.get(first_id)
            if first is not None and first.children:
                for child_id in first.children:
                    self._drop(child_id)
                first.children = []
                self._first_finished.pop(first_id, None)
                if self._on_forget is not None:
                    self._on_forget(first_id)
            parent = phases.get(phase.parent_id) if phase.parent_id is not None else None
            siblings = self.roots if parent is None else parent.children
            if siblings and siblings[-1] == phase.id:
                siblings.pop()
            elif phase.id in siblings:
                siblings.remove(phase.id)
            if phase.parent_id is None:
                self._forgotten_roots += 1
            if phase.children:
                self._drop(phase.id)
            else:  # a leaf (most phases)
                self._drop_one(phase.id, phase)

    def _drop(self, phase_id: int) -> None:
        """Drop a phase and everything under it (children before their parent), with a stack
        of its own rather than recursion: a journal may nest phases as deep as it likes."""
        stack: list[tuple[int, bool]] = [(phase_id, False)]
        while stack:
            current_id, children_done = stack.pop()
            phase = self.phases.get(current_id)
            if phase is None:
                continue
            if not children_done:
                stack.append((current_id, True))
                stack.extend((child_id, False) for child_id in reversed(phase.children))
                continue
            self._drop_one(current_id, phase)

    def _drop_one(self, phase_id: int, phase: Phase) -> None:
        """Drop one phase whose children are dropped already."""
        phase.children = []
        self._first_finished.pop(phase_id, None)
        if self._on_forget is not None:
            self._on_forget(phase_id)
        if self.latest_by_name.get(phase.name) == phase_id:
            self._kept_as_latest.add(phase_id)  # out of the tree, still read by the gauges
        else:
            del self.phases[phase_id]

    def _progressed(self, event: Event) -> None:
        self.last_progress_wall_ns = event.wall_ns
        self.last_progress_mono_ns = event.mono_ns

    # -- queries -------------------------------------------------------------------------------

    @property
    def status(self) -> BuildStatus:
        if self.outcome is not None:
            return BuildStatus.FINISHED
        if self.cancel is not None:
            return BuildStatus.CANCELLING
        if self.start_mono_ns is None and not self.phases:
            return BuildStatus.PENDING
        return BuildStatus.RUNNING

    def open_phase_ids(self) -> list[int]:
        """Open phases, outermost first (in start order, so a parent precedes its children)."""
        return sorted(self.open_by_name.values())

    def innermost_open(self) -> str | None:
        """The name of the latest-started open phase: where the build is, for the lines and
        reasons that say so. None when no phase is open."""
        open_ids = self.open_by_name.values()
        return self.phases[max(open_ids)].name if open_ids else None

    def open_descendants(self, phase_id: int) -> list[int]:
        """Open phases below ``phase_id``, innermost (latest started) first."""
        # Descendants start after their ancestor: when no open phase is younger, there are
        # none (the usual case, since TensorRT finishes the innermost phase first). The dict
        # keeps start order (a phase enters when it starts, leaves when it closes), so the
        # youngest open phase is its last value.
        open_ids = self.open_by_name.values()
        if not open_ids or next(reversed(open_ids)) <= phase_id:
            return []
        # Every ancestor of an open phase is open (a phase closes with its open descendants),
        # and starts before it: one pass in start order finds them, however deep they nest.
        below = {phase_id}
        found = []
        for open_id in open_ids:
            if self.phases[open_id].parent_id in below:
                below.add(open_id)
                found.append(open_id)
        return sorted(found, reverse=True)

    def phase_progress(self, phase_id: int) -> float:
        """Fraction of a phase done: its completed steps plus the progress of its open child,
        over its step count. TensorRT reports the index of each completed step.

        Walked down the chain of open children, then summed back up, without recursion: a
        journal may nest phases as deep as it likes."""
        chain: list[Phase] = []
        phase: Phase | None = self.phases[phase_id]
        while phase is not None:
            chain.append(phase)
            if phase.status is PhaseStatus.FINISHED:
                break
            below = None
            for child_id in reversed(phase.children):
                child = self.phases[child_id]
                if child.status is phase.status:  # its open child; or, aborted, its aborted one
                    below = child
                    break
            phase = below
        progress = 0.0
        for phase in reversed(chain):
            if phase.status is PhaseStatus.FINISHED:
                progress = 1.0
                continue
            # An aborted phase (a cancelled or failed build) counts what it had done, not 100%.
            done = float(phase.last_step + 1) + progress
            progress = min(1.0, done / phase.num_steps) if phase.num_steps > 0 else 0.0
        return progress

    def progress_ratio(self) -> float:
        """Overall progress in [0, 1], read off the root phases (1 once the build succeeded).

        It is a guide, not a promise: TensorRT decides the steps of later phases as it goes.
        """
        if self.outcome is Outcome.SUCCESS:
            return 1.0
        forgotten = self._forgotten_roots  # finished: 1 each
        if not self.roots and not forgotten:
            return 0.0
        # fsum: the same sum in any order, so a state that forgets gives the very ratio of one
        # that does not.
        done = math.fsum([*map(self.phase_progress, self.roots), forgotten])
        return done / (len(self.roots) + forgotten)

    def walk(self) -> Iterator[Phase]:
        """Every phase, depth first, children in start order."""
        stack = list(reversed(self.roots))
        while stack:
            phase = self.phases[stack.pop()]
            yield phase
            stack.extend(reversed(phase.children))

    def check_phase_start(self, name: str, parent: str | None) -> list[tuple[AnomalyKind, str]]:
        """The anomalies a ``phase_start`` would show, given the phases open now."""
        found = []
        if name in self.open_by_name:
            found.append(
                (AnomalyKind.NAME_REUSED_WHILE_OPEN, f"phase {name!r} started while still open")
            )
        if parent is not None and parent not in self.open_by_name:
            found.append(
                (AnomalyKind.UNKNOWN_PARENT, f"parent {parent!r} of {name!r} is not an open phase")
            )
        return found

    def check_step(self, name: str, step: int) -> list[tuple[AnomalyKind, str]]:
        """The anomalies a ``step_complete`` would show, given the phases open now."""
        phase_id = self.open_by_name.get(name)
        if phase_id is None:
            return [(AnomalyKind.STEP_FOR_UNKNOWN_PHASE, f"step {step} of {name!r}, not open")]
        phase = self.phases[phase_id]
        if phase.last_step < step < phase.num_steps:
            return []  # the usual case, on the hot path: no list to build
        found = []
        if not 0 <= step < phase.num_steps:
            found.append(
                (
                    AnomalyKind.STEP_OUT_OF_RANGE,
                    f"step {step} of {name!r} outside [0, {phase.num_steps})",
                )
            )
        elif step <= phase.last_step:
            found.append(
                (
                    AnomalyKind.STEP_NOT_INCREASING,
                    f"step {step} of {name!r} after step {phase.last_step}",
                )
            )
        return found

    def check_phase_finish(self, name: str) -> list[tuple[AnomalyKind, str]]:
        """The anomalies a ``phase_finish`` would show, given the phases open now."""
        phase_id = self.open_by_name.get(name)
        if phase_id is None:
            return [(AnomalyKind.FINISH_OF_UNKNOWN_PHASE, f"phase {name!r} is not open")]
        open_children = self.open_descendants(phase_id)
        if open_children:
            names = ", ".join(repr(self.phases[c].name) for c in open_children)
            return [
                (
                    AnomalyKind.FINISH_WITH_OPEN_CHILDREN,
                    f"phase {name!r} finished while {names} still open",
                )
            ]
        return []
