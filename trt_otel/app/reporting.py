"""``trt-otel report``: finished builds explained, from their journals, in one of three formats;
and the markdown summary a CI job shows (``$GITHUB_STEP_SUMMARY``) when a build command ends.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trt_otel.app.config import UsageError
from trt_otel.core.events import Event
from trt_otel.core.files import FileKindError, regular_file_or_absent, write_atomically
from trt_otel.core.journal import read_journal
from trt_otel.views.report.chrome_trace import chrome_trace
from trt_otel.views.report.html import render_html
from trt_otel.views.report.markdown import render_markdown
from trt_otel.views.report.model import BuildReport, reports_of
from trt_otel.views.terminal import PipeSafeStream, printable, say

FORMATS = ("html", "markdown", "chrome-trace")


@dataclass(frozen=True, slots=True)
class ReportCommand:
    """``trt-otel report JOURNAL... [-o FILE] [--format ...]``."""

    journals: tuple[Path, ...]
    output: Path | None = None
    """None: standard output."""
    format: str = "html"


def check_output(path: Path | None, what: str = "-o") -> None:
    """A file the report may replace: absent or a regular file, in a directory that exists."""
    if path is None:
        return
    try:
        regular_file_or_absent(path, what)
    except FileKindError as error:
        raise UsageError(str(error)) from None
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what} {path}: no directory {parent}")


def build_reports(journals: Sequence[Path]) -> list[BuildReport]:
    """Every build of the journals, in order, numbered across them. Problems in a journal
    (a torn line, a gap) are said on stderr; an unreadable journal is a usage error."""
    events: list[list[Event]] = []
    for path in journals:
        journal = read_journal(path)
        for problem in journal.problems:
            print(printable(f"trt-otel: {path}: {problem}"), file=sys.stderr)
        events.append(journal.events)
    reports: list[BuildReport] = []
    for journal_events in events:
        for report in reports_of(journal_events):
            report.index = len(reports)
            reports.append(report)
    return reports


def render(reports: Sequence[BuildReport], form: str, title: str) -> str:
    if form == "markdown":
        return render_markdown(reports, title)
    if form == "chrome-trace":
        return json.dumps(chrome_trace(reports), separators=(",", ":")) + "\n"
    return render_html(reports, title)


def report(command: ReportCommand) -> int:
    check_output(command.output)
    reports = build_reports(command.journals)
    title = ", ".join(path.name for path in command.journals)
    text = render(reports, command.format, f"TensorRT build: {title}")
    if command.output is None:
        PipeSafeStream(sys.stdout).write(text)
        return 0
    write_atomically(command.output, text.encode("utf-8"))
    say(f"report: {command.output} ({len(reports)} build{'s' if len(reports) != 1 else ''})")
    return 0


STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
MAX_SUMMARY_BYTES = 1024 * 1024
"""GitHub refuses a step summary over 1 MiB; a longer one is not written (and said)."""


def append_step_summary(journal: Path | None, events: Sequence[Event] | None = None) -> None:
    """Append the markdown report of the build(s) just run to ``$GITHUB_STEP_SUMMARY``, where
    that variable is set: from the journal, or from ``events`` when there is none. A failure is
    a warning: the build's outcome stands."""
    target = os.environ.get(STEP_SUMMARY)
    if not target:
        return
    try:
        if journal is not None:
            reports = build_reports([journal])
            title = journal.name
        else:
            reports, title = reports_of(events or ()), "build"
        text = render_markdown(reports, f"TensorRT build: {title}")
        data = text.encode("utf-8")
        if len(data) > MAX_SUMMARY_BYTES:
            say(f"trt-otel: {STEP_SUMMARY}: the summary is over 1 MiB, not written")
            return
        regular_file_or_absent(target, STEP_SUMMARY)
        with open(target, "ab") as summary:
            summary.write(data)
    except Exception as error:  # a summary never changes a build's outcome
        say(f"trt-otel: warning: {STEP_SUMMARY} not written: {error}")
