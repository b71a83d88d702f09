"""What reaches the operator's terminal: a reader that goes away (`| head`) changes neither the
outcome nor the cleanup, and text from outside is escaped on display but kept in the journal."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from cli import CLI
from trt_otel.views.terminal import MAX_SAID_CHARS, printable, say


@pytest.mark.e2e
def test_a_closed_output_pipe_changes_neither_the_outcome_nor_the_cleanup(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "4", "--http-port", "0",
         "--journal", str(tmp_path / "j.jsonl")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )  # fmt: skip
    assert process.stderr is not None
    try:
        head = [process.stderr.readline() for _ in range(5)]  # as `| head -5` does
        process.stderr.close()
        code = process.wait(timeout=120)
    finally:
        process.kill()
    assert len(head) == 5 and all(head)
    assert code == 0, "the build succeeded: the closed pipe must not change that"
    tokens = list(runtime.rglob("*.token"))
    assert tokens == [], f"the cancel token file was left behind: {tokens}"
    assert b'"outcome":"success"' in (tmp_path / "j.jsonl").read_bytes().replace(b" ", b"")


def test_control_characters_are_escaped_for_display() -> None:
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
    assert printable("stop\x1b[2J\nFAKE: build success\r") == (
        "stop\\x1b[2J\\nFAKE: build success\\r"
    )
    assert printable("tab\there\x07\u202e") == "tab\\there\\x07\\u202e"


def test_a_line_as_long_as_the_limit_is_said_whole_and_a_longer_one_is_cut(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say("x" * MAX_SAID_CHARS)
    assert capsys.readouterr().err == "x" * MAX_SAID_CHARS + "\n"
    say("x" * (MAX_SAID_CHARS + 5))
    assert capsys.readouterr().err == "x" * MAX_SAID_CHARS + "… (5 more characters)\n"


@pytest.mark.e2e
def test_a_cancel_reason_with_control_characters_is_escaped_on_screen_and_kept_in_the_journal(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.jsonl"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--http-port", "0", "--cancel-token", "t",
         "--journal", str(journal), "--silence", "60s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    reason = "stop\x1b[2J\x1b[H\nFAKE: build success"
    try:
        url, building = None, False
        while url is None or not building:  # cancelled once building: the 60 s silence
            line = process.stderr.readline()
            assert line, "the build ended before serving HTTP"
            if line.startswith("http: "):
                url = line.split()[1].removesuffix("/status")
            building = building or "▶ Building engine" in line
        request = urllib.request.Request(
            f"{url}/cancel",
            data=json.dumps({"reason": reason}).encode(),
            headers={"Authorization": "Bearer t", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status in (200, 202)
        rest = process.stderr.read()
        process.wait(timeout=120)
    finally:
        process.kill()
        process.stderr.close()
    assert process.returncode == 3, rest
    assert "\x1b" not in rest, "a raw ESC reached the terminal"
    assert "cancel requested by http: stop\\x1b[2J\\x1b[H\\nFAKE: build success" in rest
    cancel = next(
        json.loads(line) for line in journal.read_text().splitlines() if '"cancel"' in line
    )
    assert cancel["reason"] == reason, "the journal keeps it verbatim"


FORGED = "\x1b[2J\x1b[H\x1b[1;32m"
"""Clears the screen and turns the text green: what a crafted name would do to a terminal."""


def crafted_journal(path: Path) -> None:
    """A journal as an adversary would write it: names that clear the screen and forge lines."""
    name = f"Building engine{FORGED}\n[     9.9s] build success in 9.9s"
    records: list[dict[str, object]] = [
        {"format": "trt-otel-journal", "version": 1, "created_wall_ns": 1, "producer": "x"},
        {"type": "build_start", "build_id": f"b{FORGED}\nid", "attributes": {}},
        {"type": "phase_start", "name": name, "parent": None, "num_steps": 2},
        {"type": "phase_start", "name": f"inner{FORGED}\nFAKE", "parent": name, "num_steps": 1},
        {"type": "step", "name": f"inner{FORGED}\nFAKE", "step": 0},
        {"type": "phase_finish", "name": f"inner{FORGED}\nFAKE"},
        {"type": "step", "name": name, "step": 0},
        {"type": "phase_finish", "name": name},
        {"type": "build_end", "outcome": "failure", "detail": f"{FORGED}\nok", "error_type": None},
    ]
    for seq, record in enumerate(records[1:]):
        record.update(seq=seq, wall_ns=1_000 + seq, mono_ns=1_000_000_000 * (seq + 1), thread="T")
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


@pytest.mark.e2e
def test_a_crafted_journal_is_replayed_and_watched_escaped(tmp_path: Path) -> None:
    journal = tmp_path / "crafted.jsonl"
    crafted_journal(journal)
    for command in (["replay", str(journal)], ["watch", "--no-progress", str(journal)]):
        done = subprocess.run(
            [*CLI, *command], check=False, capture_output=True, text=True, timeout=60
        )
        shown = done.stdout + done.stderr
        assert done.returncode in (0, 4), shown  # replay: 0; watch mirrors the failure: 4
        assert "\x1b" not in shown, f"{command[0]}: a raw ESC reached the terminal"
        lines = shown.splitlines()
        assert not any(line.lstrip().startswith(("[     9.9s]", "FAKE", "ok")) for line in lines), (
            f"{command[0]}: a name forged a line: {shown}"
        )
        assert "Building engine\\x1b[2J\\x1b[H\\x1b[1;32m\\n[     9.9s] build success" in shown, (
            shown
        )
        assert "inner\\x1b[2J\\x1b[H\\x1b[1;32m\\nFAKE" in shown, shown


@pytest.mark.e2e
def test_paths_with_control_characters_are_escaped_on_their_lines(tmp_path: Path) -> None:
    """``journal:``, ``engine:`` and ``policy:`` lines show paths the user gave, which may hold
    anything a file name can (a newline, an ESC)."""
    odd = f"x{FORGED}\nFAKE: build success"
    folder = tmp_path / odd
    folder.mkdir()
    done = subprocess.run(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0",
         "--journal", str(folder / "j.jsonl"), "-o", str(folder / "model.engine"),
         "--cancel-file", str(folder / "stop")],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr, "a raw ESC reached the terminal"
    assert not any(line.startswith("FAKE") for line in done.stderr.splitlines()), done.stderr
    escaped = str(tmp_path / "x\\x1b[2J\\x1b[H\\x1b[1;32m\\nFAKE: build success")
    for label, name in [("journal", "j.jsonl"), ("engine", "model.engine"), ("policy", "stop")]:
        line = next((x for x in done.stderr.splitlines() if x.startswith(f"{label}: ")), "")
        assert f"{escaped}/{name}" in line, (label, done.stderr)
    assert (folder / "j.jsonl").is_file() and (folder / "model.engine").is_file()


@pytest.mark.e2e
def test_replay_escapes_the_journal_path_it_names(tmp_path: Path) -> None:
    """A journal's path is shown with what replay says of it (its problems, a missing file)."""
    folder = tmp_path / f"x{FORGED}\nFAKE: build success"
    folder.mkdir()
    journal = folder / "j.jsonl"
    crafted_journal(journal)
    with journal.open("a") as file:
        file.write("not json\n")  # a problem, said with the path
    missing = folder / "missing.jsonl"
    for path, code in [(journal, 4), (missing, 2)]:
        done = subprocess.run(
            [*CLI, "replay", str(path)], check=False, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == code, done.stderr
        assert "x\\x1b[2J\\x1b[H\\x1b[1;32m\\nFAKE: build success" in done.stderr, done.stderr
        assert "\x1b" not in done.stderr
        assert not any(line.startswith("FAKE") for line in done.stderr.splitlines())


@pytest.mark.e2e
def test_a_huge_phase_name_is_cut_on_the_operators_lines(tmp_path: Path) -> None:
    """A crafted journal whose open phase is named with a million characters: what replay says
    of it on stderr is cut, saying by how much, not echoed whole."""
    name = "N" * 1_000_000
    records: list[dict[str, object]] = [
        {"format": "trt-otel-journal", "version": 1, "created_wall_ns": 1, "producer": "x"},
        {"type": "build_start", "build_id": "b", "attributes": {}},
        {"type": "phase_start", "name": name, "parent": None, "num_steps": 2},
    ]
    for seq, record in enumerate(records[1:]):
        record.update(seq=seq, wall_ns=1_000 + seq, mono_ns=1_000_000_000 * (seq + 1), thread="T")
    journal = tmp_path / "huge.jsonl"
    journal.write_text("".join(json.dumps(record) + "\n" for record in records))
    done = subprocess.run(
        [*CLI, "replay", str(journal)], check=False, capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert name[:100] in done.stderr, "the name is shown, cut"
    assert len(done.stderr) < 20_000, f"{len(done.stderr):,} characters on stderr"
    assert "more characters)" in done.stderr
