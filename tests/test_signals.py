"""SIGTERM means "cancel" every time (exit 3): a second one stops the build at once, and is
still a cancel, not the user's interrupt (130). Real processes and signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trt_otel import Outcome, read_journal
from trt_otel.core.events import BuildFinished
from waiting import wait_for_text

CLI = [sys.executable, "-m", "trt_otel.app.cli"]


@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_a_second_sigterm_stops_at_once_and_is_still_a_cancel(
    tmp_path: Path, in_process: bool
) -> None:
    journal = tmp_path / "term.jsonl"
    extra = ["--in-process"] if in_process else []
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0", "--silence", "10m",
         "--grace", "10m", "--journal", str(journal), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_text(journal, b"Computing profile costs")
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        wait_for_text(journal, b'"received SIGTERM"')
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 3, err
    assert "interrupted by the user" not in err
    end = next(e for e in read_journal(journal).events if isinstance(e, BuildFinished))
    assert end.outcome is Outcome.CANCELLATION
    assert end.detail.startswith("received SIGTERM again")
