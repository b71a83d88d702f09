"""A finished build, explained: the one model every format of ``trt-otel report`` draws.

:func:`reports_of` folds a journal's events (one build or several, one after another) into a
:class:`BuildReport` per build: the phases as rows of a timeline (one row per path of phase
names, so the repeated siblings the tree folds, such as TensorRT's thousand "Measuring tactic
time", share one row with their count), the silent windows, the cancel and the outcome, the
resource lines the journal's samples hold, the phases that took the time, and the build's record.
It is a pure fold of the events (no clock, no I/O), so a report of a journal is the same
wherever and whenever it is made, and the diff of two builds compares two of these.

Times are seconds from the build's start, on the clock of the process that recorded it (the
events' ``mono_ns``). Everything kept is bounded: a journal is outside input, and a crafted one
must not make a report of unbounded size.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from trt_otel.core.builds import builds_of
from trt_otel.core.durations import format_duration
from trt_otel.core.events import (
    Anomaly,
    BuildOutput,
    BuildStarted,
    Event,
    GpuSample,
    LogMessage,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from trt_otel.core.forecast import Forecast
from trt_otel.core.gaps import MIN_GAP_NS, Gap, deepest_open
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import Phase
from trt_otel.views.report.rows import (
    MAX_SAMPLES,
    PathKey,
    ProcessSamples,
    Row,
    RowFold,
    Span,
    clip,
)

__all__ = [
    "BuildRecorder",
    "BuildReport",
    "CancelMark",
    "PathKey",
    "Row",
    "Series",
    "Silence",
    "Span",
    "anomaly_total",
    "clip",
    "counted",
    "outcome_text",
    "record_items",
    "reports_of",
    "seconds_text",
]

MAX_POINTS = 2000
"""Points of one resource line (evenly thinned beyond)."""
MAX_ANOMALY_DETAILS = 20
MAX_ATTRIBUTES = 200
TOP_PHASES = 12


@dataclass(frozen=True, slots=True)
class Silence:
    """A window with no callback from TensorRT, at least :func:`silence_threshold_s` long."""

    start_s: float
    length_s: float
    phase: str | None
    """The innermost phase open through it."""

    @property
    def where(self) -> str:
        """``in Determining refit engines``; before the first phase, the builder's own set-up
        (parsing the model, making the network), which calls nothing back either."""
        if self.phase is not None:
            return f"in {self.phase}"
        return "before the first phase" if self.start_s <= 0 else "outside any phase"


@dataclass(frozen=True, slots=True)
class CancelMark:
    at_s: float
    source: str
    reason: str
    policy: str
    stopped_after_s: float | None = None
    """From the cancel to the build's end (``trt_build_cancel_latency_seconds``); None while the
    build has not ended."""


@dataclass(frozen=True, slots=True)
class Series:
    """One resource line: ``(seconds, value)`` points, in ``unit``."""

    name: str
    unit: str
    points: tuple[tuple[float, float], ...]

    @property
    def peak(self) -> float:
        return max((value for _, value in self.points), default=0.0)


@dataclass(slots=True)
class BuildReport:
    """One build of a journal, explained."""

    index: int
    build_id: str
    attributes: dict[str, str]
    start_wall_ns: int
    duration_s: float
    outcome: Outcome | None
    """None: the record stops before the build's end."""
    detail: str
    rows: list[Row]
    rows_left_out: int
    silences: list[Silence]
    cancel: CancelMark | None
    series: list[Series]
    steps: int
    phases: int
    anomalies: dict[str, int]
    anomaly_details: list[str]
    builder_error: str | None
    threads: list[str]
    """The threads that started phases, in order of first appearance."""
    forecast: Forecast | None = None
    """What the build was expected to take as it started (``--history``), where it was."""

    @property
    def silent_s(self) -> float:
        return sum(silence.length_s for silence in self.silences)

    def top_rows(self, count: int = TOP_PHASES) -> list[Row]:
        """The rows that took the time: largest self time first."""
        return sorted(self.rows, key=lambda row: (-row.self_s, row.index))[:count]

    def row_by_path(self) -> dict[PathKey, Row]:
        return {row.path: row for row in self.rows}


def silence_threshold_s(duration_s: float) -> float:
    """How long a gap between callbacks must be to count as a silent window: a tenth of the
    build, at least 1 s and at most 10 s (what the terminal calls silent), so a short build's
    longest pause shows and a long build's are not drowned in small ones."""
    return min(10.0, max(1.0, duration_s / 10))


def reports_of(events: Iterable[Event]) -> list[BuildReport]:
    """Every build of a journal's events, in order."""
    return [report_of(build, index) for index, build in enumerate(builds_of(events))]


def report_of(events: Sequence[Event], index: int = 0) -> BuildReport:
    """One build's events (``build_start`` first, where there is one) explained."""
    model = ReadModel()
    recorder = BuildRecorder(model, index)
    model.subscribe(recorder)
    model.handle(events)
    return recorder.report()


class BuildRecorder:
    """The report's view of a build, drawn from a read model's fold (a journal read back, or
    the live build's own read model, for the HTTP view's timeline): a subscriber of
    ``model`` that keeps, of what the model lets go, only what the report shows (the timeline's
    rows, the resource samples, the build's record); :meth:`report` at any moment.

    Told of the events on the model's thread, under :attr:`lock`; a reader on another thread
    holds :attr:`lock`, then the model's :attr:`~trt_otel.core.readmodel.ReadModel.lock`, while
    it reports. A log of several builds: the latest is reported.
    """

    name = "report"

    def __init__(self, model: ReadModel, index: int = 0) -> None:
        self.model = model
        self.index = index
        self.lock = threading.Lock()
        self._begin(model.build_number)

    def _begin(self, build_number: int) -> None:
        self._build_number = build_number
        self._rows = RowFold()
        self._process = ProcessSamples()
        self._gpu: list[GpuSample] = []
        self._anomaly_details: list[str] = []
        self._builder_error: str | None = None
        self._output: dict[str, Any] = {}

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        kind = type(event)
        with self.lock:
            # A log's builds change at a build's start only (see BuildCut): the number is
            # read there, not at each of a build's million events.
            if kind is BuildStarted and self.model.build_number != self._build_number:
                self._begin(self.model.build_number)
            if closed:  # before a start: a phase of the same name closes first
                rows, gaps, samples = self._rows, self.model.gaps, self._process
                for phase in closed:
                    rows.closed(phase, gaps, samples)
            if kind is PhaseStarted:
                started = self.model.state.phases.get(event.seq)
                if started is not None:
                    self._rows.started(started, event.thread)
            elif kind is not PhaseFinished:  # (a phase's finish: its phase closed above)
                self._noted(event, kind)

    def _noted(self, event: Event, kind: type[Event]) -> None:
        """An event other than a phase's start or finish (a few in a build), under the lock."""
        if kind is ProcessSample:
            self._process.keep(cast(ProcessSample, event))
        elif kind is GpuSample:
            _keep(self._gpu, event)
        elif isinstance(event, BuildOutput):
            self._output.update(event.attributes)
        elif isinstance(event, Anomaly) and len(self._anomaly_details) < MAX_ANOMALY_DETAILS:
            self._anomaly_details.append(clip(f"{event.kind.value}: {event.detail}"))
        elif isinstance(event, LogMessage) and event.severity.upper() in (
            "ERROR",
            "INTERNAL_ERROR",
        ):
            self._builder_error = clip(event.message)

    def on_steps(self, last: StepCompleted) -> None:
        """Steps change only counts, which the report reads off the model."""

    def close(self) -> None:
        """Nothing to release."""

    def report(self, now_mono_ns: int | None = None) -> BuildReport:
        """The build so far; ``now_mono_ns``: a build still running is drawn up to then (on
        the build's own clock), its open phases and its current silence with it."""
        state, gaps = self.model.state, self.model.gaps
        first = gaps.first_ns or 0
        origin = state.start_mono_ns if state.start_mono_ns is not None else first
        end_ns = state.end_mono_ns
        if end_ns is None:
            end_ns = max(state.last_event_mono_ns or origin, now_mono_ns or 0)
        duration_s = max(0.0, (end_ns - origin) / 1e9)
        kept = gaps.kept
        last = state.last_progress_mono_ns
        if state.end_mono_ns is None and last is not None and end_ns - last >= MIN_GAP_NS:
            kept.append(Gap(last, end_ns, deepest_open(state)))  # silent now
        threshold_ns = silence_threshold_s(duration_s) * 1e9
        silent = [gap for gap in kept if gap.length_ns >= threshold_ns]
        rows, left_out = self._rows.rows(origin, end_ns, silent, self._process)
        cancel = state.cancel
        return BuildReport(
            index=self.index,
            build_id=state.build_id or "",
            attributes=_record({**state.attributes, **self._output}),
            forecast=Forecast.of(state.attributes),
            start_wall_ns=state.start_wall_ns if state.start_wall_ns is not None else 0,
            duration_s=duration_s,
            outcome=state.outcome,
            detail=clip(state.outcome_detail),
            rows=rows,
            rows_left_out=left_out,
            silences=[
                Silence(
                    start_s=(gap.start_ns - origin) / 1e9,
                    length_s=gap.length_ns / 1e9,
                    phase=None if gap.phase is None else clip(gap.phase),
                )
                for gap in silent
            ],
            cancel=None
            if cancel is None
            else CancelMark(
                at_s=(cancel.mono_ns - origin) / 1e9,
                source=clip(cancel.source, 100),
                reason=clip(cancel.reason),
                policy=clip(cancel.policy),
                stopped_after_s=None
                if state.end_mono_ns is None
                else max(0, state.end_mono_ns - cancel.mono_ns) / 1e9,
            ),
            series=_series(self._process.samples, self._gpu, origin, end_ns),
            steps=state.steps_completed_total,
            phases=state.phases_started_total,
            anomalies={kind.value: count for kind, count in sorted(state.anomalies.items())},
            anomaly_details=list(self._anomaly_details),
            builder_error=self._builder_error,
            threads=self._rows.threads,
        )


def _keep(samples: list[Any], sample: Event) -> None:
    """Append, halving the list (every other sample) when it is full: bounded, still even."""
    samples.append(sample)
    if len(samples) > MAX_SAMPLES:
        del samples[1::2]


def _record(attributes: dict[str, Any]) -> dict[str, str]:
    """The build's record as text, bounded: ``build_start``'s attributes and ``output``'s."""
    items = list(attributes.items())[:MAX_ATTRIBUTES]
    return {clip(str(key), 200): clip(_text(value)) for key, value in items}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _series(
    process: list[ProcessSample], gpu: list[GpuSample], origin: int, end_ns: int
) -> list[Series]:
    """The resource lines over the build's time (a sampler's last sample may come after the
    end: it is not the build's)."""
    process = [s for s in process if s.mono_ns <= end_ns]
    gpu = [s for s in gpu if s.mono_ns <= end_ns]
    lines = [
        _line("builder CPU", "%", ((s.mono_ns, s.cpu_percent) for s in process), origin),
        _line("builder memory", "bytes", ((s.mono_ns, s.rss_bytes) for s in process), origin),
    ]
    for index in sorted({s.index for s in gpu}):
        mine = [s for s in gpu if s.index == index]
        utilization = ((s.mono_ns, _percent(s.utilization)) for s in mine)
        lines.append(_line(f"GPU {index} utilization", "%", utilization, origin))
        memory = ((s.mono_ns, s.memory_used_bytes) for s in mine)
        lines.append(_line(f"GPU {index} memory", "bytes", memory, origin))
    return [line for line in lines if line.points]


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else ratio * 100


def _line(
    name: str, unit: str, samples: Iterable[tuple[int, float | int | None]], origin: int
) -> Series:
    points = [((t - origin) / 1e9, float(v)) for t, v in samples if v is not None]
    if len(points) > MAX_POINTS:
        stride = len(points) / MAX_POINTS
        points = [points[int(i * stride)] for i in range(MAX_POINTS)]
    return Series(name, unit, tuple(points))


def seconds_text(seconds: float) -> str:
    """A duration for a report: ``12 ms`` under a second (a phase's self time often is),
    ``0.4s``-style above (:func:`~trt_otel.core.durations.format_duration`)."""
    if abs(seconds) < 0.95:
        return f"{seconds * 1000:.0f} ms"
    return format_duration(seconds)


def anomaly_total(report: BuildReport) -> int:
    return sum(report.anomalies.values())


def counted(number: int, noun: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def forecast_text(report: BuildReport) -> str | None:
    """``took 1m20s against 1m12s expected (+11%)`` for a build that succeeded with a forecast;
    the forecast itself for one still running; None otherwise."""
    forecast = report.forecast
    if forecast is None:
        return None
    if report.outcome is Outcome.SUCCESS:
        return forecast.judged(report.duration_s)
    return forecast.describe() if report.outcome is None else None


def outcome_text(report: BuildReport) -> str:
    return "never ended" if report.outcome is None else report.outcome.value


def record_items(report: BuildReport) -> list[tuple[str, str]]:
    """The build's record, in a stable order: what decides the engine first."""
    first = (
        "trt.backend",
        "trt.version",
        "model.path",
        "model.sha256",
        "fingerprint",
        "engine.sha256",
    )
    attributes = report.attributes
    keys = [k for k in first if k in attributes]
    keys += sorted(k for k in attributes if k not in first)
    return [(key, attributes[key]) for key in keys]
