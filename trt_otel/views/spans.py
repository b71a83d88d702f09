"""The span projection: a pure fold of the event log into finished span records.

Each TensorRT phase instance becomes one span, child of its parent phase's span (a root phase is a
child of the build's span), with its start and end taken from the events. A span is complete only
when its phase closes, so records are produced at ``phase_finish`` (or when the build's end or a
protocol break closes a phase) and the build's record at ``build_end``.

Everything here is a function of the events alone, identifiers included: trace and span ids are
derived from the build id and each phase's ``seq``, so a journal replayed later yields exactly the
spans the live run exported (and exporting both is harmless: they carry the same ids).

Span budget: a small MNIST build starts over a thousand "Measuring tactic time" phases; a large
model a hundred times more. Once ``span_budget`` spans have been emitted, a *leaf* phase (one that
started no children) shorter than ``fold_under_ns`` is not emitted on its own but folded into its
parent's span, which then carries how many were folded, their total and their longest duration.
Phases with children and long phases are always emitted, so the trace stays a tree and nothing
slow is hidden; the budget is therefore a soft one.

The spans follow OpenTelemetry's CI/CD conventions (:mod:`trt_otel.views.conventions`): the
build's span is a pipeline run (``BUILD model.onnx``, kind SERVER, ``cicd.pipeline.*``), each
phase's a task run (named as the phase, kind INTERNAL, ``cicd.pipeline.task.*``), beside the
``trt.*`` attributes.

Phases cut short are marked: ``trt.phase.cancelled`` on those open when the monitor refused a step
(TensorRT then finishes them itself, innermost first), and ``trt.phase.status=aborted`` with
``trt.phase.close_reason`` on those that never got a ``phase_finish`` (the build ended, failed, or
its process died while they were open). Where the GPU is sampled, each span also carries the
peak memory used and the mean utilization of the samples taken while it was open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from trt_otel.core.attempts import attempt_of
from trt_otel.core.events import (
    Anomaly,
    BuildFinished,
    BuildStarted,
    Event,
    GpuSample,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
    severity_rank,
)
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import STATUS_TEXT, BuildState, Phase, PhaseStatus
from trt_otel.views.conventions import (
    ERROR,
    is_failed,
    pipeline_name,
    pipeline_result,
    pipeline_run_attributes,
    pipeline_span_name,
    task_run_attributes,
    task_run_result,
)
from trt_otel.views.otlp_settings import (
    DEFAULT_FOLD_UNDER_NS,
    DEFAULT_SPAN_BUDGET,
)
from trt_otel.views.trace_ids import (
    TRACEPARENT_ATTRIBUTE,
    PhaseSpanIds,
    RemoteParent,
    build_span_context,
    build_span_id,
    build_trace_id,
)

WARNING_RANK = severity_rank("warning")
MAX_SPAN_EVENTS = 32
"""Anomalies or log messages attached to one span as span events; the rest are only counted."""

UNFINISHED = "unfinished"
"""``error.type`` of a build whose log ends without a ``build_end`` (the process died)."""

_LOG_ENDED = "the log ended before the build did"
"""``trt.phase.close_reason`` of the phases a log left open (the builder's process died)."""

# Build attributes that steer the projection but are not worth a span attribute.
_HIDDEN_BUILD_ATTRIBUTES = frozenset({TRACEPARENT_ATTRIBUTE})


class SpanEvent(msgspec.Struct, frozen=True):
    name: str
    time_ns: int
    attributes: dict[str, Any]


class SpanRecord(msgspec.Struct, frozen=True):
    """One finished span, independent of any OpenTelemetry SDK.

    A msgspec struct, made in C (as :class:`SpanEvent`): a frozen dataclass sets each of its
    fields through ``object.__setattr__``, and making the records was a quarter of the span
    export's instructions (BENCHMARKS.md, "Span records made in C")."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    parent_is_remote: bool
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...] = ()
    sampled: bool = True
    """False when the job that started the build chose not to sample its trace."""
    error: str | None = None
    """The status description when the span's status is Error; None leaves it unset."""
    links: tuple[tuple[int, int], ...] = ()
    """(trace id, span id) of spans this one follows from: a retried build's previous attempt."""
    server: bool = False
    """The span's kind is SERVER (the build: a pipeline run, as the CI/CD conventions say)
    rather than INTERNAL (a phase: a task run)."""


@dataclass(slots=True)
class _Fold:
    """Leaf phases folded into one span."""

    count: int = 0
    total_ns: int = 0
    longest_ns: int = 0
    names: set[str] = field(default_factory=set)

    def add(self, name: str, duration_ns: int) -> None:
        self.count += 1
        self.total_ns += duration_ns
        self.longest_ns = max(self.longest_ns, duration_ns)
        self.names.add(name)

    def attributes(self) -> dict[str, Any]:
        return {
            "trt.folded.count": self.count,
            "trt.folded.duration_total_s": self.total_ns / 1e9,
            "trt.folded.duration_max_s": self.longest_ns / 1e9,
            "trt.folded.names": sorted(self.names),
        }


@dataclass(slots=True)
class _GpuStats:
    """GPU samples taken while a span was open."""

    samples: int = 0
    peak_memory_bytes: int | None = None
    peak_process_memory_bytes: int | None = None
    utilization_sum: float = 0.0
    utilization_samples: int = 0

    def add(self, sample: GpuSample) -> None:
        self.samples += 1
        if sample.memory_used_bytes is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, sample.memory_used_bytes)
        held = sample.process_memory_used_bytes
        if held is not None:
            self.peak_process_memory_bytes = max(self.peak_process_memory_bytes or 0, held)
        if sample.utilization is not None:
            self.utilization_sum += sample.utilization
            self.utilization_samples += 1

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {"gpu.samples": self.samples}
        if self.peak_memory_bytes is not None:
            attributes["gpu.memory.peak_bytes"] = self.peak_memory_bytes
        if self.peak_process_memory_bytes is not None:
            attributes["gpu.process_memory.peak_bytes"] = self.peak_process_memory_bytes
        if self.utilization_samples:
            attributes["gpu.utilization.mean"] = self.utilization_sum / self.utilization_samples
        return attributes


@dataclass(slots=True)
class _ProcessStats:
    """The builder's process while a span was open: the CPU time it used (from the sample before
    the span's first) and its peak resident memory."""

    first_cpu_seconds: float | None = None
    last_cpu_seconds: float | None = None
    peak_rss_bytes: int | None = None

    def add(self, sample: ProcessSample) -> None:
        if sample.cpu_seconds is not None:
            if self.first_cpu_seconds is None:
                self.first_cpu_seconds = sample.cpu_seconds
            self.last_cpu_seconds = sample.cpu_seconds
        if sample.rss_bytes is not None:
            self.peak_rss_bytes = max(self.peak_rss_bytes or 0, sample.rss_bytes)

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        if self.first_cpu_seconds is not None and self.last_cpu_seconds is not None:
            used = self.last_cpu_seconds - self.first_cpu_seconds
            attributes["trt.process.cpu_seconds"] = round(used, 3)
        if self.peak_rss_bytes is not None:
            attributes["trt.process.peak_resident_bytes"] = self.peak_rss_bytes
        return attributes


@dataclass(slots=True)
class _Notes:
    """What happened during a span besides its steps: anomalies and log messages."""

    events: list[SpanEvent] = field(default_factory=list)
    anomalies: int = 0
    dropped_events: int = 0

    def add(self, event: SpanEvent) -> None:
        if len(self.events) < MAX_SPAN_EVENTS:
            self.events.append(event)
        else:
            self.dropped_events += 1


class SpanProjection:
    """Spans from the read model: each event, once the model has folded it, may complete some.

    Alone, :meth:`apply` folds each event into a model of the projection's own (a replayed
    journal, a test). In a session it subscribes, through the span export, to the build's
    shared :class:`~trt_otel.core.readmodel.ReadModel` and is handed each event with the phases it
    closed (:meth:`project`); it never changes the model.
    """

    def __init__(
        self,
        *,
        span_budget: int = DEFAULT_SPAN_BUDGET,
        fold_under_ns: int = DEFAULT_FOLD_UNDER_NS,
        model: ReadModel | None = None,
        keep_logged_from: str | None = None,
        log_events: bool = True,
    ) -> None:
        """``keep_logged_from``: a phase in which the builder logged a message this severe (or
        more) is never folded, so the log record exported for it points at a span that exists
        (None: no message keeps a phase). ``log_events``: TensorRT's errors and warnings are
        also span events of the build's span (for an export without log records: OpenTelemetry
        is moving events from spans to logs)."""
        if span_budget < 1:
            raise ValueError("the span budget must allow at least the build's own span")
        self.span_budget = span_budget
        self.fold_under_ns = fold_under_ns
        self._keep_rank = -1 if keep_logged_from is None else severity_rank(keep_logged_from)
        self._kept: set[int] = set()
        self._log_events = log_events
        self.model = model if model is not None else ReadModel()
        self.emitted = 0
        self.folded = 0
        self._trace_id = 0
        self._remote: RemoteParent | None = None
        self._sampled = True
        self._build_span_id = 0
        self._parent_span_ids: dict[int, int] = {}
        self._build_key = ""
        self._phase_span_ids = PhaseSpanIds(0, "")
        self._wall_base_ns: int | None = None
        self._mono_base_ns = 0
        # What a span gathers while its phase is open (None: the build's span), dropped when
        # the span is made: the model keeps what is left of a closed phase.
        self._folds: dict[int | None, _Fold] = {}
        self._notes: dict[int | None, _Notes] = {}
        self._gpu: dict[int | None, _GpuStats] = {}
        self._process: dict[int | None, _ProcessStats] = {}
        self._last_cpu_seconds: float | None = None
        self._build_done = False
        self._refused: frozenset[int] = frozenset()

    @property
    def state(self) -> BuildState:
        return self.model.state

    @property
    def started(self) -> bool:
        """True once the projection has seen its build's first event."""
        return self._wall_base_ns is not None

    @property
    def finished(self) -> bool:
        """True once the build's own span was produced."""
        return self._build_done

    # -- the fold ------------------------------------------------------------------------------

    def apply(self, event: Event) -> list[SpanRecord]:
        """Fold one event into the projection's own model; the spans it completed, innermost
        first. (With a shared model, the model folds and calls :meth:`project`.)"""
        return self.project(event, self.model.apply(event))

    def project(self, event: Event, closed: Sequence[Phase]) -> list[SpanRecord]:
        """The spans ``event`` completed, the model having folded it; ``closed`` are the
        phases it closed, innermost first."""
        if self._build_done:
            return []
        state = self.model.state
        if self._wall_base_ns is None:
            self._begin(event)
        kind = type(event)  # events are final classes: a type is cheaper to test than a class
        if kind is PhaseFinished:  # most events told: its phase (and any left open) closed
            return self._closed_spans(closed)
        if kind is StepCompleted:  # most events: a span changes only after a cancel
            if state.cancel is not None and not self._refused:
                # The first step after a cancel is the one the monitor answered False:
                # TensorRT unwinds the phases open now, so their ends are the cancel's doing.
                self._refused = frozenset(state.open_by_name.values())
            if not closed:
                return []
        elif kind is PhaseStarted:
            if not closed:  # the usual start: it completes no span
                return []
        elif kind is GpuSample:
            # Each open phase, and the build, saw this sample: O(open phases), once a second.
            for owner in (None, *state.open_by_name.values()):
                self._gpu.setdefault(owner, _GpuStats()).add(event)  # type: ignore[arg-type]
        elif kind is ProcessSample:
            for owner in (None, *state.open_by_name.values()):
                stats = self._process.get(owner)
                if stats is None:  # a span's CPU counts from the sample before its first
                    stats = self._process[owner] = _ProcessStats(self._last_cpu_seconds)
                stats.add(event)  # type: ignore[arg-type]
            self._last_cpu_seconds = event.cpu_seconds  # type: ignore[attr-defined]
        elif kind is Anomaly or kind is LogMessage:
            self._note(event)  # type: ignore[arg-type]
        spans = self._closed_spans(closed)
        if kind is BuildFinished:
            spans.append(self._build_span(self._span_time(event.mono_ns)))
        return spans

    def _closed_spans(self, closed: Sequence[Phase]) -> list[SpanRecord]:
        spans: list[SpanRecord] = []
        for phase in closed:
            assert phase.finish_mono_ns is not None
            span = self._phase_span(phase, phase.finish_mono_ns, phase.status, phase.close_reason)
            if span is not None:
                spans.append(span)
        return spans

    def finish(self) -> list[SpanRecord]:
        """End what the log left open (a build whose process died before its end): every open
        phase and the build's span end at the last event, marked unfinished. The model is left
        as the log left it."""
        if self._build_done or self._wall_base_ns is None:
            return []
        state = self.model.state
        last_mono = state.last_event_mono_ns or self._mono_base_ns
        spans: list[SpanRecord] = []
        for phase_id in reversed(state.open_phase_ids()):
            span = self._phase_span(
                state.phases[phase_id],
                last_mono,
                PhaseStatus.ABORTED,
                _LOG_ENDED,
            )
            if span is not None:
                spans.append(span)
        spans.append(self._build_span(self._span_time(last_mono), unfinished=True))
        return spans

    # -- internals -----------------------------------------------------------------------------

    def _begin(self, event: Event) -> None:
        # Span times come from the monotonic clock, anchored once to the wall clock, so a
        # wall-clock step during a build cannot make a child outlive its parent.
        self._wall_base_ns = event.wall_ns
        self._mono_base_ns = event.mono_ns
        build_id = event.build_id if isinstance(event, BuildStarted) else f"seq0-{event.wall_ns}"
        attributes = event.attributes if isinstance(event, BuildStarted) else {}
        self._trace_id, remote = build_trace_id(attributes, build_id)
        self._remote = remote
        self._sampled = remote.sampled if remote is not None else True
        self._build_span_id = build_span_id(self._trace_id, build_id)
        self._build_key = build_id
        self._phase_span_ids = PhaseSpanIds(self._trace_id, build_id)

    def _span_time(self, mono_ns: int) -> int:
        assert self._wall_base_ns is not None
        return self._wall_base_ns + (mono_ns - self._mono_base_ns)

    def _parent_span_id(self, phase_id: int) -> int:
        """A parent's span id, derived once for all its children (until its own span)."""
        span_id = self._parent_span_ids.get(phase_id)
        if span_id is None:
            span_id = self._parent_span_ids[phase_id] = self._span_id(phase_id)
        return span_id

    def _span_id(self, phase_id: int) -> int:
        return self._phase_span_ids(phase_id)

    def _note(self, event: Anomaly | LogMessage) -> None:
        time_ns = self._span_time(event.mono_ns)
        if isinstance(event, Anomaly):
            owner = self.state.open_by_name.get(event.phase) if event.phase else None
            notes = self._notes.setdefault(owner, _Notes())
            notes.anomalies += 1
            attributes = {"trt.anomaly.kind": event.kind.value, "trt.anomaly.detail": event.detail}
            notes.add(SpanEvent("trt.anomaly", time_ns, attributes))
            return
        rank = severity_rank(event.severity)
        if rank <= self._keep_rank:
            owner = self.state.open_by_name.get(self.state.innermost_open() or "")
            if owner is not None:
                self._kept.add(owner)
        if self._log_events and rank <= WARNING_RANK:
            # Without log records, TensorRT's errors and warnings go on the build span.
            attributes = {"log.severity": event.severity, "log.message": event.message}
            self._notes.setdefault(None, _Notes()).add(SpanEvent("trt.log", time_ns, attributes))

    def _phase_span(
        self, phase: Phase, end_mono_ns: int, status: PhaseStatus, close_reason: str | None
    ) -> SpanRecord | None:
        # Past the budget, this is most phases of a long build: the folded path stays short.
        phase_id = phase.id
        duration = end_mono_ns - phase.start_mono_ns
        fold = self._folds.pop(phase_id, None)
        notes = self._notes.pop(phase_id, None)
        gpu = self._gpu.pop(phase_id, None)
        process = self._process.pop(phase_id, None)
        logged = phase_id in self._kept  # a log record names its span: it is never folded
        if logged:
            self._kept.discard(phase_id)
        elif (
            self.emitted >= self.span_budget - 1
            and duration < self.fold_under_ns
            and notes is None
            and not phase.children  # a leaf
        ):
            into = self._folds.get(phase.parent_id)
            if into is None:
                into = self._folds[phase.parent_id] = _Fold()
            into.add(phase.name, duration)
            self.folded += 1
            return None
        attributes: dict[str, Any] = {
            "trt.phase.num_steps": phase.num_steps,
            "trt.phase.steps_completed": phase.steps_completed,
            "trt.phase.depth": phase.depth,
            "trt.phase.status": STATUS_TEXT[status],
        }
        if phase.skipped_steps:
            attributes["trt.phase.skipped_steps"] = phase.skipped_steps
        if close_reason is not None:
            attributes["trt.phase.close_reason"] = close_reason
        refused = phase.id in self._refused
        if refused:
            attributes["trt.phase.cancelled"] = True
        error = self._task_run(phase, status, close_reason, refused, attributes)
        events: tuple[SpanEvent, ...] = ()
        if notes is not None:
            attributes["trt.phase.anomalies"] = notes.anomalies
            events = tuple(notes.events)
            if notes.dropped_events:
                attributes["trt.span_events_dropped"] = notes.dropped_events
        for stats in (fold, gpu, process):  # leaves folded under it; samples while it ran
            if stats is not None:
                attributes.update(stats.attributes())
        parent = phase.parent_id
        self.emitted += 1
        return SpanRecord(
            name=phase.name,
            trace_id=self._trace_id,
            span_id=self._parent_span_ids.pop(phase.id, 0) or self._span_id(phase.id),
            parent_span_id=self._build_span_id if parent is None else self._parent_span_id(parent),
            parent_is_remote=False,
            start_ns=self._span_time(phase.start_mono_ns),
            end_ns=self._span_time(end_mono_ns),
            attributes=attributes,
            events=events,
            sampled=self._sampled,
            error=error,
        )

    def _task_run(
        self,
        phase: Phase,
        status: PhaseStatus,
        close_reason: str | None,
        refused: bool,
        attributes: dict[str, Any],
    ) -> str | None:
        """Add the phase's task-run attributes; the span's error, if its result is a failed
        one."""
        state = self.model.state
        log_ended = close_reason == _LOG_ENDED
        result = task_run_result(
            finished=status is PhaseStatus.FINISHED,
            refused=refused,
            cancel_timeout=state.cancel is not None and state.cancel.timeout,
            build_outcome=None if log_ended else state.outcome,
        )
        error_type = UNFINISHED if log_ended else state.error_type
        attributes.update(task_run_attributes(phase.name, phase.id, result, error_type))
        return (close_reason or result) if is_failed(result) else None

    def _pipeline_run(self, unfinished: bool, attributes: dict[str, Any]) -> str | None:
        """Add the build's pipeline-run attributes; the span's error, if it failed."""
        state = self.model.state
        name = pipeline_name(state.attributes)
        if unfinished:
            attributes.update(pipeline_run_attributes(self._build_key, name, ERROR, UNFINISHED))
            return "the build's log ends before the build did (its process stopped)"
        outcome = state.outcome
        assert outcome is not None
        result = pipeline_result(outcome)
        attributes.update(pipeline_run_attributes(self._build_key, name, result, state.error_type))
        if state.outcome_detail:
            attributes["trt.build.outcome_detail"] = state.outcome_detail
        return (state.outcome_detail or outcome.value) if is_failed(result) else None

    def _build_span(self, end_ns: int, *, unfinished: bool = False) -> SpanRecord:
        state = self.model.state
        self._build_done = True
        self.emitted += 1
        attributes: dict[str, Any] = {
            key: _attribute_value(value)
            for key, value in state.attributes.items()
            if key not in _HIDDEN_BUILD_ATTRIBUTES
        }
        attributes["trt.build.id"] = self._build_key
        attributes["trt.build.steps_completed"] = state.steps_completed_total
        attributes["trt.build.phases_started"] = state.phases_started_total
        attributes["trt.spans.emitted"] = self.emitted
        attributes["trt.spans.folded"] = self.folded
        if state.anomalies:
            attributes["trt.anomalies"] = sum(state.anomalies.values())
        if state.cancel is not None:
            attributes["trt.cancel.reason"] = state.cancel.reason
            attributes["trt.cancel.source"] = state.cancel.source
        error = self._pipeline_run(unfinished, attributes)
        fold = self._folds.pop(None, None)
        if fold is not None:
            attributes.update(fold.attributes())
        gpu = self._gpu.pop(None, None)
        if gpu is not None:
            attributes.update(gpu.attributes())
        process = self._process.pop(None, None)
        if process is not None:
            attributes.update(process.attributes())
        notes = self._notes.pop(None, None)
        events = tuple(notes.events) if notes is not None else ()
        start_mono = state.start_mono_ns if state.start_mono_ns is not None else self._mono_base_ns
        remote = self._remote
        return SpanRecord(
            links=_retry_links(state.attributes, remote),
            name=pipeline_span_name(pipeline_name(state.attributes)),
            trace_id=self._trace_id,
            span_id=self._build_span_id,
            parent_span_id=remote.span_id if remote is not None else None,
            parent_is_remote=remote is not None,
            start_ns=self._span_time(start_mono),
            end_ns=end_ns,
            attributes=attributes,
            events=events,
            sampled=self._sampled,
            error=error,
            server=True,
        )


def _retry_links(
    attributes: dict[str, Any], remote: RemoteParent | None
) -> tuple[tuple[int, int], ...]:
    """A retried build's link to its previous attempt's span (OpenTelemetry's convention for
    a retry: a span link, with the attempt's number among the attributes)."""
    attempt = attempt_of(attributes)
    if attempt is None or attempt.previous_build_id is None:
        return ()
    return (build_span_context(attempt.previous_build_id, remote),)


def _attribute_value(value: Any) -> Any:
    """OpenTelemetry attributes are scalars or lists of one scalar type; anything else becomes
    its text."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return str(value)
