"""The rows of a build's timeline, folded as its phases start and close.

A row is every instance of one path of phase names (``Building engine > Optimizing graph``):
TensorRT's thousand "Measuring tactic time" share one row with their count. A phase adds to its
row when it closes, and is then let go: what the fold keeps is the rows (at most
:data:`MAX_ROWS`, each with at most :data:`MAX_SPANS_PER_ROW` instances to draw) and the phases
open now, so a build of a million steps costs what its rows cost, not what its phases did. The
open phases are added to a copy of their rows when the timeline is drawn.

It is told of phases by a read model (:class:`~trt_otel.core.readmodel.ReadModel`), whose
forgetting fold lets a closed phase go once its views have seen it: the rows are made from what
the read model already folded, not from a fold of their own.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from trt_otel.core.events import ProcessSample
from trt_otel.core.gaps import Gap, Gaps
from trt_otel.core.state import STATUS_TEXT, Phase, PhaseStatus

MAX_ROWS = 300
"""Timeline rows (distinct phase paths) kept per build; the rest are counted, not drawn."""
MAX_SPANS_PER_ROW = 2000
"""Instances of one row kept for drawing (the row's totals count them all)."""
MAX_LEFT_OUT = 10_000
"""Distinct paths left out that are counted (a crafted journal can make any number)."""
MAX_THREADS = 100
MAX_TEXT = 500
"""The longest name kept (a journal could hold megabytes in one)."""
MAX_SAMPLES = 20_000
"""Samples of each kind a report keeps; beyond, every other one is dropped (a line has 2,000
points)."""

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


class _Instance(msgspec.Struct, gc=False):
    """A phase instance as a row keeps it to draw: times on the build's clock (a struct made
    in C: a row keeps up to :data:`MAX_SPANS_PER_ROW` of them, made as phases close)."""

    start_ns: int
    end_ns: int
    status: str
    steps: int
    num_steps: int
    thread: str


@dataclass(slots=True)
class _Sums:
    """A row's totals, on the build's clock, from the instances that closed."""

    index: int
    path: PathKey
    parent: int | None
    children: list[int] = field(default_factory=list)
    count: int = 0
    total_ns: int = 0
    self_ns: int = 0
    steps: int = 0
    aborted: int = 0
    peak_rss_bytes: int | None = None
    instances: list[_Instance] = field(default_factory=list)
    gap_overlap: dict[int, int] = field(default_factory=dict)
    """Per gap (by its start), the time of the row's instances inside it: whether a gap is
    a silent window is decided when the timeline is drawn."""
    named: dict[str, _Sums] = field(default_factory=dict)
    """Its child rows by their last name: a starting phase finds its row from its parent's
    without making and hashing its whole path."""

    def add(  # noqa: PLR0917 (private, two callers)
        self,
        phase: Phase,
        end_ns: int,
        covered_ns: int,
        thread: str,
        overlaps: Iterable[tuple[Gap, int]],
        peak_rss_bytes: int | None,
    ) -> None:
        duration = end_ns - phase.start_mono_ns
        self.count += 1
        self.total_ns += duration
        self.self_ns += max(0, duration - covered_ns)
        self.steps += phase.steps_completed
        if phase.status is PhaseStatus.ABORTED:
            self.aborted += 1
        for gap, overlap in overlaps:
            self.gap_overlap[gap.start_ns] = self.gap_overlap.get(gap.start_ns, 0) + overlap
        if peak_rss_bytes is not None:
            self.peak_rss_bytes = max(self.peak_rss_bytes or 0, peak_rss_bytes)
        if len(self.instances) < MAX_SPANS_PER_ROW:
            self.instances.append(
                _Instance(
                    phase.start_mono_ns,
                    end_ns,
                    STATUS_TEXT[phase.status],
                    phase.steps_completed,
                    phase.num_steps,
                    thread,
                )
            )


class _Cover:
    """The time an open phase's closed children covered: their intervals, merged, with the
    ones no later child can overlap folded into one total (so a parent of a thousand
    sequential children keeps one or two intervals, not a thousand)."""

    __slots__ = ("covered_ns", "intervals")

    def __init__(self) -> None:
        self.covered_ns = 0
        self.intervals: list[tuple[int, int]] = []

    def add(self, start_ns: int, end_ns: int, floor_ns: int) -> None:
        """A child's ``[start_ns, end_ns]``; no later child starts before ``floor_ns``."""
        intervals = self.intervals
        if not intervals or start_ns > intervals[-1][1]:  # the usual case: after the others
            intervals.append((start_ns, end_ns))
            merged = intervals
        else:
            bisect.insort(intervals, (start_ns, end_ns))
            merged = []
            for start, end in intervals:
                if merged and start <= merged[-1][1]:
                    if end > merged[-1][1]:
                        merged[-1] = (merged[-1][0], end)
                else:
                    merged.append((start, end))
        while merged and merged[0][1] <= floor_ns:
            start, end = merged.pop(0)
            self.covered_ns += end - start
        self.intervals = merged

    def total(self, more: Iterable[tuple[int, int]] = ()) -> int:
        """The time covered, with ``more`` intervals (the open children, up to now)."""
        covered, reach = self.covered_ns, None
        intervals = [*self.intervals, *more]
        if not intervals:
            return covered
        for start, end in sorted(intervals):
            if reach is None or start > reach:
                covered += end - start
                reach = end
            elif end > reach:
                covered += end - reach
                reach = end
        return covered


class _Open(msgspec.Struct, gc=False):
    """What the fold keeps of an open phase (a struct made in C: a build opens hundreds of
    thousands of phases; it refers to no object that refers back to it)."""

    phase: Phase
    row: _Sums | None
    """None: its row, or an ancestor's, was left out."""
    thread: str
    cover: _Cover | None = None
    """Made when its first child closes (most phases have none)."""
    open_children: dict[int, int] | None = None
    """Its open children's ids, with their starts (made when its first child starts)."""


class RowFold:
    """A build's timeline rows, told of each phase as it starts and as it closes."""

    def __init__(self) -> None:
        self._rows: dict[PathKey, _Sums] = {}
        self._roots: dict[str, _Sums] = {}
        """The rows of root phases, by name."""
        self._left_out: set[PathKey] = set()
        self._open: dict[int, _Open] = {}
        self._threads: dict[str, None] = {}
        """The threads that started phases, in order of first appearance."""

    @property
    def threads(self) -> list[str]:
        return list(self._threads)

    def started(self, phase: Phase, thread: str) -> None:
        threads = self._threads
        if thread not in threads:  # a thread seen before is kept clipped already
            thread = clip(thread, 100)
            if thread not in threads and len(threads) < MAX_THREADS:
                threads[thread] = None
        name = phase.name
        parent_id = phase.parent_id
        if parent_id is None:
            parent = None
            row = self._roots.get(name) or self._row(None, name)
        else:  # no row where its parent is unknown, or its parent's row was left out
            parent = self._open.get(parent_id)
            above = None if parent is None else parent.row
            row = None if above is None else above.named.get(name) or self._row(above, name)
        self._open[phase.id] = _Open(phase, row, thread)
        if parent is not None:
            children = parent.open_children
            if children is None:
                parent.open_children = {phase.id: phase.start_mono_ns}
            else:
                children[phase.id] = phase.start_mono_ns

    def _row(self, parent: _Sums | None, name: str) -> _Sums | None:
        """The row of ``name`` under ``parent`` (None: a root), made if there is room (None
        where there is not: the path is counted as left out)."""
        named = self._roots if parent is None else parent.named
        name = clip(name, 200)  # the caller found no row of the name as it was
        row = named.get(name)
        if row is not None:
            return row
        path = (name,) if parent is None else (*parent.path, name)
        if len(self._rows) >= MAX_ROWS:
            if len(self._left_out) < MAX_LEFT_OUT:
                self._left_out.add(path)
            return None
        row = _Sums(len(self._rows), path, None if parent is None else parent.index)
        if parent is not None:
            parent.children.append(row.index)
        self._rows[path] = named[name] = row
        return row

    def closed(self, phase: Phase, gaps: Gaps, samples: ProcessSamples) -> None:
        """A phase closed (its open descendants closed before it)."""
        entry = self._open.pop(phase.id, None)
        if entry is None:
            return
        end_ns = phase.finish_mono_ns
        assert end_ns is not None  # closed
        start_ns = phase.start_mono_ns
        parent = self._open.get(phase.parent_id)  # type: ignore[arg-type]  # None: no parent
        if parent is not None:
            children = parent.open_children
            if children is not None:
                children.pop(phase.id, None)
            cover = parent.cover
            if cover is None:
                cover = parent.cover = _Cover()
            if children or cover.intervals:  # a sibling still open, or one that overlaps
                cover.add(start_ns, end_ns, min(children.values()) if children else end_ns)
            else:  # the usual case: children one after another, nothing left to merge
                cover.covered_ns += end_ns - start_ns
        row = entry.row
        if row is not None:
            cover = entry.cover
            # Most phases overlap no gap and no sample: the calls that would say so are saved.
            row.add(
                phase,
                end_ns,
                0 if cover is None else cover.total(),
                entry.thread,
                gaps.overlapping(start_ns, end_ns) if gaps.latest_end_ns > start_ns else (),
                samples.peak_rss(start_ns, end_ns) if samples.latest_ns >= start_ns else None,
            )

    def rows(
        self,
        origin_ns: int,
        end_ns: int,
        silences: Sequence[Gap],
        samples: ProcessSamples,
    ) -> tuple[list[Row], int]:
        """The rows, with the phases open now drawn up to ``end_ns``, in the order their paths
        first started; ``silences``: the gaps that count as silent windows (the current one
        too). How many paths were left out."""
        sums = self._rows
        touched: dict[PathKey, _Sums] = {}
        for entry in self._open.values():
            if entry.row is None:
                continue
            row = touched.get(entry.row.path)
            if row is None:
                row = touched[entry.row.path] = _copy(entry.row)
            phase = entry.phase
            start = phase.start_mono_ns
            children = [
                (child_start, end_ns) for child_start in (entry.open_children or {}).values()
            ]
            overlaps = [
                (gap, min(end_ns, gap.end_ns) - max(start, gap.start_ns))
                for gap in silences  # each before now: those after the phase's start
                if gap.end_ns > start
            ]
            row.add(
                phase,
                end_ns,
                (entry.cover or _Cover()).total(children),
                entry.thread,
                overlaps,
                samples.peak_rss(start, end_ns),
            )
        silent = {gap.start_ns for gap in silences}
        rows = [_row(touched.get(path, row), origin_ns, silent) for path, row in sums.items()]
        return rows, len(self._left_out)


def _copy(sums: _Sums) -> _Sums:
    row = copy.copy(sums)
    row.instances = list(sums.instances)
    row.gap_overlap = dict(sums.gap_overlap)
    return row


def _row(sums: _Sums, origin_ns: int, silent: set[int]) -> Row:
    return Row(
        index=sums.index,
        path=sums.path,
        parent=sums.parent,
        count=sums.count,
        total_s=sums.total_ns / 1e9,
        self_s=sums.self_ns / 1e9,
        silent_s=sum(ns for start, ns in sums.gap_overlap.items() if start in silent) / 1e9,
        steps=sums.steps,
        aborted=sums.aborted,
        peak_rss_bytes=sums.peak_rss_bytes,
        spans=[
            Span(
                start_s=(i.start_ns - origin_ns) / 1e9,
                end_s=(i.end_ns - origin_ns) / 1e9,
                status=i.status,
                steps=i.steps,
                num_steps=i.num_steps,
                thread=i.thread,
            )
            for i in sums.instances
        ],
        children=list(sums.children),
    )


class ProcessSamples:
    """The builder's process samples a report keeps, in time order, with their times apart: a
    closed phase asks for its peak (:meth:`peak_rss`), and a live build closes hundreds of
    thousands of phases, most of them between two samples."""

    __slots__ = ("latest_ns", "samples", "times")

    def __init__(self) -> None:
        self.samples: list[ProcessSample] = []
        self.times: list[int] = []
        self.latest_ns = -1
        """The latest sample's time (-1: none yet)."""

    def keep(self, sample: ProcessSample) -> None:
        """Append, halving the lists (every other sample) past :data:`MAX_SAMPLES`: bounded,
        still even."""
        self.samples.append(sample)
        self.times.append(sample.mono_ns)
        self.latest_ns = max(self.latest_ns, sample.mono_ns)
        if len(self.samples) > MAX_SAMPLES:
            del self.samples[1::2]
            del self.times[1::2]

    def peak_rss(self, start_ns: int, end_ns: int) -> int | None:
        """The largest resident set sampled in ``[start_ns, end_ns]``."""
        times = self.times
        if not times or times[-1] < start_ns:  # none since it started
            return None
        low = bisect.bisect_left(times, start_ns)
        high = bisect.bisect_right(times, end_ns, low)
        if low == high:  # none while it ran (most phases)
            return None
        kept = (s.rss_bytes for s in self.samples[low:high] if s.rss_bytes is not None)
        return max(kept, default=None)
