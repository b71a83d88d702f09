"""What reaches the operator's terminal: a reader that goes away (`| head`) changes neither the
outcome nor the cleanup, and text from outside is escaped on display but kept in the journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from trt_otel.views.terminal import printable

CLI = [sys.executable, "-m", "trt_otel.app.cli"]


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
        url = None
        while url is None:
            line = process.stderr.readline()
            assert line, "the build ended before serving HTTP"
            if line.startswith("http: "):
                url = line.split()[1].removesuffix("/status")
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
