"""``trt-otel replay`` of a journal with several builds (``trt-otel run`` and retries write one
build after another into one journal): every build is shown, each its tree on stdout in order,
and the exit code is the worst build's, as ``watch`` gives it (0, 3, 4). Real recorded
journals, replayed by the real command."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli import run_cli
from journals import DATA

pytestmark = pytest.mark.e2e

RECORDED = {
    "success": "rtx-conv8-success.jsonl",
    "cancellation": "rtx-residual400-cancelled.jsonl",
    "failure": "rtx-parser-failure.jsonl",
}


def several_builds(path: Path, *outcomes: str) -> Path:
    """One journal of the recorded builds, one after another, with one ``seq`` through them
    all (as one writer numbers them)."""
    lines = [(DATA / RECORDED[outcomes[0]]).read_text().splitlines()[0]]
    seq = 0
    for outcome in outcomes:
        for line in (DATA / RECORDED[outcome]).read_text().splitlines()[1:]:
            event = json.loads(line)
            event["seq"] = seq
            seq += 1
            lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n")
    return path


def replay(journal: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("replay", journal, timeout=120)


@pytest.mark.parametrize(
    ("outcomes", "code"),
    [
        (("failure", "cancellation", "success"), 4),
        (("cancellation", "success"), 3),
        (("success", "failure", "success"), 4),
        (("success", "success"), 0),
    ],
)
def test_every_build_is_shown_in_order_and_the_worst_decides_the_exit_code(
    tmp_path: Path, outcomes: tuple[str, ...], code: int
) -> None:
    result = replay(several_builds(tmp_path / "builds.jsonl", *outcomes))
    assert result.returncode == code, result.stderr
    headers = [
        word
        for line in result.stdout.splitlines()
        for word in ("success", "cancellation", "failure")
        if line.startswith(f"build {word}")
    ]
    assert headers == list(outcomes), result.stdout
    assert "Traceback" not in result.stderr


def test_a_build_cut_short_by_the_next_says_so_and_counts_as_failed(tmp_path: Path) -> None:
    journal = several_builds(tmp_path / "retried.jsonl", "success", "success")
    lines = journal.read_text().splitlines()
    first_end = next(i for i, line in enumerate(lines) if '"build_end"' in line)
    del lines[first_end]  # the first build's writer died; a retry started the second
    journal.write_text("\n".join(lines) + "\n")
    result = replay(journal)
    assert result.returncode == 4, result.stderr
    assert "build 1 of 2: the build never ended" in result.stderr
    assert "the next build starts there" in result.stderr
    assert "build never ended" in result.stdout and "build success" in result.stdout


def test_a_journal_without_a_build_is_an_error_not_a_success(tmp_path: Path) -> None:
    journal = tmp_path / "header.jsonl"
    journal.write_text((DATA / RECORDED["success"]).read_text().splitlines()[0] + "\n")
    result = replay(journal)
    assert result.returncode == 2
    assert "no build in this journal (its header alone)" in result.stderr
    assert "Traceback" not in result.stderr
