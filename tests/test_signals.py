"""SIGTERM means "cancel" every time (exit 3): a second one stops the build at once, and is
still a cancel, not the user's interrupt (130). Real processes and signals."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from cli import CLI, killed_at_exit
from runs import residual_net, start_run
from trt_otel import Outcome, read_journal
from trt_otel.core.events import BuildFinished
from waiting import wait_for_journal, wait_for_silence, wait_for_text

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_a_second_sigterm_stops_at_once_and_is_still_a_cancel(
    tmp_path: Path, in_process: bool
) -> None:
    journal = tmp_path / "term.jsonl"
    extra = ["--in-process"] if in_process else []
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0", "--silence", "10m",
         "--grace", "10m", "--stop-budget", "10m", "--journal", str(journal), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_silence(journal)  # the first SIGTERM's cancel waits there for a next step
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


def test_sighup_cancels_a_build_as_sigterm_does_and_its_journal_ends(tmp_path: Path) -> None:
    """A hangup (the terminal or SSH session gone) is a request to stop, not a kill: the build
    is cancelled, stopped after the grace period if TensorRT is silent, and its journal ends."""
    journal = tmp_path / "hup.jsonl"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0", "--silence", "10m",
         "--grace", "1s", "--journal", str(journal)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_text(journal, b"Computing profile costs")
        process.send_signal(signal.SIGHUP)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3, err
    assert "SIGHUP: cancelling at TensorRT's next step" in err
    events = read_journal(journal).events
    end = events[-1]
    assert isinstance(end, BuildFinished), end
    assert end.outcome is Outcome.CANCELLATION
    assert end.detail.startswith("received SIGHUP; TensorRT had not stopped 1.0s later")


def test_sighup_to_run_cancels_the_program_s_build_as_sigterm_does(tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install -e '.[dev]')")

    model = residual_net(1000, tmp_path)
    process, journal = start_run(tmp_path, str(model), options=("--grace", "1s"))
    with killed_at_exit(process):
        wait_for_journal(journal, process, "phase_start", "Determining refit engines")
        process.send_signal(signal.SIGHUP)  # to trt-otel alone: the program is its own job
        _, err = process.communicate(timeout=120)
    assert process.returncode == 3, err
    assert "SIGHUP: cancelling the builds" in err
    events = read_journal(journal).events
    end = events[-1]
    assert isinstance(end, BuildFinished), end
    assert end.outcome is Outcome.CANCELLATION
    assert "received SIGHUP" in end.detail
