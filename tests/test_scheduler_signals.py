"""How a scheduler stops a job: a signal to every process of it (SLURM's ``scancel``,
``kill -- -PGID``), and a warning before its time limit (SLURM's ``--signal=USR1@N``). Each is a
stop asked for, recorded as a cancel with its reason (exit 3), never a failure of the build and
never a death with no end in the journal. Real processes, real process groups, real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from cli import killed_at_exit, start_cli
from trt_otel import BuildMonitor, Outcome, read_journal
from trt_otel.builder.build import BuildJob, SimulatorSettings, run_build_job
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.capture.supervisor import IsolatedResult, run_isolated
from trt_otel.control.defaults import STOP_RESERVE_S
from trt_otel.control.signals import TIME_LIMIT_REASON, StopClock
from trt_otel.core.events import BuildFinished, CancelRequested
from waiting import wait_for_silence, wait_for_text

pytestmark = pytest.mark.e2e


def start_job(journal: Path, *options: str) -> subprocess.Popen[str]:
    """A demo in a process group of its own, as a scheduler's job step is."""
    return start_cli(
        "demo", "--no-progress", "--no-gpu", "--speed", "0", "--journal", journal, *options,
        start_new_session=True,
    )  # fmt: skip


def ended(process: subprocess.Popen[str]) -> tuple[int, str]:
    with killed_at_exit(process):
        _, err = process.communicate(timeout=60)
    return process.returncode, err


def stopped(journal: Path) -> tuple[CancelRequested, BuildFinished]:
    """The journal's cancel, and its end, which must be its last event."""
    events = read_journal(journal).events
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    end = events[-1]
    assert isinstance(end, BuildFinished), end
    return cancel, end


def test_sigterm_to_the_whole_process_group_in_a_silent_window_is_a_cancel(
    tmp_path: Path,
) -> None:
    """``scancel`` signals every process of the job, the build's worker too, which dies of it at
    once: a cancel with the signal's name, exit 3, not "the build's process died"."""
    journal = tmp_path / "scancelled.jsonl"
    process = start_job(journal, "--silence", "10m", "--grace", "10m", "--stop-budget", "10m")
    try:
        wait_for_silence(journal)
        os.killpg(process.pid, signal.SIGTERM)
    finally:
        code, err = ended(process)
    assert code == 3, err
    cancel, end = stopped(journal)
    assert (cancel.source, cancel.reason) == ("signal", "received SIGTERM")
    assert end.outcome is Outcome.CANCELLATION, end
    assert "the whole process group was signalled" in end.detail
    assert end.error_type is None
    assert "died" not in err


def test_a_time_limit_warning_to_the_job_stops_it_gracefully_as_a_timeout(
    tmp_path: Path,
) -> None:
    """SIGUSR1 to the whole group (the worker ignores it, as it does Ctrl-C): the build stops at
    TensorRT's next step, a timeout whose reason says the job's time limit is near."""
    journal = tmp_path / "time-limit.jsonl"
    process = start_job(journal, "--silence", "3s")
    try:
        wait_for_text(journal, b"Computing profile costs")  # where the silent window begins
        os.killpg(process.pid, signal.SIGUSR1)
    finally:
        code, err = ended(process)
    assert code == 3, err
    cancel, end = stopped(journal)
    assert (cancel.source, cancel.reason, cancel.timeout) == ("signal", TIME_LIMIT_REASON, True)
    assert end.outcome is Outcome.TIMEOUT, end
    assert "died" not in end.detail  # the worker lived to answer TensorRT's next step


SIGNALS_OF = re.compile(r"^(SigBlk|SigIgn):\s*([0-9a-f]+)$", re.MULTILINE)


def test_the_worker_never_dies_of_a_ctrl_c_to_the_group_while_it_starts() -> None:
    """From its first instruction the build's worker has Ctrl-C, SIGHUP and SIGUSR1 blocked (it
    inherits the supervisor's mask through its exec) and then ignored: a Ctrl-C to the whole
    group during its start-up (unpickling, importing) killed it with a traceback."""
    seen: list[dict[str, int]] = []

    def sample(pid: int) -> None:  # at once after the worker is started, while it starts up
        status = Path(f"/proc/{pid}/status").read_text()
        seen.append({name: int(mask, 16) for name, mask in SIGNALS_OF.findall(status)})

    job = BuildJob(
        model_path=Path("m.onnx"), model=demo_model_bytes(), simulator=SimulatorSettings(speed=0)
    )
    monitor = BuildMonitor()
    monitor.start()
    isolated = run_isolated(run_build_job, job, monitor=monitor, on_start=sample)
    assert isolated.returned, isolated
    (masks,) = seen
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        bit = 1 << (number - 1)
        assert (masks["SigBlk"] | masks["SigIgn"]) & bit, f"{number.name} would kill it"


def test_a_worker_killed_as_it_starts_never_leaves_the_supervisor_waiting() -> None:
    """SIGKILL of the worker the moment it exists, before it has read its job (a megabyte of
    model here, more than a pipe holds): the supervisor sees it die and says so. The job went
    through the pipe that starts the worker, whose writer blocked for ever on a dead reader."""
    job = BuildJob(model_path=Path("m.onnx"), model=os.urandom(1 << 20))
    ours = {child.pid for child in psutil.Process().children()}
    killed: list[int] = []

    def kill_the_worker_at_birth() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for child in psutil.Process().children():
                if child.pid not in ours:
                    os.kill(child.pid, signal.SIGKILL)
                    killed.append(child.pid)
                    break

    killer = threading.Thread(target=kill_the_worker_at_birth, daemon=True)
    killer.start()
    monitor = BuildMonitor()
    monitor.start()
    ended: list[IsolatedResult] = []
    supervisor = threading.Thread(
        target=lambda: ended.append(run_isolated(run_build_job, job, monitor=monitor)),
        daemon=True,
    )
    supervisor.start()
    supervisor.join(60)
    assert killed, "the worker was never seen"
    assert ended, "the supervisor still waits for a worker that is dead"
    assert ended[0].died == "killed by SIGKILL", ended[0]


def test_what_waits_for_a_last_reader_waits_only_within_the_stop_budget(tmp_path: Path) -> None:
    """A stop asked for by a signal fits its budget however long the lingers are: the scrape
    endpoint, scraped during the build, and the HTTP view, told to wait for a late client,
    each wait only for what the budget leaves (else the scheduler's kill lands mid-exit)."""
    journal = tmp_path / "lingering.jsonl"
    process = start_job(
        journal, "--silence", "10m", "--stop-budget", "6s",
        "--prometheus-port", "0", "--prometheus-linger", "10m",
        "--http-port", "0", "--http-linger", "10m",
    )  # fmt: skip
    said: list[str] = []
    try:
        assert process.stderr is not None
        while not any("/metrics" in line and line.startswith("metrics:") for line in said):
            line = process.stderr.readline()
            assert line, "".join(said)
            said.append(line)
        url = next(line.split()[1] for line in said if line.startswith("metrics:"))
        wait_for_silence(journal)
        with urllib.request.urlopen(url, timeout=10) as answer:  # a scrape, during the build
            assert b"trt_build_state" in answer.read()
        asked = time.monotonic()
        os.killpg(process.pid, signal.SIGTERM)
    finally:
        code, err = ended(process)
    took_s = time.monotonic() - asked
    assert code == 3, "".join(said) + err
    assert took_s < 6 + 4, f"the stop took {took_s:.1f}s against a 6s budget"
    cancel, end = stopped(journal)
    assert (cancel.source, end.outcome) == ("signal", Outcome.CANCELLATION)


def test_the_stop_budget_leaves_its_reserve_for_the_end() -> None:
    """What a linger may wait after a stop signal: the budget less the time since the signal
    and less the reserve for ending the journal and the process; all it wants before one."""
    clock = StopClock(10.0)
    assert clock.allows(100.0) == 100.0, "no signal yet: no budget applies"
    clock.asked_mono = time.monotonic() - 3.0
    assert clock.allows(100.0) == pytest.approx(10.0 - 3.0 - STOP_RESERVE_S, abs=0.05)
    assert clock.allows(2.0) == 2.0
    clock.asked_mono = time.monotonic() - 9.5
    assert clock.allows(100.0) == 0.0
    first = clock.asked_mono
    clock.asked()  # a second signal: the budget still counts from the first
    assert clock.asked_mono == first
