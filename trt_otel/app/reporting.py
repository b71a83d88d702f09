"""``trt-otel report``: finished builds explained, from their journals, in one of three formats;
and the markdown summary a CI job shows (``$GITHUB_STEP_SUMMARY``) when a build command ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trt_otel.app.config import SessionConfig, UsageError
from trt_otel.builder.preflight import (
    PreflightError,
    check_distinct,
    check_writable_file,
    same_file,
)
from trt_otel.capture.checked import read_journal
from trt_otel.core.events import Event
from trt_otel.core.files import FileKindError, regular_file_or_absent, write_atomically
from trt_otel.core.journal_codec import JournalError
from trt_otel.views.terminal import PipeSafeStream, say, warn

if TYPE_CHECKING:
    from trt_otel.views.report.model import BuildReport

# The reports (trt_otel.views.report) are imported where one is made: a build that writes no
# report does not pay for them.

FORMATS = ("html", "markdown", "chrome-trace")


@dataclass(frozen=True, slots=True)
class ReportCommand:
    """``trt-otel report JOURNAL... [-o FILE] [--format ...]``."""

    journals: tuple[Path, ...]
    output: Path | None = None
    """None: standard output."""
    format: str = "html"


def check_output(path: Path | None, what: str = "-o", inputs: Sequence[Path] = ()) -> None:
    """A file the report may replace: absent or a regular file, none of its ``inputs`` (the
    journals it is made from, by their real paths), in a directory that exists and takes a new
    file."""
    if path is None:
        return
    try:
        regular_file_or_absent(path, what)
    except FileKindError as error:
        raise UsageError(str(error)) from None
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what} {path}: no directory {parent}")
    try:
        check_distinct(inputs=[("journal", journal) for journal in inputs], outputs=[(what, path)])
        check_writable_file(path, what)
    except PreflightError as error:
        raise UsageError(str(error)) from None


def build_reports(journals: Sequence[Path], *, quiet: bool = False) -> list[BuildReport]:
    """Every build of the journals, in order, numbered across them. Problems in a journal
    (a torn line, a gap) are said on stderr unless ``quiet``; an unreadable journal is a
    :class:`JournalError`."""
    events: list[list[Event]] = []
    for path in journals:
        journal = read_journal(path)
        for problem in () if quiet else journal.problems:
            say(f"{path}: {problem}", tagged=True)
        events.append(journal.events)
    from trt_otel.views.report.model import reports_of

    reports: list[BuildReport] = []
    for journal_events in events:
        for report in reports_of(journal_events):
            report.index = len(reports)
            reports.append(report)
    return reports


def render(reports: Sequence[BuildReport], form: str, title: str) -> str:
    if form == "markdown":
        from trt_otel.views.report.markdown import render_markdown

        return render_markdown(reports, title)
    if form == "chrome-trace":
        from trt_otel.views.report.chrome_trace import chrome_trace

        return json.dumps(chrome_trace(reports), separators=(",", ":")) + "\n"
    from trt_otel.views.report.html import render_html

    return render_html(reports, title)


def report(command: ReportCommand) -> int:
    check_output(command.output, inputs=command.journals)
    reports = build_reports(command.journals)
    title = ", ".join(path.name for path in command.journals)
    text = render(reports, command.format, f"TensorRT build: {title}")
    if command.output is None:
        PipeSafeStream(sys.stdout).write(text)
        return 0
    try:
        write_atomically(command.output, text.encode("utf-8"))
    except OSError as error:  # after the checks: a disk that filled, a folder swapped
        raise UsageError(
            f"-o {command.output}: cannot write it: {error.strerror or error}"
        ) from None
    say(f"report: {command.output} ({len(reports)} build{'s' if len(reports) != 1 else ''})")
    return 0


STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
MAX_SUMMARY_BYTES = 1024 * 1024
"""GitHub refuses a step summary over 1 MiB; a longer one is not written (and said)."""


@contextlib.contextmanager
def summarised(
    session: SessionConfig,
    wanted: bool = True,
    *,
    keep_journal: bool = False,
    files: Sequence[tuple[str, Path | None]] = (),
) -> Iterator[SessionConfig]:
    """Around a build command: when ``$GITHUB_STEP_SUMMARY`` is set (and ``wanted``), or
    ``keep_journal`` asks for one, the session it should run, with a journal (a kept one in
    the runner's temporary folder when none was asked for: the summary is made from it, and
    it stays for an artifact or a diff); once the command ends, however it ends, its report
    is appended to the summary, unless the summary is one of the run's ``files`` (the model,
    the engine, ...: named, for the warning) or its journal."""
    target = os.environ.get(STEP_SUMMARY) if wanted else None
    if not target and not keep_journal:
        yield session
        return
    journal = session.observe.journal
    if journal is None:
        journal = kept_journals_folder() / (
            f"trt-otel-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"
        )
        observe = dataclasses.replace(session.observe, journal=journal)
        session = dataclasses.replace(session, observe=observe)
    started = time.time()
    try:
        yield session
    finally:
        if target:
            run_files = [(name, path) for name, path in files if path is not None]
            append_step_summary(Path(target), journal, since=started, files=run_files)


def kept_journals_folder() -> Path:
    """Where a journal kept for the summary goes: ``$RUNNER_TEMP`` when it is a folder (no
    folder is made for it), else the system's temporary folder."""
    runner_temp = os.environ.get("RUNNER_TEMP")
    if runner_temp and os.path.isdir(runner_temp):
        return Path(runner_temp)
    if runner_temp:
        warn(f"RUNNER_TEMP {runner_temp} is not a folder; the journal is kept in "
             f"{tempfile.gettempdir()}")  # fmt: skip
    return Path(tempfile.gettempdir())


def append_step_summary(
    target: Path,
    journal: Path,
    *,
    since: float = 0.0,
    files: Sequence[tuple[str, Path]] = (),
) -> None:
    """Append the markdown report of the journal's builds to ``target``, if the journal was
    written ``since`` then (a usage error stops a command before it writes one, and a journal
    left by an earlier command is not this one's). A target that is the journal or one of the
    run's ``files`` (by its real path) is not written. A failure (a target that is not a
    regular file) is a warning: the build's outcome and exit code stand."""
    try:
        if not journal.is_file() or journal.stat().st_mtime < since - 1.0:
            return
    except OSError:
        return
    for name, path in (("journal", journal), *files):
        if same_file(target, path):
            warn(
                f"{STEP_SUMMARY} {target} is the build's {name}; no summary appended (it would "
                f"write markdown into the {name})"
            )
            return
    try:
        reports = build_reports([journal], quiet=True)
        text = render(reports, "markdown", f"TensorRT build: {journal.name}")
        data = text.encode("utf-8")
        if len(data) > MAX_SUMMARY_BYTES:
            warn(f"{STEP_SUMMARY}: the report is over 1 MiB, not appended")
            return
        regular_file_or_absent(target, STEP_SUMMARY)
        with open(target, "ab") as summary:
            summary.write(b"\n" + data)
    except (OSError, JournalError) as error:  # a summary never changes a build's outcome
        warn(f"{STEP_SUMMARY} not written: {error}")
