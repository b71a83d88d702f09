"""The report as GitHub-flavoured markdown: for CI logs and ``$GITHUB_STEP_SUMMARY``.

What the page shows but the timeline: the outcome, the phases that took the time, the silent
windows, the cancel, the record and the anomalies. Text from the journal is escaped so that it
stays text: a phase name cannot end a table cell, open a link or add HTML to a job summary.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from trt_otel.core.sizes import format_bytes
from trt_otel.views.report.model import (
    BuildReport,
    anomaly_total,
    counted,
    forecast_text,
    outcome_text,
    record_items,
    seconds_text,
)
from trt_otel.views.terminal import printable

_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~])")
_ICON = {"success": "✅", "failure": "❌", "cancellation": "⏹️", "timeout": "⏱️"}


def md(text: object) -> str:
    """Journal text as inert markdown: one line, every markdown and HTML character escaped, and
    every control character written as an escape (the report is printed to a terminal)."""
    one_line = printable(" ".join(str(text).split()))
    entities = one_line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", entities)


def render_markdown(reports: Sequence[BuildReport], title: str) -> str:
    out = [f"## {md(title)}", ""]
    if not reports:
        out.append("No build in this journal.")
    for report in reports:
        out.extend(_build(report, len(reports)))
    return "\n".join(out).rstrip() + "\n"


def headline(report: BuildReport) -> str:
    """One line: the outcome, its time, and what stands out."""
    outcome = outcome_text(report)
    parts = [
        f"{_ICON.get(outcome, '❔')} **{outcome}** in {seconds_text(report.duration_s)}",
        counted(report.steps, "step"),
        counted(report.phases, "phase"),
    ]
    if report.silences:
        parts.append(f"silent {seconds_text(report.silent_s)}")
    if report.anomalies:
        parts.append(f"{anomaly_total(report):,} protocol anomalies")
    forecast = forecast_text(report)
    if forecast is not None:
        parts.append(f"forecast: {md(forecast)}")
    return ", ".join(parts)


def _build(report: BuildReport, builds: int) -> list[str]:
    name = f"### Build {report.index + 1} of {builds}" if builds > 1 else "### Build"
    backend = report.attributes.get("trt.backend", "")
    version = report.attributes.get("trt.version", "")
    model = report.attributes.get("model.path", "")
    library = " ".join(md(part) for part in (backend, version) if part)
    title = f"{name}: {md(model)}" + (f" ({library})" if library else "")
    out = [title, "", headline(report), ""]
    if report.cancel is not None:
        cancel = report.cancel
        out += [
            f"> Cancelled by **{md(cancel.source)}** at {seconds_text(cancel.at_s)}: "
            f"{md(cancel.reason)}"
            + (
                f"; stopped {seconds_text(cancel.stopped_after_s)} later"
                if cancel.stopped_after_s is not None
                else ""
            ),
            "",
        ]
    if report.detail:
        out += [f"> Ended: {md(report.detail)}", ""]
    if report.builder_error:
        out += [f"> Builder error: {md(report.builder_error)}", ""]
    out += _top(report)
    if report.silences:
        out += ["**Silent windows** (no callback from TensorRT):", ""]
        for silence in report.silences:
            out.append(
                f"- {seconds_text(silence.length_s)} from {seconds_text(silence.start_s)}, "
                f"{md(silence.where)}"
            )
        out.append("")
    out += _record(report)
    if report.anomalies:
        counts = ", ".join(f"{md(kind)} ×{count}" for kind, count in report.anomalies.items())
        out += [f"**Protocol anomalies**: {counts}", ""]
    return out


def _top(report: BuildReport) -> list[str]:
    if not report.rows:
        return ["No phase was reported.", ""]
    build = report.duration_s or 1.0
    out = [
        "| phase | count | self | total | share | silent | steps | peak memory |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in report.top_rows():
        silent = f"{row.silent_s / row.total_s:.0%}" if row.total_s > 0 else "-"
        peak = format_bytes(row.peak_rss_bytes) if row.peak_rss_bytes is not None else "-"
        out.append(
            f"| {md(row.label)} | {row.count:,} | {seconds_text(row.self_s)} | "
            f"{seconds_text(row.total_s)} | {row.self_s / build:.0%} | {silent} | "
            f"{row.steps:,} | {peak} |"
        )
    return [*out, ""]


def _record(report: BuildReport) -> list[str]:
    items = record_items(report)
    if not items:
        return []
    out = ["<details><summary>Build record</summary>", "", "| attribute | value |", "|---|---|"]
    out += [f"| {md(key)} | {md(value)} |" for key, value in items]
    return [*out, "", "</details>", ""]
