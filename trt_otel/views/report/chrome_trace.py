"""The report as a Trace Event Format file (JSON), which Perfetto UI and chrome://tracing open.

Each build is a process (``pid``: its place in the report, from 1); each thread that started
phases is a thread of it (``tid``), named by a metadata event. Every phase instance is a complete
event (``"ph": "X"``) on its thread; the format needs the complete events of one thread to nest,
so an instance that would overlap another without nesting (a broken protocol, or builder threads
the journal could not tell apart) goes to an extra lane of that thread. The silent windows are
complete events on a lane of their own, the resource lines are counters (``"C"``), and the cancel
and the end are instant events (``"i"``). Times are microseconds from the earliest build's start,
by the wall clock (builds of different journals were recorded by different processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trt_otel.views.report.model import BuildReport, outcome_text

SILENCE_LANE = "silent windows"


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def chrome_trace(reports: Sequence[BuildReport]) -> dict[str, Any]:
    """The trace of every build: ``{"traceEvents": [...], ...}``, ready for ``json.dumps``."""
    base_ns = min((r.start_wall_ns for r in reports), default=0)
    events: list[dict[str, Any]] = []
    for report in reports:
        events.extend(_build_events(report, (report.start_wall_ns - base_ns) / 1e9))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "trt-otel report", "builds": len(reports)},
    }


def _build_events(report: BuildReport, offset_s: float) -> list[dict[str, Any]]:
    pid = report.index + 1
    backend = report.attributes.get("trt.backend", "")
    model = report.attributes.get("model.path", "")
    name = f"build {pid}: {model} ({backend}, {outcome_text(report)})"
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
    ]
    lanes = _Lanes(pid, events)
    events.extend(_phase_events(report, pid, offset_s, lanes))
    for silence in report.silences:
        events.append(
            {
                "ph": "X",
                "name": "silent",
                "cat": "silence",
                "pid": pid,
                "tid": lanes.tid(SILENCE_LANE),
                "ts": _us(offset_s + silence.start_s),
                "dur": _us(silence.length_s),
                "args": {"phase": silence.phase or ""},
            }
        )
    for series in report.series:
        key = "percent" if series.unit == "%" else series.unit
        events.extend(
            {
                "ph": "C",
                "name": series.name,
                "pid": pid,
                "tid": 0,
                "ts": _us(offset_s + t),
                "args": {key: value},
            }
            for t, value in series.points
        )
    if report.cancel is not None:
        cancel = report.cancel
        events.append(
            _instant(pid, offset_s + cancel.at_s, f"cancel ({cancel.source})", cancel.reason)
        )
    events.append(
        _instant(pid, offset_s + report.duration_s, f"build {outcome_text(report)}", report.detail)
    )
    return events


def _phase_events(
    report: BuildReport, pid: int, offset_s: float, lanes: _Lanes
) -> list[dict[str, Any]]:
    """A complete event per phase instance, on the lane of its thread where it nests."""
    events: list[dict[str, Any]] = []
    phases = sorted(
        ((span, row) for row in report.rows for span in row.spans),
        key=lambda item: (item[0].start_s, -item[0].end_s, item[1].depth),
    )
    for span, row in phases:
        tid = lanes.place(span.thread or "builder", span.start_s, span.end_s)
        events.append(
            {
                "ph": "X",
                "name": row.name,
                "cat": "phase",
                "pid": pid,
                "tid": tid,
                "ts": _us(offset_s + span.start_s),
                "dur": _us(max(0.0, span.end_s - span.start_s)),
                "args": {
                    "path": row.label,
                    "steps": span.steps,
                    "num_steps": span.num_steps,
                    "status": span.status,
                },
            }
        )
    return events


def _instant(pid: int, at_s: float, name: str, detail: str) -> dict[str, Any]:
    return {
        "ph": "i",
        "s": "p",
        "name": name,
        "cat": "build",
        "pid": pid,
        "tid": 0,
        "ts": _us(at_s),
        "args": {"detail": detail},
    }


class _Lanes:
    """Threads as ``tid`` numbers, and on each the stack of open complete events, so that an
    event that does not nest goes to a lane of its own."""

    def __init__(self, pid: int, events: list[dict[str, Any]]) -> None:
        self._pid = pid
        self._events = events
        self._tids: dict[str, int] = {}
        self._open: dict[int, list[float]] = {}

    def tid(self, lane: str) -> int:
        tid = self._tids.get(lane)
        if tid is None:
            tid = self._tids[lane] = len(self._tids) + 1
            self._events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": self._pid,
                    "tid": tid,
                    "args": {"name": lane},
                }
            )
        return tid

    def place(self, thread: str, start_s: float, end_s: float) -> int:
        """The lane of ``thread`` where ``[start_s, end_s]`` nests (events in start order)."""
        lane, extra = thread, 1
        while True:
            tid = self.tid(lane)
            stack = self._open.setdefault(tid, [])
            while stack and stack[-1] <= start_s:
                stack.pop()
            if not stack or end_s <= stack[-1]:
                stack.append(end_s)
                return tid
            extra += 1
            lane = f"{thread} ({extra})"
