"""``trt-otel diff``: what changed between two builds, or between a build and the median of the
matching builds of a history folder; with ``--fail-if-slower PCT``, a CI gate (exit 5). ``build``
and ``demo`` take the same gate with ``--history``, after their build.
"""

from __future__ import annotations

import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trt_otel.app.config import UsageError
from trt_otel.app.reporting import build_reports
from trt_otel.core.journal_codec import JournalError

if TYPE_CHECKING:
    from trt_otel.views.report.diff import Figures
    from trt_otel.views.report.model import BuildReport

# The comparison (trt_otel.views.report) is imported where two builds are compared: a build
# without --fail-if-slower does not pay for it.
from trt_otel.views.terminal import PipeSafeStream, printable, say

EXIT_SLOWER = 5
"""The candidate is slower than the baseline by more than ``--fail-if-slower`` allows."""
MAX_HISTORY_JOURNALS = 200
"""The newest journals of a history folder that are read (a nightly folder grows forever)."""


@dataclass(frozen=True, slots=True)
class DiffCommand:
    """``trt-otel diff BASELINE CANDIDATE`` or ``trt-otel diff --history DIR CANDIDATE``."""

    candidate: Path
    baseline: Path | None = None
    history: Path | None = None
    fail_if_slower: float | None = None


def diff_command(command: DiffCommand) -> int:
    from trt_otel.views.report.diff import diff, figures_of, render_diff

    candidate = last_build(command.candidate)
    if command.history is not None:
        baseline = history_baseline(command.history, candidate, exclude=command.candidate)
        if baseline is None:
            raise UsageError(
                f"--history {command.history}: no earlier successful build matches "
                f"{command.candidate} ({_matched_by(candidate)})"
            )
    else:
        assert command.baseline is not None
        baseline = figures_of(last_build(command.baseline), str(command.baseline))
    result = diff(baseline, figures_of(candidate, str(command.candidate)))
    PipeSafeStream(sys.stdout).write(printable_lines(render_diff(result)))
    if command.fail_if_slower is not None and result.slower_than(command.fail_if_slower):
        say(f"trt-otel: slower than the baseline by more than {command.fail_if_slower:g}%")
        return EXIT_SLOWER
    return 0


def printable_lines(text: str) -> str:
    """Every line with its control characters escaped: names come from journals."""
    return "".join(printable(line) + "\n" for line in text.splitlines())


def last_build(journal: Path) -> BuildReport:
    reports = build_reports([journal])
    if not reports:
        raise UsageError(f"{journal}: no build in this journal")
    return reports[-1]


def _matched_by(candidate: BuildReport) -> str:
    fingerprint = candidate.attributes.get("fingerprint")
    if fingerprint:
        return f"by fingerprint {fingerprint}"
    return f"by model {candidate.attributes.get('model.sha256', '(unknown)')[:16]}"


def matches(build: BuildReport, candidate: BuildReport) -> bool:
    """A build of the same thing: the same ``fingerprint`` where both have one, else the same
    model and backend."""
    mine, theirs = candidate.attributes, build.attributes
    if mine.get("fingerprint") and theirs.get("fingerprint"):
        return mine["fingerprint"] == theirs["fingerprint"]
    keys = ("model.sha256", "trt.backend")
    return all(mine.get(k) is not None and mine.get(k) == theirs.get(k) for k in keys)


def history_baseline(
    folder: Path, candidate: BuildReport, *, exclude: Path | None = None
) -> Figures | None:
    """The median of the successful builds in ``folder``'s journals that match ``candidate``
    (not the candidate itself), or None when none does."""
    from trt_otel.views.report.diff import figures_of, median_of

    if not folder.is_dir():
        raise UsageError(f"--history {folder} is not a directory of journals")
    matching: list[tuple[int, Figures]] = []
    for path in history_journals(folder, exclude):
        try:
            reports = build_reports([path], quiet=True)
        except JournalError:
            continue  # not a journal, or unreadable: not history
        for build in reports:
            if (
                build.outcome is not None
                and build.outcome.value == "success"
                and build.build_id != candidate.build_id
                and matches(build, candidate)
            ):
                matching.append((build.start_wall_ns, figures_of(build, str(path))))
    if not matching:
        return None
    matching.sort(key=lambda item: item[0])
    builds = [figures for _, figures in matching]
    label = f"median of {len(builds)} matching builds in {folder}"
    return median_of(builds, label)


def history_journals(folder: Path, exclude: Path | None = None) -> list[Path]:
    """The folder's regular ``*.jsonl`` files, newest first, at most
    :data:`MAX_HISTORY_JOURNALS`."""
    skip = exclude.resolve() if exclude is not None else None
    found: list[tuple[float, Path]] = []
    for path in folder.glob("*.jsonl"):
        try:
            info = path.stat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or path.resolve() == skip:
            continue  # a directory, a pipe, a device: never opened
        found.append((info.st_mtime, path))
    found.sort(reverse=True)
    return [path for _, path in found[:MAX_HISTORY_JOURNALS]]


def gate(journal: Path | None, history: Path | None, percent: float) -> int:
    """After a successful build: compare it with the median of its matching history; exit
    :data:`EXIT_SLOWER` when it is slower by more than ``percent``. No matching history (the
    first build of a model) passes, and says so."""
    from trt_otel.views.report.diff import diff, figures_of, render_diff

    if journal is None or history is None:
        return 0
    candidate = last_build(journal)
    baseline = history_baseline(history, candidate, exclude=journal)
    if baseline is None:
        say(f"trt-otel: --fail-if-slower: no earlier build in {history} to compare with; passed")
        return 0
    result = diff(baseline, figures_of(candidate, str(journal)))
    sys.stderr.write(printable_lines(render_diff(result)))
    if result.slower_than(percent):
        say(f"trt-otel: slower than the history's median by more than {percent:g}%")
        return EXIT_SLOWER
    return 0
