"""The report as one self-contained HTML page: a picture of each build, drawn as SVG.

The page's markup is in the Jinja2 templates beside this module (``templates/``); this module
lays the build out (where each row, bar and line goes, and what each says) and hands the
templates plain values. The templates autoescape, and every value is written through
:func:`_written`, which also writes control characters as escapes: every string from the
journal (phase names, reasons, attributes) is escaped before it reaches the page, so a crafted
journal cannot add markup, nor reach a terminal that shows the page (``report`` without ``-o``).

Nothing is fetched: the style and the one small script are inline, and a Content-Security-Policy
in the page allows exactly those two (by their SHA-256) and nothing else, not even an image from
elsewhere; if a journal could add markup, the policy would not run it. The page works without
its script (every row shown); the script only folds rows. Jinja2 is imported when a page or a
timeline is first drawn, not with this module.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trt_otel.core.sizes import format_bytes
from trt_otel.views.report.model import (
    BuildReport,
    Row,
    Series,
    Silence,
    Span,
    anomaly_total,
    counted,
    forecast_text,
    outcome_text,
    record_items,
    seconds_text,
)
from trt_otel.views.terminal import printable

if TYPE_CHECKING:
    import jinja2

LABEL_W = 330
CHART_W = 840
WIDTH = LABEL_W + CHART_W + 20
ROW_H = 20
AXIS_H = 34
SERIES_H = 56

_SVG_STYLE = """
svg { display: block; font: 12px system-ui, sans-serif; }
svg text { fill: #1f2328; } svg .muted { fill: #656d76; }
.bar.finished { fill: #4c78a8; } .bar.aborted { fill: #e45756; } .bar.open { fill: #f58518; }
.silence { fill: url(#hatch); } .silence-label { fill: #9a6700; font-weight: 600; }
.cancel-line { stroke: #cf222e; stroke-width: 2; stroke-dasharray: 5 3; }
.end-line { stroke: #1f2328; stroke-width: 1.5; }
.grid { stroke: #eaeef2; } .axis { stroke: #d0d7de; }
.series-line { fill: none; stroke: #8250df; stroke-width: 1.5; }
.series-line.gpu { stroke: #1a7f37; }
"""
"""The drawing's style: in the page, and inside the timeline drawn alone (the live page's)."""

_STYLE = (
    """
:root { color-scheme: light; --ink: #1f2328; --muted: #656d76; --line: #d0d7de; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--ink);
  margin: 24px auto; max-width: 1240px; padding: 0 16px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub, .muted { color: var(--muted); } code { font-size: 12.5px; }
.outcome { font-weight: 600; padding: 1px 8px; border-radius: 10px; color: #fff; }
.success { background: #1a7f37; } .failure, .timeout { background: #cf222e; }
.cancellation { background: #bf8700; } .never { background: #6e7781; }
.toggle { cursor: pointer; fill: var(--muted); } .row:hover .label { font-weight: 600; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left;
  vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; padding-left: 10px; }
td.path { max-width: 560px; overflow-wrap: anywhere; } td.value { overflow-wrap: anywhere; }
.note { background: #fff8c5; border: 1px solid #d4a72c; border-radius: 6px; padding: 6px 10px; }
section.build { border-top: 2px solid var(--line); margin-top: 24px; }
"""
    + _SVG_STYLE
)

_SCRIPT = """
(function () {
  for (const svg of document.querySelectorAll("svg.timeline")) {
    const rows = Array.from(svg.querySelectorAll("g.row"));
    const byId = new Map(rows.map((r) => [r.dataset.row, r]));
    const top = Number(svg.dataset.top), rowH = Number(svg.dataset.rowH);
    const folded = new Set();
    const hidden = (r) => {
      for (let p = r.dataset.parent; p; p = byId.get(p).dataset.parent) {
        if (folded.has(p)) return true;
      }
      return false;
    };
    const layout = () => {
      let y = top;
      for (const r of rows) {
        const gone = hidden(r);
        r.setAttribute("visibility", gone ? "hidden" : "visible");
        if (!gone) { r.setAttribute("transform", "translate(0," + y + ")"); y += rowH; }
        const t = r.querySelector(".toggle");
        if (t) t.textContent = folded.has(r.dataset.row) ? "\\u25b8" : "\\u25be";
      }
      const h = y + 8;
      svg.setAttribute("height", h);
      for (const full of svg.querySelectorAll(".full-height")) full.setAttribute("height", h - top);
    };
    svg.addEventListener("click", (e) => {
      const t = e.target.closest(".toggle");
      if (!t) return;
      const id = t.closest("g.row").dataset.row;
      folded.has(id) ? folded.delete(id) : folded.add(id);
      layout();
    });
    layout();
  }
})();
"""


def _digest(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


CONTENT_SECURITY_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_digest(_STYLE)}'; "
    f"script-src 'sha256-{_digest(_SCRIPT)}'; img-src 'none'; connect-src 'none'; "
    "base-uri 'none'; form-action 'none'"
)
"""Only the page's own style and script, by hash: nothing from anywhere else runs or loads."""


def e(text: object) -> str:
    """Escaped for HTML text and attribute values, control characters written as escapes (the
    page may be printed to a terminal: ``report`` without ``-o``)."""
    return html.escape(printable(str(text)), quote=True)


def _written(value: object) -> object:
    """Every value a template writes: escaped here, and marked so that autoescaping leaves it
    as it is (markup the module made itself, the style and script, is marked already)."""
    from markupsafe import Markup

    return value if isinstance(value, Markup) else Markup(e(value))


@functools.cache
def _templates() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("trt_otel.views.report", "templates"),
        autoescape=True,
        finalize=_written,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def _trusted(text: str) -> object:
    """The page's own style or script, written as they are (their digests are in the policy)."""
    from markupsafe import Markup

    return Markup(text)


def render_html(reports: Sequence[BuildReport], title: str) -> str:
    """The whole page for the builds of one or several journals."""
    return (
        _templates()
        .get_template("page.html.j2")
        .render(
            title=title,
            policy=CONTENT_SECURITY_POLICY,
            style=_trusted(_STYLE),
            script=_trusted(_SCRIPT),
            builds=counted(len(reports), "build"),
            sections=[_section(report, len(reports)) for report in reports],
        )
    )


def timeline_svg(report: BuildReport) -> str:
    """The timeline drawn alone, as an SVG document (the live page shows it as an image, which
    runs no script: its rows do not fold), with the style it needs inside."""
    template = _templates().get_template("timeline.svg.j2")
    return template.render(standalone=_timeline(report, style=_trusted(_SVG_STYLE)))


# -- a build's section ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TopRow:
    parents: str
    name: str
    count: str
    self_time: str
    total: str
    share: str
    silent: str
    steps: str
    peak: str


@dataclass(frozen=True, slots=True)
class _Section:
    number: int
    heading: str
    outcome: str
    css: str
    duration: str
    model: object
    backend: object
    version: object
    counts: str
    silent: str
    build_id: str
    forecast: str | None
    notes: list[_Note]
    timeline: _Timeline
    resources: _Resources | None
    top: list[_TopRow]
    silences: list[str]
    record: list[tuple[str, str]]
    anomalies: list[str]
    anomaly_total: int
    anomaly_details: list[str]


def _section(report: BuildReport, builds: int) -> _Section:
    outcome = outcome_text(report)
    steps, phases = counted(report.steps, "step"), counted(report.phases, "phase")
    return _Section(
        number=report.index + 1,
        heading=f"Build {report.index + 1} of {builds}" if builds > 1 else "Build",
        outcome=outcome,
        css="never" if report.outcome is None else outcome,
        duration=seconds_text(report.duration_s),
        model=report.attributes.get("model.path", ""),
        backend=report.attributes.get("trt.backend", ""),
        version=report.attributes.get("trt.version", ""),
        counts=f"{steps}, {phases}",
        silent=seconds_text(report.silent_s),
        build_id=report.build_id,
        forecast=forecast_text(report),
        notes=_notes(report),
        timeline=_timeline(report),
        resources=_resources(report),
        top=_top_rows(report),
        silences=[
            f"{seconds_text(s.length_s)} from {seconds_text(s.start_s)}, {s.where}"
            for s in report.silences
        ],
        record=record_items(report),
        anomalies=[f"{kind} \u00d7{count}" for kind, count in report.anomalies.items()],
        anomaly_total=anomaly_total(report),
        anomaly_details=list(report.anomaly_details),
    )


@dataclass(frozen=True, slots=True)
class _Note:
    text: str
    asked_by: str = ""
    """For a cancel: who asked for it (in bold), after ``text`` and before ``rest``."""
    rest: str = ""


def _notes(report: BuildReport) -> list[_Note]:
    notes = []
    if report.cancel is not None:
        cancel = report.cancel
        rest = f" at {seconds_text(cancel.at_s)}: {cancel.reason}"
        if cancel.policy:
            rest += f" ({cancel.policy})"
        if cancel.stopped_after_s is not None:
            rest += f"; stopped {seconds_text(cancel.stopped_after_s)} later"
        notes.append(_Note("Cancelled by ", cancel.source, rest))
    if report.detail:
        notes.append(_Note(f"Ended: {report.detail}"))
    if report.builder_error:
        notes.append(_Note(f"Builder error: {report.builder_error}"))
    if report.outcome is None:
        notes.append(_Note("The record stops before the build's end."))
    return notes


# -- the timeline --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Tick:
    x: float
    label: str


@dataclass(frozen=True, slots=True)
class _SilentBand:
    x: float
    width: str
    label_x: str
    said: str
    length: str


@dataclass(frozen=True, slots=True)
class _Bar:
    status: str
    x: float
    width: str
    what: str


@dataclass(frozen=True, slots=True)
class _Row:
    index: int
    parent: str
    y: int
    indent: int
    folds: bool
    title: str
    label: str
    bars: list[_Bar]


@dataclass(frozen=True, slots=True)
class _CancelMark:
    x: float
    said: str


@dataclass(frozen=True, slots=True)
class _Timeline:
    width: int
    height: int
    top: int
    row_h: int
    style: object
    """The drawing's own style, when it is drawn alone; None inside the page."""
    ticks: list[_Tick]
    silences: list[_SilentBand]
    rows: list[_Row]
    end_x: float
    end: str
    cancel: _CancelMark | None
    rows_left_out: int


def _x(seconds: float, duration_s: float) -> float:
    scale = CHART_W / duration_s if duration_s > 0 else 0.0
    return round(LABEL_W + max(0.0, seconds) * scale, 2)


def _ticks(duration_s: float) -> list[float]:
    """Round times for the axis: about eight of them."""
    if duration_s <= 0:
        return [0.0]
    raw = duration_s / 8
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(duration_s / step) + 1)]


def _timeline(report: BuildReport, *, style: object = None) -> _Timeline:
    duration = report.duration_s
    cancel = None
    if report.cancel is not None:
        cancel = _CancelMark(
            _x(report.cancel.at_s, duration),
            f"cancel by {report.cancel.source}: {report.cancel.reason}",
        )
    return _Timeline(
        width=WIDTH,
        height=AXIS_H + ROW_H * len(report.rows) + 8,
        top=AXIS_H,
        row_h=ROW_H,
        style=style,
        ticks=[
            _Tick(_x(tick, duration), seconds_text(tick) if tick else "0")
            for tick in _ticks(duration)
        ],
        silences=[_silent_band(silence, duration) for silence in report.silences],
        rows=[_row(row, AXIS_H + i * ROW_H, duration) for i, row in enumerate(report.rows)],
        end_x=_x(duration, duration),
        end=f"{outcome_text(report)} at {seconds_text(duration)}",
        cancel=cancel,
        rows_left_out=0 if style is not None else report.rows_left_out,
    )


def _silent_band(silence: Silence, duration_s: float) -> _SilentBand:
    x0 = _x(silence.start_s, duration_s)
    x1 = _x(silence.start_s + silence.length_s, duration_s)
    return _SilentBand(
        x=x0,
        width=f"{max(1.0, x1 - x0):.2f}",
        label_x=f"{(x0 + x1) / 2:.2f}",
        said=f"silent for {seconds_text(silence.length_s)} {silence.where}",
        length=seconds_text(silence.length_s),
    )


def _row(row: Row, y: int, duration_s: float) -> _Row:
    count = f" \u00d7{row.count:,}" if row.count > 1 else ""
    label = f"{row.name}{count}"
    shown = label if len(label) <= 44 - row.depth else label[: 43 - row.depth] + "\u2026"
    return _Row(
        index=row.index,
        parent="" if row.parent is None else str(row.parent),
        y=y,
        indent=6 + 14 * min(row.depth, 12),
        folds=bool(row.children),
        title=(
            f"{row.label}{count}: {seconds_text(row.total_s)} in all, "
            f"{seconds_text(row.self_s)} self"
        ),
        label=shown,
        bars=[_bar(span, row, duration_s) for span in _merged(row.spans, duration_s)],
    )


def _merged(spans: list[Span], duration_s: float) -> list[tuple[Span, int]]:
    """Spans of one row, those closer than a pixel drawn as one (with how many it holds): a
    thousand repeated siblings stay a handful of shapes."""
    pixel_s = duration_s / CHART_W if duration_s > 0 else 0.0
    merged: list[tuple[Span, int]] = []
    for span in sorted(spans, key=lambda s: s.start_s):
        if merged:
            last, count = merged[-1]
            if last.status == span.status and span.start_s - last.end_s <= pixel_s:
                wider = Span(
                    last.start_s,
                    max(last.end_s, span.end_s),
                    last.status,
                    last.steps + span.steps,
                    last.num_steps + span.num_steps,
                    last.thread,
                )
                merged[-1] = (wider, count + 1)
                continue
        merged.append((span, 1))
    return merged


def _bar(merged: tuple[Span, int], row: Row, duration_s: float) -> _Bar:
    span, count = merged
    x0, x1 = _x(span.start_s, duration_s), _x(span.end_s, duration_s)
    what = (
        f"{row.name}: {seconds_text(span.end_s - span.start_s)} from "
        f"{seconds_text(span.start_s)}, {span.steps} of {span.num_steps} steps, {span.status}"
    )
    if count > 1:
        what = f"{row.name}: {count} instances from {seconds_text(span.start_s)}"
    if span.thread:
        what += f", thread {span.thread}"
    return _Bar(span.status, x0, f"{max(1.5, x1 - x0):.2f}", what)


# -- resource lines ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Line:
    name: str
    css: str
    peak: str
    name_y: int
    peak_y: int
    axis_y: int
    x1: int
    x2: int
    points: str


@dataclass(frozen=True, slots=True)
class _Resources:
    width: int
    height: int
    lines: list[_Line]


def _resources(report: BuildReport) -> _Resources | None:
    if not report.series:
        return None
    lines = [
        _line(series, index * SERIES_H + 4, report.duration_s)
        for index, series in enumerate(report.series)
    ]
    return _Resources(WIDTH, SERIES_H * len(report.series) + 8, lines)


def _line(series: Series, y: int, duration_s: float) -> _Line:
    peak = series.peak
    scale_top = peak if peak > 0 else 1.0
    if series.unit == "%":
        scale_top = max(100.0, peak)
    band = SERIES_H - 14
    points = " ".join(
        f"{_x(t, duration_s)},{y + 4 + band - band * v / scale_top:.1f}" for t, v in series.points
    )
    return _Line(
        name=series.name,
        css="series-line gpu" if series.name.startswith("GPU") else "series-line",
        peak=_value(peak, series.unit),
        name_y=y + 16,
        peak_y=y + 32,
        axis_y=y + 4 + band,
        x1=LABEL_W,
        x2=LABEL_W + CHART_W,
        points=points,
    )


def _value(value: float, unit: str) -> str:
    if unit == "bytes":
        return format_bytes(int(value))
    return f"{value:.0f}{unit}"


# -- tables --------------------------------------------------------------------------------------


def _top_rows(report: BuildReport) -> list[_TopRow]:
    build = report.duration_s or 1.0
    return [
        _TopRow(
            parents=" > ".join(row.path[:-1]),
            name=row.name,
            count=f"{row.count:,}",
            self_time=seconds_text(row.self_s),
            total=seconds_text(row.total_s),
            share=f"{row.self_s / build:.0%}",
            silent=f"{row.silent_s / row.total_s:.0%}" if row.total_s > 0 else "-",
            steps=f"{row.steps:,}",
            peak=format_bytes(row.peak_rss_bytes) if row.peak_rss_bytes is not None else "-",
        )
        for row in report.top_rows()
    ]
