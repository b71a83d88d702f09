"""The equalities the design promises, held for any sequence of callbacks: TensorRT's skipped
steps, early finishes, reused names, unknown parents, a parent's step while a child is open,
``step == num_steps``, cancels, callbacks after the end, log lines in any script, samples.

1. The state folded live is the state folded from the journal, at every moment; and it is
   what the protocol says (a reference fold of the callbacks, written plainly here).
2. The spans are functions of the events: the live projection and a replay of the journal make
   the same span records, each phase's span id its own.
3. ``LineReader`` reads the same events and problems for any cut of a journal's bytes into
   chunks (inside a line, inside a UTF-8 character).
4. The read model's forgetting fold draws the tree of the fold that forgets nothing, at every
   step of a build (a state machine).
5. A checked journal and an unchecked one (the C++ monitor's: records only) of the same
   callbacks read the same events, however the reader batches them.
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import Phase as Stage
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from journals import unchecked
from trt_otel import BuildMonitor, JournalWriter, ManualClock, read_journal
from trt_otel.capture import checked
from trt_otel.capture.checked import CheckedEvents
from trt_otel.core import journal_reader as journals
from trt_otel.core.events import (
    AnomalyKind,
    BuildFinished,
    Event,
    GpuSample,
    Outcome,
    ProcessSample,
    StepCompleted,
)
from trt_otel.core.journal_codec import encode_events
from trt_otel.core.journal_reader import JournalProblem, LineReader
from trt_otel.core.log import EventLog
from trt_otel.core.readmodel import ReadModel, SiblingGroup, TreeNode
from trt_otel.core.state import BuildState, Phase, PhaseStatus
from trt_otel.views.spans import SpanProjection, SpanRecord
from trt_otel.views.status import status_document
from trt_otel.views.trace_ids import phase_span_id


def properties(max_examples: int, **more: Any) -> settings:
    """A few seconds each, for the inner loop: no deadline and no complaint about slow data
    (the machine is shared), and no explain phase (it retraces a failure for minutes)."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        phases=[Stage.explicit, Stage.reuse, Stage.generate, Stage.shrink],
        **more,
    )


# -- callbacks as TensorRT makes them, quirks included -------------------------------------------

NAMES = (
    "Building engine",
    "Timing tactics",
    "Measuring tactic time",
    "Optimizing graph",
    "Sélection ✓ 層",  # two- and three-byte UTF-8 characters in a name
)
UNKNOWN = "Nowhere"
MESSAGE = st.text(st.characters(codec="utf-8"), max_size=6) | st.sampled_from(
    ["naïve café", "漢字の層", "🙂 four bytes", 'quote " and \\ and \n newline']
)
Call = tuple[Any, ...]
Draw = Callable[[st.SearchStrategy[Any]], Any]

# How often each kind of call is drawn (a cancel or an end, rarely: most builds run on).
KINDS = (
    ["start"] * 5
    + ["step"] * 8
    + ["finish"] * 4
    + ["repeat", "wait", "wait", "log", "gpu", "process"]
    + ["cancel", "end", "output"]
)


@functools.cache
def _index(count: int) -> st.SearchStrategy[int]:
    return st.integers(0, count - 1)


def pick(draw: Draw, options: Sequence[Any]) -> Any:
    """One of ``options`` (which depend on the state: a strategy made once per length, as
    one made per draw costs more than the test)."""
    return options[draw(_index(len(options)))]


KIND = st.sampled_from(KINDS)
NAME = st.sampled_from(NAMES)
ANY_NAME = st.sampled_from((*NAMES, UNKNOWN))
NUM_STEPS = st.integers(1, 5) | st.just(0)
SOME = st.integers(0, 7)
REPEATS = st.integers(1, 3)
WAIT = st.sampled_from([0.0, 0.2, 2.0, 12.0])
SEVERITY = st.sampled_from(["error", "warning", "info", "verbose", "odd"])
BYTES = st.integers(0, 2**40)
RATIO = st.sampled_from([0.0, 0.25, 1.0])
CPU = st.sampled_from([0.5, 3.0, 9.5])
OUTCOME = st.sampled_from([None, None, "failure", "cancellation", "timeout"])


def next_calls(draw: Draw, state: BuildState, kind: str | None = None) -> list[Call]:
    """The next callback (or a run of them) given the phases open in ``state``: mostly what
    TensorRT does, often what it does wrong."""
    kind = kind or draw(KIND)
    open_names = list(state.open_by_name)  # in start order: the innermost last
    innermost = open_names[-1] if open_names else None
    if kind == "start":
        name = draw(NAME)  # an open one's name now and then: reused
        parents: list[str | None] = [innermost, innermost, None, UNKNOWN, *open_names]
        return [("start", name, pick(draw, parents), draw(NUM_STEPS))]
    if kind == "step":
        if open_names and draw(SOME):
            name = pick(draw, [innermost, *open_names])  # a parent's, at times
            phase = state.phases[state.open_by_name[name]]
            last, count = phase.last_step, phase.num_steps
            # The next step mostly; skipped ones, a repeat, step == num_steps, a negative one.
            step = pick(draw, [last + 1] * 4 + [last + 2, last + 3, last, count, -1])
            return [("step", name, step)]
        return [("step", draw(ANY_NAME), draw(SOME))]
    if kind == "finish":
        choices = [innermost, innermost, *open_names] if open_names else []
        return [("finish", pick(draw, [*choices, *NAMES, UNKNOWN]))]  # early, or not open
    if kind == "repeat":
        # Finished siblings of one name, each with a child: what the read model folds and
        # forgets ("Measuring tactic time" a thousand times under "Timing tactics").
        name, child = draw(NAME), draw(NAME)
        block: list[Call] = [
            ("start", name, innermost, 2),
            ("start", child, name, 1),
            ("step", child, 0),
            ("finish", child),
            ("step", name, 0),
            ("finish", name),
        ]
        times: int = draw(REPEATS)
        return block * times
    if kind == "wait":
        return [("wait", draw(WAIT))]
    if kind == "log":
        return [("log", draw(SEVERITY), draw(MESSAGE))]
    if kind == "gpu":
        return [("gpu", draw(BYTES), draw(RATIO))]
    if kind == "process":
        return [("process", draw(CPU), draw(BYTES))]
    if kind == "cancel":
        return [("cancel", draw(st.booleans()))]
    if kind == "output":
        return [("output", draw(BYTES))]
    return [("end", draw(OUTCOME))]


def play(monitor: BuildMonitor, clock: ManualClock, call: Call) -> None:
    """Make one call on ``monitor``, a millisecond after the last."""
    clock.advance(0.001)
    kind = call[0]
    if kind == "start":
        monitor.phase_start(call[1], call[2], call[3])
    elif kind == "step":
        monitor.step_complete(call[1], call[2])
    elif kind == "finish":
        monitor.phase_finish(call[1])
    elif kind == "wait":
        clock.advance(call[1])
    elif kind == "log":
        monitor.log_message(call[1], call[2])
    elif kind == "gpu":
        monitor.sample(GpuSample, index=0, memory_used_bytes=call[1], utilization=call[2])
    elif kind == "process":
        monitor.sample(
            ProcessSample, pid=7, status="running", cpu_seconds=call[1], rss_bytes=call[2]
        )
    elif kind == "cancel":
        monitor.cancel("stop: ça suffit", source="user", timeout=call[1], policy="user")
    elif kind == "output":
        monitor.record_output({"engine.bytes": call[1], "engine.path": "é.engine"})
    else:
        outcome = call[1]
        if outcome is None:
            monitor.end()
        else:
            monitor.end(Outcome(outcome), f"ended: {outcome} ✗", error_type="Failed")


@st.composite
def builds_of_calls(draw: st.DrawFn, max_calls: int = 30) -> list[Call]:
    """A build's calls, each drawn given the phases its earlier calls left open."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock, backend="none")
    calls: list[Call] = []
    for _ in range(draw(st.integers(0, max_calls))):
        for call in next_calls(draw, monitor.state):
            play(monitor, clock, call)
            calls.append(call)
    return calls


CALLS = builds_of_calls()
SHORT_CALLS = builds_of_calls(max_calls=15)


@contextmanager
def journal_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="trt-otel-props-") as directory:
        yield Path(directory) / "build.jsonl"


def journaled(
    calls: Sequence[Call], path: Path, monitor: BuildMonitor, clock: ManualClock
) -> list[Event]:
    """Play ``calls`` on ``monitor`` with the real journal writer as a follower of its log;
    the events of the log (the journal is complete when this returns)."""
    monitor.log.follow(JournalWriter(path), min_interval_s=0.0)
    for call in calls:
        play(monitor, clock, call)
    monitor.close()
    return monitor.log.recent()


# -- 1. the state live, replayed, and as the protocol says ----------------------------------------


def shape(state: BuildState) -> dict[str, Any]:
    """Everything a state holds that a view or a policy may read, as plain values (a copy:
    the state goes on changing)."""
    activity = state.activity
    shaped: dict[str, Any] = msgspec.to_builtins(
        {
            "build": (state.build_id, state.attributes, state.status),
            "times": (state.start_wall_ns, state.start_mono_ns, state.end_wall_ns),
            "end": (state.end_mono_ns, state.outcome, state.outcome_detail, state.error_type),
            "cancel": state.cancel,
            "phases": state.phases,
            "roots": state.roots,
            "open": state.open_by_name,
            "latest": state.latest_by_name,
            "totals": (state.steps_completed_total, state.phases_started_total),
            "anomalies": dict(state.anomalies),
            "progress": (state.last_progress_wall_ns, state.last_progress_mono_ns),
            "last": (state.last_event_mono_ns, state.last_seq),
            "ratio": (state.progress_ratio(), [state.phase_progress(i) for i in state.phases]),
            "gpu": state.gpu,
            "activity": (
                activity.last_sample,
                activity.verdict,
                activity.since_mono_ns,
                activity.last_active_mono_ns,
                activity.peak_rss_bytes,
                activity.rss_rising,
            ),
        }
    )
    return shaped


def moments_replayed(events: Sequence[Event], forget_closed: bool) -> dict[int, dict[str, Any]]:
    """The shape of a fresh state after each event (by its seq; -1: before the first)."""
    state = BuildState(forget_closed=forget_closed)
    moments = {-1: shape(state)}
    for event in events:
        state.apply(event)
        moments[event.seq] = shape(state)
    return moments


@properties(100)
@given(calls=CALLS, forget_closed=st.booleans())
def test_the_live_state_is_the_state_replayed_from_the_journal_at_every_moment(
    calls: list[Call], forget_closed: bool
) -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock, backend="none", forget_closed=forget_closed)
    live: list[tuple[int, dict[str, Any]]] = [(-1, shape(monitor.state))]
    with journal_path() as path:
        monitor.log.follow(JournalWriter(path), min_interval_s=0.0)
        for call in calls:
            play(monitor, clock, call)
            live.append((monitor.state.last_seq, shape(monitor.state)))
        monitor.close()
        journal = read_journal(path)
    assert journal.problems == []
    replayed = moments_replayed(journal.events, forget_closed)
    assert len(replayed) == len(monitor.log.recent()) + 1, "every event, once"
    for seq, expected in live:
        assert replayed[seq] == expected, f"after seq {seq}"


@dataclass
class RefPhase:
    name: str
    parent: int | None
    depth: int
    num_steps: int
    start_ns: int
    finish_ns: int | None = None
    steps: int = 0
    last: int = -1
    skipped: int = 0
    status: str = "open"
    reason: str | None = None
    children: list[int] = field(default_factory=list)


class Protocol:
    """TensorRT's protocol as the documentation states it, folded plainly from the callbacks
    (phases by start order, the open ones by a scan): what the monitor's state must say."""

    def __init__(self) -> None:
        self.phases: list[RefPhase] = []
        self.open: list[int] = []
        self.anomalies: Counter[str] = Counter()
        self.steps = 0
        self.ended = False
        self.outcome: str | None = None
        self.cancel: tuple[str, bool] | None = None

    def named(self, name: str | None) -> int | None:
        found = [i for i in self.open if self.phases[i].name == name]
        assert len(found) <= 1, "one open phase of a name"
        return found[0] if found else None

    def below(self, index: int) -> list[int]:
        """The open phases under ``index``, innermost first."""
        out: list[int] = []
        for child in self.phases[index].children:
            if child in self.open:
                out += [*self.below(child), child]
        return sorted(out, reverse=True)

    def close(self, index: int, now: int, reason: str | None) -> None:
        phase = self.phases[index]
        phase.status, phase.reason, phase.finish_ns = (
            ("finished", None, now) if reason is None else ("aborted", reason, now)
        )
        self.open.remove(index)

    def anomaly(self, kind: AnomalyKind) -> None:
        self.anomalies[kind.value] += 1

    def call(self, call: Call, now: int) -> None:
        kind = call[0]
        if kind in ("start", "step", "finish") and self.ended:
            self.anomaly(AnomalyKind.CALLBACK_OUTSIDE_BUILD)
        if kind == "start":
            _, name, parent, num_steps = call
            if num_steps < 1:
                self.anomaly(AnomalyKind.INVALID_ARGUMENT)
            old = self.named(name)
            if old is not None:
                self.anomaly(AnomalyKind.NAME_REUSED_WHILE_OPEN)
            if parent is not None and self.named(parent) is None:
                self.anomaly(AnomalyKind.UNKNOWN_PARENT)
            if old is not None:
                for closing in [*self.below(old), old]:
                    self.close(closing, now, "superseded by a phase of the same name")
            up = self.named(parent) if parent is not None else None
            depth = 0 if up is None else self.phases[up].depth + 1
            self.phases.append(RefPhase(name, up, depth, num_steps, now))
            self.open.append(len(self.phases) - 1)
            if up is not None:
                self.phases[up].children.append(len(self.phases) - 1)
        elif kind == "step":
            _, name, step = call
            index = self.named(name)
            self.steps += 1
            if index is None:
                self.anomaly(AnomalyKind.STEP_FOR_UNKNOWN_PHASE)
                return
            phase = self.phases[index]
            if not 0 <= step < phase.num_steps:
                self.anomaly(AnomalyKind.STEP_OUT_OF_RANGE)
            elif step <= phase.last:
                self.anomaly(AnomalyKind.STEP_NOT_INCREASING)
            phase.steps += 1
            if step > phase.last:
                phase.skipped += step - phase.last - 1
                phase.last = step
        elif kind == "finish":
            index = self.named(call[1])
            if index is None:
                self.anomaly(AnomalyKind.FINISH_OF_UNKNOWN_PHASE)
                return
            under = self.below(index)
            if under:
                self.anomaly(AnomalyKind.FINISH_WITH_OPEN_CHILDREN)
            for child in under:
                self.close(child, now, "its parent finished first")
            self.close(index, now, None)
        elif kind == "cancel":
            if self.cancel is None and not self.ended:  # an ended build has nothing to cancel
                self.cancel = ("stop: ça suffit", call[1])
        elif kind == "end" and self.outcome is None:
            outcome = call[1]
            if outcome is None:
                cancel = self.cancel
                outcome = (
                    "success" if cancel is None else "timeout" if cancel[1] else "cancellation"
                )
            for index in list(self.open):
                self.close(index, now, f"build ended: {outcome}")
            self.outcome, self.ended = outcome, True

    def view(self) -> dict[str, Any]:
        return {
            "phases": [
                (
                    p.name,
                    p.parent,
                    p.depth,
                    p.num_steps,
                    p.start_ns,
                    p.finish_ns,
                    p.steps,
                    p.last,
                    p.skipped,
                    p.status,
                    p.reason,
                    p.children,
                )
                for p in self.phases
            ],
            "open": sorted(self.phases[i].name for i in self.open),
            "anomalies": dict(self.anomalies),
            "steps": (self.steps, len(self.phases)),
            "outcome": self.outcome,
            "cancel": self.cancel,
        }


def protocol_view(state: BuildState) -> dict[str, Any]:
    """What :meth:`Protocol.view` says, read off a state (which forgets nothing)."""
    ids = sorted(state.phases)
    index = {phase_id: at for at, phase_id in enumerate(ids)}
    phases = [state.phases[phase_id] for phase_id in ids]
    cancel = state.cancel
    return {
        "phases": [
            (
                p.name,
                None if p.parent_id is None else index[p.parent_id],
                p.depth,
                p.num_steps,
                p.start_mono_ns,
                p.finish_mono_ns,
                p.steps_completed,
                p.last_step,
                p.skipped_steps,
                p.status.value,
                p.close_reason,
                [index[c] for c in p.children],
            )
            for p in phases
        ],
        "open": sorted(state.open_by_name),
        "anomalies": {kind.value: count for kind, count in state.anomalies.items()},
        "steps": (state.steps_completed_total, state.phases_started_total),
        "outcome": None if state.outcome is None else state.outcome.value,
        "cancel": None if cancel is None else (cancel.reason, cancel.timeout),
    }


@properties(200)
@given(calls=CALLS)
def test_the_state_says_what_the_protocol_says_at_every_moment(calls: list[Call]) -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock, backend="none")
    protocol = Protocol()
    for call in calls:
        play(monitor, clock, call)
        protocol.call(call, clock.mono_ns())
        assert protocol_view(monitor.state) == protocol.view(), call


# -- 2. spans: functions of the events -------------------------------------------------------------


class Spans:
    """The span export's subscriber, keeping the records: the spans each event completed,
    from the model the projection shares, and at the log's end those it left open."""

    name = "spans"

    def __init__(self, projection: SpanProjection) -> None:
        self.projection = projection
        self.records: list[SpanRecord] = []

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        self.records += self.projection.project(event, closed)

    def on_steps(self, last: StepCompleted) -> None:
        """Quiet steps complete no span."""

    def close(self) -> None:
        self.records += self.projection.finish()


LIVE_SPANS = ("model follows the log", "model is the log's fold", "projection follows the log")


class OwnProjection:
    """A follower that folds each event into the projection's own model (the export's
    follower without a shared model)."""

    name = "projection"

    def __init__(self, projection: SpanProjection) -> None:
        self.projection = projection
        self.records: list[SpanRecord] = []

    def handle(self, events: Sequence[Event]) -> None:
        for event in events:
            self.records += self.projection.apply(event)

    def close(self) -> None:
        self.records += self.projection.finish()


@properties(100)
@given(
    calls=CALLS,
    live_spans=st.sampled_from(LIVE_SPANS),
    span_budget=st.integers(1, 12),
    fold_under_ns=st.sampled_from([0, 5_000_000, 10**12]),
)
def test_spans_are_functions_of_the_events(
    calls: list[Call], live_spans: str, span_budget: int, fold_under_ns: int
) -> None:
    """The live run's spans are those of its journal replayed, field for field (ids, names,
    parents, times, attributes, events); every phase's span id is its own (derived from its
    ``phase_start``'s seq), and a span's parent is its phase's parent's span."""

    def projection(model: ReadModel | None = None) -> SpanProjection:
        return SpanProjection(span_budget=span_budget, fold_under_ns=fold_under_ns, model=model)

    clock = ManualClock()
    live: Spans | OwnProjection
    if live_spans == "projection follows the log":
        monitor = BuildMonitor(clock=clock, backend="none")
        live = OwnProjection(projection())
        monitor.log.follow(live, min_interval_s=0.0)
    else:
        model = ReadModel()
        live = Spans(projection(model))
        model.subscribe(live)
        if live_spans == "model follows the log":
            monitor = BuildMonitor(clock=clock, backend="none")
            monitor.log.follow(model, min_interval_s=0.0)
        else:
            monitor = BuildMonitor(clock=clock, backend="none", model=model)
    with journal_path() as path:
        events = journaled(calls, path, monitor, clock)
        if monitor.model is not None:
            monitor.model.close()  # the fold's close is its owner's
        journal = read_journal(path)
    replay_model = ReadModel()
    replayed = Spans(projection(replay_model))
    replay_model.subscribe(replayed)
    replay_model.handle(journal.events)
    replay_model.close()

    assert live.records == replayed.records
    spans = replayed.records
    if not events:
        assert spans == []
        return
    (build,) = [span for span in spans if span.server]
    phases = [span for span in spans if not span.server]
    ids = [span.span_id for span in spans]
    assert len(set(ids)) == len(ids), "every span its own id"
    state = BuildState()  # the whole tree, for the phases' parents
    for event in events:
        state.apply(event)
    build_id = build.attributes["trt.build.id"]
    by_id = {span.span_id: span for span in spans}
    emitted = {int(span.attributes["cicd.pipeline.task.run.id"]): span for span in phases}
    # Each phase started before the build's end is a span of its own or folded into its
    # parent's (those started after it, callbacks outside the build, have no trace to join).
    end = next((e.seq for e in events if isinstance(e, BuildFinished)), len(events))
    assert all(phase_id < end for phase_id in emitted)
    started = sum(1 for phase_id in state.phases if phase_id < end)
    assert len(emitted) + replayed.projection.folded == started
    for phase_id, span in emitted.items():
        phase = state.phases[phase_id]
        assert span.span_id == phase_span_id(build.trace_id, build_id, phase_id)
        assert span.trace_id == build.trace_id and span.name == phase.name
        parent = by_id[span.parent_span_id] if span.parent_span_id is not None else None
        if phase.parent_id is None:
            assert parent is build
        else:
            assert parent is emitted[phase.parent_id], "a phase with children is never folded"
        assert build.start_ns <= span.start_ns <= span.end_ns <= build.end_ns


# -- 3. the line reader: any cut of the bytes reads the same ---------------------------------------


def events_of(calls: Sequence[Call], clock: ManualClock) -> list[Event]:
    monitor = BuildMonitor(clock=clock, backend="none")
    for call in calls:
        play(monitor, clock, call)
    return monitor.log.recent()


FAULTS = st.sampled_from(
    [
        b"not json",
        b"",  # a blank line
        b'{"type": "step", "seq": "3"}',  # a field of the wrong type
        b'{"type": "telepathy", "seq": 1}',  # an unknown event type
        '{"type": "log", "message": "caf\u00e9'.encode()[:-1],  # a character cut in two
        b"\xff\xfe",
    ]
)


@st.composite
def journal_bodies(draw: st.DrawFn) -> tuple[bytes, list[Event]]:
    """A journal's body after its header: the lines of one or two builds (a retry appends
    its own, from seq 0), with corrupt, repeated and missing lines and a torn tail at times;
    and the events of the builds."""
    clock = ManualClock()
    events = [
        event
        for _ in range(draw(st.integers(1, 2)))
        for event in events_of(draw(SHORT_CALLS), clock)  # one clock: the next starts later
    ]
    lines = encode_events(events).splitlines(keepends=True)
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(lines)))
        fault = draw(st.sampled_from(["insert", "repeat", "drop"]))
        if fault == "insert":
            lines.insert(at, draw(FAULTS) + b"\n")
        elif lines and fault == "repeat":
            lines.insert(at, lines[at - 1])
        elif lines and at < len(lines):
            del lines[at]
    body = b"".join(lines)
    if body and draw(st.integers(0, 3)) == 0:
        body = body[: draw(st.integers(0, len(body) - 1))]  # torn: the writer was stopped
    return body, events


def continuation_bytes(data: bytes) -> list[int]:
    """The offsets inside a UTF-8 character (a cut there splits it)."""
    return [at for at, byte in enumerate(data) if 0x80 <= byte < 0xC0]


@st.composite
def cuts(draw: st.DrawFn, data: bytes) -> list[int]:
    """Where to cut ``data`` into chunks: anywhere, inside characters, at line ends."""
    inside = continuation_bytes(data)
    ends = [at + 1 for at, byte in enumerate(data) if byte == 0x0A]
    places = draw(st.lists(st.integers(0, len(data)), max_size=12))
    for among in (inside, ends):
        if among:
            places += draw(st.lists(st.sampled_from(among), max_size=6))
    return sorted(set(places))


def read_in_chunks(data: bytes, at: Sequence[int]) -> tuple[list[Event | JournalProblem], int]:
    reader = LineReader()
    out: list[Event | JournalProblem] = []
    for start, end in zip([0, *at], [*at, len(data)], strict=True):
        out += reader.feed(data[start:end])
    out += reader.finish()
    return out, reader.line_no


@properties(100)
@given(journal=journal_bodies(), data=st.data(), bound=st.sampled_from([None, 120, 300]))
def test_any_cut_of_a_journals_bytes_reads_the_same(
    journal: tuple[bytes, list[Event]], data: st.DataObject, bound: int | None
) -> None:
    """The events, the problems and their line numbers, for any chunks (``bound``: the
    longest line read, lowered so that lines over it are common)."""
    body, events = journal
    at = data.draw(cuts(body), label="cuts")
    with pytest.MonkeyPatch.context() as patch:
        if bound is not None:
            patch.setattr(journals, "MAX_LINE_BYTES", bound)
        whole = read_in_chunks(body, [])
        assert read_in_chunks(body, at) == whole
        if len(body) < 2000:
            assert read_in_chunks(body, range(1, len(body))) == whole, "a byte at a time"
    if bound is None and body == encode_events(events):
        assert whole[0] == events, "a whole journal reads as it was written"


# -- 4. the forgetting fold draws what the remembering one draws -----------------------------------


def drawn(model: ReadModel) -> list[tuple[Any, ...]]:
    """Every node of the tree a view draws, depth first, with all that it shows of it."""
    state = model.state
    nodes: list[tuple[Any, ...]] = [
        (state.status, state.progress_ratio(), state.steps_completed_total, dict(state.anomalies))
    ]
    stack: list[tuple[TreeNode, int]] = [(node, 0) for node in reversed(model.tree())]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, SiblingGroup):
            nodes.append((depth, node.name, node.count, node.total_ns, node.longest_ns))
            continue
        nodes.append(
            (depth, node.name, node.status, node.num_steps, node.steps_completed, node.last_step,
             node.skipped_steps, node.start_mono_ns, node.finish_mono_ns, node.close_reason,
             state.phase_progress(node.id))
        )  # fmt: skip
        stack.extend((child, depth + 1) for child in reversed(model.tree(node.id)))
    return nodes


def is_finished(phase: Phase, name: str) -> bool:
    return phase.name == name and phase.status is PhaseStatus.FINISHED


OTHER_KINDS = st.sampled_from(["wait", "log", "gpu", "process", "cancel", "output", "end"])


class ForgettingAndRemembering(RuleBasedStateMachine):
    """A build made callback by callback on a monitor whose fold is a forgetting read model (a
    build's supervisor), and a model that forgets nothing fed the same events: after every
    step both draw the same tree, and at the end the same ``/status``."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.forgetting = ReadModel()
        self.monitor = BuildMonitor(clock=self.clock, backend="none", model=self.forgetting)
        self.remembering = ReadModel(forget_closed=False)
        self.told = -1

    def play(self, calls: list[Call]) -> None:
        for call in calls:
            play(self.monitor, self.clock, call)
        new = self.monitor.log.recent(self.told)
        if new:
            self.remembering.handle(new)
            self.told = new[-1].seq

    @rule(data=st.data())
    def phase_start(self, data: st.DataObject) -> None:
        self.play(next_calls(data.draw, self.monitor.state, "start"))

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        self.play(next_calls(data.draw, self.monitor.state, "step"))

    @precondition(lambda self: bool(self.monitor.state.open_by_name))
    @rule(data=st.data())
    def phase_finish(self, data: st.DataObject) -> None:
        self.play(next_calls(data.draw, self.monitor.state, "finish"))

    @rule(data=st.data())
    def repeated_phases(self, data: st.DataObject) -> None:
        self.play(next_calls(data.draw, self.monitor.state, "repeat"))

    @rule(data=st.data(), kind=OTHER_KINDS)
    def something_else(self, data: st.DataObject, kind: str) -> None:
        self.play(next_calls(data.draw, self.monitor.state, kind))

    @invariant()
    def the_same_tree(self) -> None:
        assert drawn(self.forgetting) == drawn(self.remembering)

    @invariant()
    def only_what_a_view_shows_is_kept(self) -> None:
        """Of the finished phases of one name under one parent, the forgetting fold keeps the
        first (with its children while it is the only one, as the place of their summary
        without them once there are more), and beside the tree only the latest phase of
        each name (for the gauges)."""
        kept, whole = self.forgetting.state, self.remembering.state
        shown = list(kept.walk())
        assert set(kept.phases) == {p.id for p in shown} | set(kept.latest_by_name.values())
        places: set[int] = set()  # a parent is seen before its children, in the walk's order
        for parent in [None, *(p.id for p in shown)]:
            if parent in places:
                continue
            under = kept.roots if parent is None else kept.phases[parent].children
            everything = whole.roots if parent is None else whole.phases[parent].children
            for name in {whole.phases[i].name for i in everything}:
                finished = [i for i in everything if is_finished(whole.phases[i], name)]
                left = [i for i in under if is_finished(kept.phases[i], name)]
                assert left == finished[:1], (parent, name)
                if len(finished) > 1:
                    assert kept.phases[left[0]].children == [], "a place, without its children"
                    places.add(left[0])

    def teardown(self) -> None:
        now = self.clock.mono_ns()
        documents = [
            status_document(model, model.estimate_locked(now), now).phases
            for model in (self.forgetting, self.remembering)
        ]
        assert documents[0] == documents[1]


ForgettingAndRemembering.TestCase.settings = properties(60, stateful_step_count=30)
test_the_forgetting_fold_draws_the_remembering_ones_tree = ForgettingAndRemembering.TestCase


# -- 5. a checked and an unchecked journal of the same callbacks -----------------------------------


def parts(items: Sequence[Event], at: Sequence[int]) -> Iterator[Sequence[Event]]:
    for start, end in zip([0, *at], [*at, len(items)], strict=True):
        yield items[start:end]


@properties(100)
@given(
    builds=st.lists(CALLS, min_size=1, max_size=2),
    batch=st.integers(1, 40),
    data=st.data(),
)
def test_a_checked_and_an_unchecked_journal_of_the_same_callbacks_read_the_same(
    builds: list[list[Call]], batch: int, data: st.DataObject
) -> None:
    """Read whole (``batch``: the events read before they are checked), or fed as a follower
    sees the journal grow, in any batches; one build, or two in one log (``trt-otel run``'s,
    each build begun before its callbacks and folded by a monitor of its own)."""
    clock = ManualClock()
    log = EventLog(clock=clock)
    with journal_path() as path:
        log.follow(JournalWriter(path), min_interval_s=0.0)
        for calls in builds:
            monitor = BuildMonitor(log=log, backend="none")
            if len(builds) > 1:
                monitor.start()
            for call in calls:
                play(monitor, clock, call)
            log.remove_fold(monitor.state.apply)  # its build is over: the next has its own
        log.close()
        events = log.recent()
        recorded = unchecked(events)
        header = {"format": "trt-otel-journal", "version": 1, "producer": "C++", "checked": False}
        cpp = path.with_name("cpp.jsonl")
        cpp.write_bytes(json.dumps(header).encode() + b"\n" + encode_events(recorded))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(checked, "_READ_BATCH_EVENTS", batch)
            from_python, from_cpp = read_journal(path), read_journal(cpp)
    assert from_python.problems == [] and from_cpp.problems == []
    assert from_python.events == events
    assert from_cpp.events == events
    at = sorted(set(data.draw(st.lists(st.integers(0, len(recorded)), max_size=8), "cuts")))
    follower = CheckedEvents({"checked": False})
    assert [event for part in parts(recorded, at) for event in follower.feed(part)] == events
