"""``trt-otel run -- COMMAND``: real programs, the real TensorRT-RTX builder, real signals.

The programs in ``tests/programs`` are ordinary build scripts that never import trt_otel; the
models are generated here. Each test runs the whole command in a process of its own and reads
what a user would: the exit code, the program's own output, trt-otel's lines and the journal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cli import CLI, killed_at_exit, run_cli, start_cli
from rtx_builds import HELD_BLOCKS, held_in_silent_step
from runs import PROGRAMS, PYTHON, builds_in, residual_net, start_of, start_run
from trt_otel import ProcessSample, read_journal
from trt_otel.control.signals import TIME_LIMIT_REASON
from trt_otel.core.events import BuildFinished, BuildStarted, CancelRequested, Event, PhaseStarted
from waiting import wait_for_file, wait_for_journal

trt = pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install -e '.[dev]')")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RTX_PHASES = [
    "Building engine",
    "Cloning network graph",
    "Preparing graph for optimization",
    "Building engine from subgraph",
    "Optimizing graph",
    "Computing profile costs",
]
"""The phases every TensorRT-RTX 1.7 build starts with, in order."""


def run(
    tmp_path: Path, program: str, *args: str, options: tuple[str, ...] = (), timeout: float = 300
) -> tuple[subprocess.CompletedProcess[str], list[Event]]:
    """``trt-otel run OPTIONS -- python PROGRAM ARGS`` to its end, its journal in ``tmp_path``;
    what it did and what the journal holds."""
    journal = tmp_path / "run.jsonl"
    result = run_cli(
        "run", "--journal", journal, *options, "--", PYTHON, PROGRAMS / program, *args,
        timeout=timeout,
    )  # fmt: skip
    events = read_journal(journal).events if journal.exists() else []
    return result, events


def ends(build: list[Event]) -> BuildFinished:
    last = build[-1]
    assert isinstance(last, BuildFinished), f"the build has no end: {last}"
    return last


def test_a_plain_build_is_observed_and_the_programs_output_is_untouched(
    mnist: Path, tmp_path: Path
) -> None:
    alone = subprocess.run(
        [PYTHON, str(PROGRAMS / "plain_build.py"), str(mnist)],
        capture_output=True,
        text=True,
        check=False,
    )
    result, events = run(tmp_path, "plain_build.py", str(mnist))
    assert result.returncode == 0, result.stderr
    assert result.stdout == alone.stdout
    assert "to stderr\n" in result.stderr.splitlines(keepends=True)
    (build,) = builds_in(events)
    attributes = start_of(build).attributes
    assert attributes["network.name"] == "net1"
    assert attributes["network.layers"] == 22
    assert attributes["network.inputs"] == ["input: FLOAT[-1,1,28,28]"]
    assert attributes["trt.backend"] == "tensorrt-rtx"
    assert attributes["trt.version"] == trt.__version__
    assert ends(build).outcome == "success"
    names = [e.name for e in build if isinstance(e, PhaseStarted)]
    assert names[: len(RTX_PHASES)] == RTX_PHASES
    assert "1 build: 1 success; the program ended: exit code 0" in result.stderr


def test_the_programs_own_monitor_gets_every_callback_the_journal_has(
    mnist: Path, tmp_path: Path
) -> None:
    counts_file = tmp_path / "counts.json"
    result, events = run(tmp_path, "own_monitor.py", str(mnist), str(counts_file))
    assert result.returncode == 0, result.stderr
    counts = json.loads(counts_file.read_text())
    journal = Counter(e.type for e in events)
    assert counts["engine"] is True
    assert counts["step"] > 0
    assert (counts["phase_start"], counts["step"], counts["phase_finish"]) == (
        journal["phase_start"],
        journal["step"],
        journal["phase_finish"],
    )


def test_the_programs_own_false_still_cancels_and_is_not_trt_otels_cancel(
    mnist: Path, tmp_path: Path
) -> None:
    counts_file = tmp_path / "counts.json"
    result, events = run(tmp_path, "own_monitor.py", str(mnist), str(counts_file), "5")
    assert result.returncode == 0, result.stderr  # the program's own exit code: not ours
    assert "result: None" in result.stdout
    (build,) = builds_in(events)
    cancels = [e for e in build if isinstance(e, CancelRequested)]
    assert [c.source for c in cancels] == ["program"]
    assert "answered False" in cancels[0].reason
    assert ends(build).outcome == "cancellation"
    steps = [e for e in build if e.type == "step"]
    assert len(steps) == 5, "TensorRT stopped at the step the program's monitor refused"


@pytest.mark.parametrize(("answer", "cancels"), [("None", True), ("0", True), ("1", False)])
def test_the_programs_own_non_bool_answer_means_what_it_means_without_trt_otel(
    mnist: Path, tmp_path: Path, answer: str, cancels: bool
) -> None:
    counts_file = tmp_path / "counts.json"
    result, events = run(tmp_path, "own_monitor.py", str(mnist), str(counts_file), "5", answer)
    assert result.returncode == 0, result.stderr
    (build,) = builds_in(events)
    cancels_seen = [e for e in build if isinstance(e, CancelRequested)]
    if cancels:
        assert "result: None" in result.stdout
        assert [c.reason for c in cancels_seen] == [
            f"the program's own progress monitor answered {answer}"
        ]
        assert ends(build).outcome == "cancellation"
    else:
        assert "result: engine" in result.stdout
        assert cancels_seen == []
        assert ends(build).outcome == "success"


def test_three_builds_in_a_row_are_three_builds_of_one_journal(mnist: Path, tmp_path: Path) -> None:
    small = residual_net(3, tmp_path)
    result, events = run(tmp_path, "plain_build.py", str(mnist), str(small), str(mnist))
    assert result.returncode == 0, result.stderr
    assert read_journal(tmp_path / "run.jsonl").problems == []
    builds = builds_in(events)
    assert [start_of(b).attributes["network.name"] for b in builds] == ["net1", "net2", "net3"]
    assert [start_of(b).attributes["run.build_index"] for b in builds] == [1, 2, 3]
    assert len({start_of(b).build_id for b in builds}) == 3
    assert [start_of(b).attributes["network.layers"] for b in builds] == [22, 3 * 3 + 1, 22]
    for build in builds:
        assert ends(build).outcome == "success"
        names = [e.name for e in build if isinstance(e, PhaseStarted)]
        assert names[: len(RTX_PHASES)] == RTX_PHASES
        assert sum(isinstance(e, BuildStarted | BuildFinished) for e in build) == 2
    # The program's process is sampled while it builds (never after a build's end: each build's
    # last event is its end), and the samples name it.
    samples = [(b, e) for b in builds for e in b if isinstance(e, ProcessSample)]
    assert samples, "the process that builds is sampled"
    assert all(e.pid == start_of(b).attributes["program.pid"] for b, e in samples)
    assert "3 builds: 3 success" in result.stderr
    # Each build's summary line counts that build's phases, not the run's so far.
    assert result.stderr.count(" steps, 12 phases)") == 3


def test_builds_made_at_once_are_recorded_one_after_the_other(tmp_path: Path) -> None:
    first, second = residual_net(150, tmp_path), residual_net(151, tmp_path)
    result, events = run(tmp_path, "two_threads.py", str(first), str(second))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "thread1: engine thread2: engine\n"
    builds = builds_in(events)
    assert sorted(start_of(b).attributes["network.name"] for b in builds) == ["thread1", "thread2"]
    for build in builds:
        assert ends(build).outcome == "success"
        assert [e for e in build if e.type == "anomaly"] == [], "each build's events are its own"
        names = [e.name for e in build if isinstance(e, PhaseStarted)]
        assert names[: len(RTX_PHASES)] == RTX_PHASES
    assert read_journal(tmp_path / "run.jsonl").problems == []


def test_a_timeout_cancels_the_build_the_program_sees_none_and_the_run_exits_3(
    tmp_path: Path,
) -> None:
    # The cancel lands in the build's silent step; TensorRT honours it at the step's end.
    model = residual_net(400, tmp_path)
    result, events = run(
        tmp_path, "plain_build.py", str(model), options=("--timeout", "0.3s", "--grace", "10m")
    )
    assert result.returncode == 3, result.stderr
    assert "result 1: None" in result.stdout
    (build,) = builds_in(events)
    assert ends(build).outcome == "timeout"
    assert "SIGTERM" not in ends(build).detail


def test_a_cancel_in_the_silent_window_terminates_the_program_within_the_grace_period(
    tmp_path: Path,
) -> None:
    model = residual_net(1000, tmp_path)
    cancel_file = tmp_path / "cancel"
    options = ("--cancel-file", str(cancel_file), "--grace", "1s")
    process, journal = start_run(tmp_path, str(model), options=options)
    with killed_at_exit(process):
        wait_for_journal(journal, process, "phase_start", "Determining refit engines")
        cancel_file.write_text("stop now\n")  # TensorRT is inside its silent step
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 3, stderr
    assert "result 1" not in stdout, "the program was stopped before its build returned"
    (build,) = builds_in(read_journal(journal).events)
    (cancel,) = [e for e in build if isinstance(e, CancelRequested)]
    end = ends(build)
    assert end.outcome == "cancellation"
    assert "stop now" in end.detail
    assert "stopped with SIGTERM" in end.detail
    assert (end.mono_ns - cancel.mono_ns) / 1e9 < 1.0 + 3.0  # grace, and a loaded machine
    # The run's last line says trt-otel stopped the program, and why: not that it was killed.
    assert "the program ended: stopped with SIGTERM (" in stderr, stderr


def test_a_script_that_raises_after_its_build_exits_with_its_own_code(
    mnist: Path, tmp_path: Path
) -> None:
    result, events = run(tmp_path, "crash.py", "raise", str(mnist))
    assert result.returncode == 1, result.stderr
    # All that was written, if it is not there (once, on a loaded machine, the program's
    # traceback was missing from it, and pytest's shortened repr hid what was said instead).
    assert "RuntimeError: the script failed after its build" in result.stderr, result.stderr
    (build,) = builds_in(events)
    assert ends(build).outcome == "success"


def test_a_program_killed_by_a_signal_mid_build_exits_4_and_the_build_says_how(
    mnist: Path, tmp_path: Path
) -> None:
    result, events = run(tmp_path, "crash.py", "segfault", str(mnist))
    assert result.returncode == 4, result.stderr
    assert "killed by SIGSEGV" in result.stderr
    (build,) = builds_in(events)
    end = ends(build)
    assert end.outcome == "failure"
    assert end.error_type == "SIGSEGV"
    assert "killed by SIGSEGV" in end.detail


def test_sys_exit_7_exits_7(mnist: Path, tmp_path: Path) -> None:
    result, events = run(tmp_path, "crash.py", "exit7", str(mnist))
    assert result.returncode == 7, result.stderr
    assert len(builds_in(events)) == 1


def test_a_program_that_makes_no_build_passes_through_with_one_line_saying_so(
    mnist: Path, tmp_path: Path
) -> None:
    result, events = run(tmp_path, "crash.py", "exit7-no-build", str(mnist))
    assert result.returncode == 7
    assert events == []
    assert "the program made no TensorRT build" in result.stderr


def test_a_run_names_its_journal_at_its_end_and_none_without_one(tmp_path: Path) -> None:
    """Where the run's journal is, among its last lines (to replay or watch it from); a run
    without a journal names none."""
    journal = tmp_path / "run.jsonl"
    with_journal = run_cli("run", "--journal", journal, "--", PYTHON, "-c", "pass", timeout=120)
    without = run_cli("run", "--", PYTHON, "-c", "pass", timeout=120)
    assert with_journal.returncode == 0, with_journal.stderr
    assert without.returncode == 0, without.stderr
    assert f"journal: {journal}" in with_journal.stderr
    assert "journal:" not in without.stderr


def test_ctrl_c_cancels_the_build_and_exits_130(tmp_path: Path) -> None:
    model = residual_net(400, tmp_path)
    # A grace and a stop budget long enough for the program's build to reach its next step on a
    # loaded machine: a signal's grace is the smaller of the two, and within the default's 30 s
    # a loaded machine's build was once still in TensorRT's silent window, so the program was
    # ended by SIGTERM before it saw its KeyboardInterrupt.
    process, journal = start_run(
        tmp_path, str(model), options=("--grace", "2m", "--stop-budget", "3m")
    )
    with killed_at_exit(process):
        wait_for_journal(journal, process, "build_start")
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 130, stderr
    assert "result 1" not in stdout, "the program ended on its interrupt"
    assert "KeyboardInterrupt" in stderr, "the program saw its interrupt"
    (build,) = builds_in(read_journal(journal).events)
    assert ends(build).outcome == "cancellation"
    assert {e.source for e in build if isinstance(e, CancelRequested)} == {"signal"}


def test_a_schedulers_time_limit_warning_stops_the_build_as_a_timeout_and_exits_3(
    tmp_path: Path,
) -> None:
    """SLURM's ``--signal=B:USR1@N`` warns the batch shell alone, which ``exec trt-otel run``
    makes trt-otel: the build is cancelled as a timeout with the warning's reason, and its
    journal ended, instead of trt-otel dying of the signal with no end in it."""
    model = residual_net(400, tmp_path)
    process, journal = start_run(
        tmp_path, str(model), options=("--grace", "2m", "--stop-budget", "3m")
    )
    with killed_at_exit(process):
        wait_for_journal(journal, process, "build_start")
        process.send_signal(signal.SIGUSR1)  # to trt-otel alone, as SLURM's B: warning
        _, stderr = process.communicate(timeout=240)
    assert process.returncode == 3, stderr
    assert "SIGUSR1 (the job's time limit is near): cancelling the builds" in stderr
    (build,) = builds_in(read_journal(journal).events)
    (cancel,) = [e for e in build if isinstance(e, CancelRequested)]
    assert (cancel.source, cancel.reason, cancel.timeout) == ("signal", TIME_LIMIT_REASON, True)
    assert ends(build).outcome == "timeout"


def test_ctrl_c_gives_a_silent_build_the_stop_budgets_grace_not_the_whole_grace(
    tmp_path: Path,
) -> None:
    """After Ctrl-C, as after SIGTERM, a build TensorRT does not stop gets what the stop budget
    leaves (5 s less the spans' 3 s flush and the 1 s reserve: 1 s), not --grace's ten minutes:
    held in its silent step, the program is stopped then, and the build's end says so."""
    model = residual_net(HELD_BLOCKS, tmp_path)
    process, journal = start_run(
        tmp_path, str(model), options=("--grace", "10m", "--stop-budget", "5s")
    )
    with killed_at_exit(process), held_in_silent_step(journal):
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "build 1: TensorRT has not stopped 1.0s after the cancel; stopping the program" in stderr
    (build,) = builds_in(read_journal(journal).events)
    end = ends(build)
    assert end.outcome == "cancellation"
    assert end.detail.startswith("interrupted by the user; TensorRT had not stopped 1.0s later")


def test_a_program_that_dies_of_sigint_exits_130_as_after_ctrl_c(tmp_path: Path) -> None:
    """A program killed by SIGINT (a Ctrl-C that reached it and not trt-otel, or its own) ends
    the run as an interrupt does, 130, not as a death by another signal (4)."""
    dies = (
        "import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.kill(os.getpid(), signal.SIGINT)"
    )
    result = run_cli("run", "--", PYTHON, "-c", dies, timeout=120)
    assert result.returncode == 130, result.stderr
    assert "the program ended: killed by SIGINT" in result.stderr


def test_a_command_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CLI, "run", "--", "no-such-program-here"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "no-such-program-here" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_programs_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.OWN_SITE = 'ran'\n")
    env = {**os.environ, "PYTHONPATH": str(own)}
    program = "import builtins; print('own sitecustomize:', getattr(builtins, 'OWN_SITE', None))"
    result = subprocess.run(
        [*CLI, "run", "--", PYTHON, "-c", program],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "own sitecustomize: ran\n"


def test_polygraphy_builds_are_observed(mnist: Path, tmp_path: Path) -> None:
    """NVIDIA's own Polygraphy, a console script that knows nothing of trt-otel."""
    polygraphy = Path(sys.executable).parent / "polygraphy"
    if not polygraphy.exists():
        pytest.skip("polygraphy is not installed (pip install -e '.[dev]')")
    engine, journal = tmp_path / "mnist.engine", tmp_path / "run.jsonl"
    result = subprocess.run(
        [*CLI, "run", "--journal", str(journal), "--timeout", "10m", "--",
         str(polygraphy), "convert", str(mnist), "-o", str(engine),
         "--trt-min-shapes", "input:[1,1,28,28]", "--trt-opt-shapes", "input:[4,1,28,28]",
         "--trt-max-shapes", "input:[8,1,28,28]"],
        capture_output=True,
        text=True,
        env={**os.environ, "POLYGRAPHY_USE_TENSORRT_RTX": "1"},
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert engine.stat().st_size > 0
    (build,) = builds_in(read_journal(journal).events)
    assert start_of(build).attributes["trt.backend"] == "tensorrt-rtx"
    assert start_of(build).attributes["network.inputs"] == ["input: FLOAT[-1,1,28,28]"]
    assert ends(build).outcome == "success"
    assert "Finished engine building" in result.stdout  # Polygraphy's own log, untouched


def test_sigterm_before_any_build_stops_the_program_after_its_grace_and_exits_3(
    tmp_path: Path,
) -> None:
    """A request to stop is a cancel however far the program got: one that has made no build
    yet is stopped once its grace has passed, and run exits 3, not 4 as for a program that
    died of a signal on its own."""
    ready = tmp_path / "ready"
    waits = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(120)"
    process = start_cli(
        "run", "--grace", "1s", "--", PYTHON, "-c", waits, ready, start_new_session=True
    )
    with killed_at_exit(process):
        wait_for_file(ready)
        process.send_signal(signal.SIGTERM)  # to trt-otel alone: the program is its own job
        _, err = process.communicate(timeout=60)
    assert process.returncode == 3, err
    assert "the program is still running 1.0s after SIGTERM" in err
    assert "the program made no TensorRT build" in err
