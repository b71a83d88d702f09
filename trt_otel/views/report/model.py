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

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trt_otel.core.builds import builds_of
from trt_otel.core.durations import format_duration
from trt_otel.core.events import (
    Anomaly,
    BuildFinished,
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
from trt_otel.core.state import BuildState, Phase, PhaseStatus

MAX_ROWS = 300
"""Timeline rows (distinct phase paths) kept per build; the rest are counted, not drawn."""
MAX_SPANS_PER_ROW = 2000
"""Instances of one row kept for drawing (the row's totals count them all)."""
MAX_POINTS = 2000
"""Points of one resource line (evenly thinned beyond)."""
MAX_ANOMALY_DETAILS = 20
MAX_SILENCES = 200
MAX_ATTRIBUTES = 200
MAX_TEXT = 500
"""The longest name, value or message kept (a journal could hold megabytes in one)."""
TOP_PHASES = 12

PathKey = tuple[str, ...]


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class Span:
    """One phase instance on the timeline."""

    start_s: float
    end_s: float
    status: str
    """``finished``, ``aborted`` (closed without ``phase_finish``) or ``open`` (never closed)."""
    steps: int
    num_steps: int
    thread: str


@dataclass(slots=True)
class Row:
    """Every instance of one path of phase names (``Building engine > Optimizing graph``)."""

    index: int
    path: PathKey
    parent: int | None
    """The row of the path's parent, None for a root phase."""
    count: int = 0
    total_s: float = 0.0
    self_s: float = 0.0
    """Time in the row's instances not covered by any of their children."""
    silent_s: float = 0.0
    """Time of the row's instances inside silent windows."""
    steps: int = 0
    aborted: int = 0
    peak_rss_bytes: int | None = None
    """The builder's largest sampled memory while an instance of the row was open."""
    spans: list[Span] = field(default_factory=list)
    children: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def depth(self) -> int:
        return len(self.path) - 1

    @property
    def label(self) -> str:
        return " > ".join(self.path)


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


_PROGRESS = frozenset({BuildStarted, PhaseStarted, StepCompleted, PhaseFinished, BuildFinished})
MIN_GAP_NS = 1_000_000_000
"""Gaps between callbacks kept as candidate silent windows (the threshold, which depends on the
build's length, is applied when the report is made)."""
MAX_SAMPLES = 20_000
"""Samples of each kind kept; beyond, every other one is dropped (a line has 2,000 points)."""


def report_of(events: Sequence[Event], index: int = 0) -> BuildReport:
    """One build's events (``build_start`` first, where there is one) explained."""
    recorder = BuildRecorder(index)
    for event in events:
        recorder.apply(event)
    return recorder.report()


class BuildRecorder:
    """The report's fold: a build's events in, one at a time (a journal read back, or a live
    build's log, which the HTTP view's timeline follows), and :meth:`report` at any moment.
    Not thread-safe: a follower that reports from another thread holds a lock around both."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.state = BuildState()
        self._threads: dict[int, str] = {}
        self._gaps: list[tuple[int, int]] = []
        self._last_progress_ns: int | None = None
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self._process: list[ProcessSample] = []
        self._gpu: list[GpuSample] = []
        self._anomaly_details: list[str] = []
        self._builder_error: str | None = None
        self._output: dict[str, Any] = {}

    def apply(self, event: Event) -> None:
        self.state.apply(event)
        kind = type(event)
        if self._first_ns is None:
            self._first_ns = event.mono_ns
        self._last_ns = event.mono_ns
        if kind is PhaseStarted:
            self._threads[event.seq] = event.thread
        if kind in _PROGRESS:
            last = self._last_progress_ns
            if last is not None and event.mono_ns - last >= MIN_GAP_NS:
                self._gap(last, event.mono_ns)
            self._last_progress_ns = event.mono_ns
        elif kind is ProcessSample:
            _keep(self._process, event)
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

    def _gap(self, start_ns: int, end_ns: int) -> None:
        """Keep the gap; when :data:`MAX_SILENCES` are kept, the longest of them."""
        gaps = self._gaps
        if len(gaps) < MAX_SILENCES:
            gaps.append((start_ns, end_ns))
            return
        shortest = min(range(len(gaps)), key=lambda i: gaps[i][1] - gaps[i][0])
        if end_ns - start_ns > gaps[shortest][1] - gaps[shortest][0]:
            del gaps[shortest]
            gaps.append((start_ns, end_ns))

    def report(self, now_mono_ns: int | None = None) -> BuildReport:
        """The build so far; ``now_mono_ns``: a build still running is drawn up to then (on
        the build's own clock), its open phases and its current silence with it."""
        state = self.state
        first = self._first_ns or 0
        origin = state.start_mono_ns if state.start_mono_ns is not None else first
        end_ns = state.end_mono_ns
        if end_ns is None:
            end_ns = max(self._last_ns or origin, now_mono_ns or 0)
        duration_s = max(0.0, (end_ns - origin) / 1e9)
        gaps = list(self._gaps)
        last = self._last_progress_ns
        if state.end_mono_ns is None and last is not None and end_ns - last >= MIN_GAP_NS:
            gaps.append((last, end_ns))  # silent now
        silences = _silences(state, gaps, origin, duration_s)
        rss = [(s.mono_ns, s.rss_bytes) for s in self._process if s.rss_bytes is not None]
        rows, left_out = _rows(state, self._threads, origin, end_ns, silences, rss)
        cancel = state.cancel
        return BuildReport(
            index=self.index,
            build_id=state.build_id or "",
            attributes=_record({**state.attributes, **self._output}),
            start_wall_ns=state.start_wall_ns if state.start_wall_ns is not None else 0,
            duration_s=duration_s,
            outcome=state.outcome,
            detail=clip(state.outcome_detail),
            rows=rows,
            rows_left_out=left_out,
            silences=silences,
            cancel=None
            if cancel is None
            else CancelMark(
                at_s=(cancel.mono_ns - origin) / 1e9,
                source=clip(cancel.source, 100),
                reason=clip(cancel.reason),
                policy=clip(cancel.policy),
            ),
            series=_series(self._process, self._gpu, origin, end_ns),
            steps=state.steps_completed_total,
            phases=state.phases_started_total,
            anomalies={kind.value: count for kind, count in sorted(state.anomalies.items())},
            anomaly_details=list(self._anomaly_details),
            builder_error=self._builder_error,
            threads=list(dict.fromkeys(clip(t, 100) for t in self._threads.values())),
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


def _silences(
    state: BuildState, gaps: list[tuple[int, int]], origin: int, duration_s: float
) -> list[Silence]:
    threshold_ns = silence_threshold_s(duration_s) * 1e9
    silences: list[Silence] = []
    for before, after in gaps:
        if after - before >= threshold_ns:
            silences.append(
                Silence(
                    start_s=(before - origin) / 1e9,
                    length_s=(after - before) / 1e9,
                    phase=_innermost_open_at(state, before, after),
                )
            )
    return silences


def _innermost_open_at(state: BuildState, start_ns: int, end_ns: int) -> str | None:
    """The deepest phase that covers ``[start_ns, end_ns]``."""
    best: Phase | None = None
    for phase in state.phases.values():
        finish = phase.finish_mono_ns
        covers = phase.start_mono_ns <= start_ns and (finish is None or finish >= end_ns)
        if covers and (best is None or phase.depth > best.depth):
            best = phase
    return None if best is None else clip(best.name)


# Long: the rows, their totals and their drawing, made in one walk of the tree.
def _rows(  # noqa: PLR0917 (private, one caller)
    state: BuildState,
    threads: dict[int, str],
    origin: int,
    end_ns: int,
    silences: list[Silence],
    rss: list[tuple[int, int]],
) -> tuple[list[Row], int]:
    rows: dict[PathKey, Row] = {}
    left_out: set[PathKey] = set()
    windows = [(s.start_s, s.start_s + s.length_s) for s in silences]
    paths: dict[int, PathKey] = {}
    for phase in state.walk():
        parent_path = paths.get(phase.parent_id) if phase.parent_id is not None else ()
        if parent_path is None:  # its parent's row was left out
            continue
        path = (*parent_path, clip(phase.name, 200))
        row = rows.get(path)
        if row is None:
            if len(rows) >= MAX_ROWS:
                left_out.add(path)
                continue
            parent_row = rows.get(parent_path) if parent_path else None
            row = rows[path] = Row(
                len(rows), path, None if parent_row is None else parent_row.index
            )
            if parent_row is not None:
                parent_row.children.append(row.index)
        paths[phase.id] = path
        finish_ns = phase.finish_mono_ns if phase.finish_mono_ns is not None else end_ns
        start_s, end_s = (phase.start_mono_ns - origin) / 1e9, (finish_ns - origin) / 1e9
        covered = _union(
            (state.phases[c].start_mono_ns, state.phases[c].finish_mono_ns or end_ns)
            for c in phase.children
        )
        row.count += 1
        row.total_s += end_s - start_s
        row.self_s += max(0.0, end_s - start_s - covered / 1e9)
        row.silent_s += sum(max(0.0, min(end_s, b) - max(start_s, a)) for a, b in windows)
        row.steps += phase.steps_completed
        if phase.status is PhaseStatus.ABORTED:
            row.aborted += 1
        peak = _peak(rss, phase.start_mono_ns, finish_ns)
        if peak is not None:
            row.peak_rss_bytes = max(row.peak_rss_bytes or 0, peak)
        if len(row.spans) < MAX_SPANS_PER_ROW:
            row.spans.append(
                Span(
                    start_s=start_s,
                    end_s=end_s,
                    status=phase.status.value,
                    steps=phase.steps_completed,
                    num_steps=phase.num_steps,
                    thread=clip(threads.get(phase.id, ""), 100),
                )
            )
    return list(rows.values()), len(left_out)


def _peak(samples: list[tuple[int, int]], start_ns: int, end_ns: int) -> int | None:
    """The largest sample taken in ``[start_ns, end_ns]`` (samples in time order)."""
    low = bisect.bisect_left(samples, (start_ns, -1))
    high = bisect.bisect_right(samples, (end_ns, 2**63))
    return max((value for _, value in samples[low:high]), default=None)


def _union(intervals: Iterable[tuple[int, int]]) -> int:
    """The length covered by intervals that may overlap (children on several threads)."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


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
