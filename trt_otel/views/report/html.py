"""The report as one self-contained HTML page: a picture of each build, drawn here as SVG.

Nothing is fetched: the style and the one small script are inline, and a Content-Security-Policy
in the page allows exactly those two (by their SHA-256) and nothing else, not even an image from
elsewhere. Every string from the journal (phase names, reasons, attributes) is escaped before
it reaches the page, so a crafted journal cannot add markup; and if it could, the policy would
not run it. The page works without its script (every row shown); the script only folds rows.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
from collections.abc import Sequence

from trt_otel.core.sizes import format_bytes
from trt_otel.views.report.model import (
    BuildReport,
    Row,
    Series,
    Span,
    anomaly_total,
    counted,
    forecast_text,
    outcome_text,
    record_items,
    seconds_text,
)
from trt_otel.views.terminal import printable

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


def render_html(reports: Sequence[BuildReport], title: str) -> str:
    """The whole page for the builds of one or several journals."""
    sections = "\n".join(_section(report, len(reports)) for report in reports)
    if not reports:
        sections = '<p class="note">No build in this journal.</p>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{e(CONTENT_SECURITY_POLICY)}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{e(title)}</title>\n<style>{_STYLE}</style></head>\n<body>\n"
        f'<h1>{e(title)}</h1>\n<p class="sub">trt-otel report: '
        f"{counted(len(reports), 'build')}</p>\n{sections}\n"
        f"<script>{_SCRIPT}</script>\n</body></html>\n"
    )


def _section(report: BuildReport, builds: int) -> str:
    name = f"Build {report.index + 1} of {builds}" if builds > 1 else "Build"
    outcome = outcome_text(report)
    css = "never" if report.outcome is None else outcome
    backend = report.attributes.get("trt.backend", "")
    version = report.attributes.get("trt.version", "")
    model = report.attributes.get("model.path", "")
    parts = [
        f'<section class="build" id="build-{report.index + 1}">',
        f'<h2>{name}: <span class="outcome {e(css)}">{e(outcome)}</span> in '
        f"{e(seconds_text(report.duration_s))}</h2>",
        f'<p class="sub">{e(model)} &middot; {e(backend)} {e(version)} &middot; '
        f"{e(counted(report.steps, 'step'))}, {e(counted(report.phases, 'phase'))}, "
        f"silent {e(seconds_text(report.silent_s))} &middot; <code>{e(report.build_id)}</code>"
        + (f" &middot; forecast: {e(forecast)}" if (forecast := forecast_text(report)) else "")
        + "</p>",
        _notes(report),
        "<h3>Timeline</h3>",
        _timeline(report),
        _resources(report),
        "<h3>Where the time went</h3>",
        _top_table(report),
        _silence_list(report),
        "<h3>Record</h3>",
        _record(report),
        _anomalies(report),
        "</section>",
    ]
    return "\n".join(part for part in parts if part)


def _notes(report: BuildReport) -> str:
    notes = []
    if report.cancel is not None:
        cancel = report.cancel
        notes.append(
            f"Cancelled by <b>{e(cancel.source)}</b> at {e(seconds_text(cancel.at_s))}: "
            f"{e(cancel.reason)}"
            + (f" ({e(cancel.policy)})" if cancel.policy else "")
            + (
                f"; stopped {e(seconds_text(cancel.stopped_after_s))} later"
                if cancel.stopped_after_s is not None
                else ""
            )
        )
    if report.detail:
        notes.append(f"Ended: {e(report.detail)}")
    if report.builder_error:
        notes.append(f"Builder error: {e(report.builder_error)}")
    if report.outcome is None:
        notes.append("The record stops before the build's end.")
    return "".join(f'<p class="note">{note}</p>' for note in notes)


# -- the timeline --------------------------------------------------------------------------------


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


def timeline_svg(report: BuildReport) -> str:
    """The timeline drawn alone, as an SVG document (the live page shows it as an image, which
    runs no script: its rows do not fold), with the style it needs inside."""
    return _timeline(report, standalone=True)


def _timeline(report: BuildReport, *, standalone: bool = False) -> str:
    duration = report.duration_s
    height = AXIS_H + ROW_H * len(report.rows) + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{WIDTH}" '
        f'height="{height}" data-top="{AXIS_H}" data-row-h="{ROW_H}" role="img" '
        'aria-label="timeline of the phases">',
        f'<style>{_SVG_STYLE}</style><rect width="100%" height="100%" fill="#fff"/>'
        if standalone
        else "",
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff8c5"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#d4a72c" stroke-width="2"/></pattern></defs>',
    ]
    for tick in _ticks(duration):
        x = _x(tick, duration)
        out.append(
            f'<line class="grid full-height" x1="{x}" x2="{x}" y1="{AXIS_H}" y2="{height}"/>'
            f'<text class="muted" x="{x}" y="{AXIS_H - 8}" text-anchor="middle">'
            f"{e(seconds_text(tick) if tick else '0')}</text>"
        )
    for silence in report.silences:
        x0, x1 = _x(silence.start_s, duration), _x(silence.start_s + silence.length_s, duration)
        said = f"silent for {seconds_text(silence.length_s)} {silence.where}"
        out.append(
            f'<g class="silent-window"><title>{e(said)}</title>'
            f'<rect class="silence full-height" x="{x0}" y="{AXIS_H}" '
            f'width="{max(1.0, x1 - x0):.2f}" height="{height - AXIS_H}"/>'
            f'<text class="silence-label" x="{(x0 + x1) / 2:.2f}" y="{AXIS_H - 22}" '
            f'text-anchor="middle">silent {e(seconds_text(silence.length_s))}</text></g>'
        )
    out.extend(_row(row, AXIS_H + i * ROW_H, duration) for i, row in enumerate(report.rows))
    out.append(_marks(report, height))
    out.append("</svg>")
    if report.rows_left_out and not standalone:
        out.append(f'<p class="muted">{report.rows_left_out} more phase paths not drawn.</p>')
    return "".join(out)


def _row(row: Row, y: int, duration_s: float) -> str:
    parent = "" if row.parent is None else str(row.parent)
    indent = 6 + 14 * min(row.depth, 12)
    toggle = f'<text class="toggle" x="{indent}" y="14">\u25be</text>' if row.children else ""
    count = f" \u00d7{row.count:,}" if row.count > 1 else ""
    label = f"{row.name}{count}"
    shown = label if len(label) <= 44 - row.depth else label[: 43 - row.depth] + "\u2026"
    bars = "".join(_bar(span, row, duration_s) for span in _merged(row.spans, duration_s))
    return (
        f'<g class="row" data-row="{row.index}" data-parent="{parent}" '
        f'transform="translate(0,{y})"><title>{e(row.label)}{e(count)}: '
        f"{e(seconds_text(row.total_s))} in all, {e(seconds_text(row.self_s))} self"
        f"</title>{toggle}"
        f'<text class="label" x="{indent + 12}" y="14">{e(shown)}</text>{bars}</g>'
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


def _bar(merged: tuple[Span, int], row: Row, duration_s: float) -> str:
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
    return (
        f'<rect class="bar {e(span.status)}" x="{x0}" y="3" width="{max(1.5, x1 - x0):.2f}" '
        f'height="{ROW_H - 6}" rx="2"><title>{e(what)}</title></rect>'
    )


def _marks(report: BuildReport, height: int) -> str:
    duration = report.duration_s
    out = []
    end_x = _x(duration, duration)
    out.append(
        f'<line class="end-line full-height" x1="{end_x}" x2="{end_x}" y1="{AXIS_H}" '
        f'y2="{height}"><title>{e(outcome_text(report))} at {e(seconds_text(duration))}'
        "</title></line>"
    )
    if report.cancel is not None:
        x = _x(report.cancel.at_s, duration)
        out.append(
            f'<g class="cancel-mark"><line class="cancel-line full-height" x1="{x}" x2="{x}" '
            f'y1="{AXIS_H - 4}" y2="{height}"/><title>cancel by {e(report.cancel.source)}: '
            f"{e(report.cancel.reason)}</title>"
            f'<text x="{x + 4}" y="{AXIS_H - 8}" fill="#cf222e">cancel</text></g>'
        )
    return "".join(out)


# -- resource lines ------------------------------------------------------------------------------


def _resources(report: BuildReport) -> str:
    if not report.series:
        return '<p class="muted">No resource samples in this journal.</p>'
    height = SERIES_H * len(report.series) + 8
    out = [
        "<h3>Resources</h3>",
        f'<svg class="resources" width="{WIDTH}" height="{height}" role="img" '
        'aria-label="resource lines">',
    ]
    for index, series in enumerate(report.series):
        out.append(_series(series, index * SERIES_H + 4, report.duration_s))
    out.append("</svg>")
    return "".join(out)


def _series(series: Series, y: int, duration_s: float) -> str:
    peak = series.peak
    scale_top = peak if peak > 0 else 1.0
    if series.unit == "%":
        scale_top = max(100.0, peak)
    band = SERIES_H - 14
    points = " ".join(
        f"{_x(t, duration_s)},{y + 4 + band - band * v / scale_top:.1f}" for t, v in series.points
    )
    css = "series-line gpu" if series.name.startswith("GPU") else "series-line"
    return (
        f'<g class="series"><text x="6" y="{y + 16}">{e(series.name)}</text>'
        f'<text class="muted" x="6" y="{y + 32}">peak {e(_value(peak, series.unit))}</text>'
        f'<line class="axis" x1="{LABEL_W}" x2="{LABEL_W + CHART_W}" y1="{y + 4 + band}" '
        f'y2="{y + 4 + band}"/><polyline class="{css}" points="{points}"/></g>'
    )


def _value(value: float, unit: str) -> str:
    if unit == "bytes":
        return format_bytes(int(value))
    return f"{value:.0f}{unit}"


# -- tables --------------------------------------------------------------------------------------


def _top_table(report: BuildReport) -> str:
    build = report.duration_s or 1.0
    rows = []
    for row in report.top_rows():
        silent = f"{row.silent_s / row.total_s:.0%}" if row.total_s > 0 else "-"
        peak = format_bytes(row.peak_rss_bytes) if row.peak_rss_bytes is not None else "-"
        rows.append(
            f'<tr><td class="path">{_path(row)}</td><td class="num">{row.count:,}</td>'
            f'<td class="num">{e(seconds_text(row.self_s))}</td>'
            f'<td class="num">{e(seconds_text(row.total_s))}</td>'
            f'<td class="num">{row.self_s / build:.0%}</td><td class="num">{silent}</td>'
            f'<td class="num">{row.steps:,}</td><td class="num">{e(peak)}</td></tr>'
        )
    return (
        '<table class="phases"><thead><tr><th>phase</th><th class="num">count</th>'
        '<th class="num">self</th><th class="num">total</th><th class="num">share</th>'
        '<th class="num">silent</th><th class="num">steps</th><th class="num">peak memory</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        '<p class="muted">Self: time in the phase not inside a phase under it. Share: of the '
        "build's time. Silent: of the phase's time, spent with no callback from TensorRT.</p>"
    )


def _path(row: Row) -> str:
    """The phase's name, after its parents' (muted)."""
    parents = " > ".join(row.path[:-1])
    above = f'<span class="muted">{e(parents)} &gt; </span>' if parents else ""
    return f"{above}<b>{e(row.name)}</b>"


def _silence_list(report: BuildReport) -> str:
    if not report.silences:
        return ""
    items = "".join(
        f"<li>{e(seconds_text(s.length_s))} from {e(seconds_text(s.start_s))}, {e(s.where)}</li>"
        for s in report.silences
    )
    return f"<h3>Silent windows</h3><ul>{items}</ul>"


def _record(report: BuildReport) -> str:
    rows = "".join(
        f'<tr><th>{e(key)}</th><td class="value"><code>{e(value)}</code></td></tr>'
        for key, value in record_items(report)
    )
    return f'<table class="record"><tbody>{rows}</tbody></table>'


def _anomalies(report: BuildReport) -> str:
    if not report.anomalies:
        return ""
    counts = ", ".join(f"{e(kind)} \u00d7{count}" for kind, count in report.anomalies.items())
    details = "".join(f"<li>{e(detail)}</li>" for detail in report.anomaly_details)
    return f"<h3>Protocol anomalies ({anomaly_total(report)})</h3><p>{counts}</p><ul>{details}</ul>"
