"""``trt-otel run``'s record of a program's builds, fed the messages its recorder sends, and
the run's watch over the program itself."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trt_otel.app.run import _unfinished, run_program
from trt_otel.capture.program import CurrentBuild, ProgramBuild, ProgramBuilds, ProgramProcess
from trt_otel.core.events import BuildFinished, Event, Outcome
from trt_otel.core.log import EventLog
from trt_otel.core.state import BuildState

PHASES = 5_000


def quiet(_message: str) -> None:
    pass


def stamp(kind: str, *arguments: Any) -> tuple[Any, ...]:
    return (kind, time.time_ns(), time.monotonic_ns(), "builder", *arguments)


@contextlib.contextmanager
def a_run() -> Iterator[tuple[ProgramBuilds, CurrentBuild, ProgramProcess]]:
    """A run's record of its program's builds, and the program's process as it sends them."""
    builds = ProgramBuilds(EventLog(), warn=quiet, say=quiet)
    ours, theirs = multiprocessing.Pipe()
    try:
        yield builds, CurrentBuild(builds, "run"), ProgramProcess(ours, os.getpid(), ["program"])
    finally:
        ours.close()
        theirs.close()


def test_a_runs_memory_follows_what_is_open_not_every_phase_it_made() -> None:
    with a_run() as (builds, current, process):
        builds.handle(process, ("begin", 1, {}, time.time_ns(), time.monotonic_ns()))
        records = [stamp("phase_start", "Building engine", None, 1)]
        name = "Timing tactic"  # as TensorRT does: one name, thousands of instances
        for _ in range(PHASES):
            records += [stamp("phase_start", name, "Building engine", 1), stamp("step", name, 0)]
            records.append(stamp("phase_finish", name))
        builds.handle(process, ("records", 1, records, len(records), 0))
        build = builds.active
        assert build is not None and build.monitor is not None
        assert build.monitor.state.phases_started_total == PHASES + 1
        # The open root, and the latest instance of each name the gauges read, at most.
        assert len(build.monitor.state.phases) <= 3
        assert len(current.state.phases) <= 3, "the run's current build forgets too"
        builds.handle(process, ("records", 1, [stamp("phase_finish", "Building engine")], 1, 0))
        done = stamp("done", True, None, None)
        builds.handle(process, ("records", 1, [done], 1, 0))
        assert build.outcome is Outcome.SUCCESS


def test_each_build_of_a_run_is_folded_once_by_its_own_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's views read the build being made through its monitor's state: each build is
    folded by one state of its own (its monitor's), and the current build is the latest one,
    also once it has ended."""
    folded: dict[int, list[str | None]] = {}
    original = BuildState.apply

    def counting(self: BuildState, event: Event) -> None:
        original(self, event)
        folded.setdefault(id(self), []).append(self.build_id)

    monkeypatch.setattr(BuildState, "apply", counting)
    with a_run() as (builds, current, process):
        assert current.build_id == "run" and current.state.build_id is None
        for number in (1, 2):
            builds.handle(process, ("begin", number, {}, time.time_ns(), time.monotonic_ns()))
            records = [stamp("phase_start", "Building engine", None, 2)]
            records += [stamp("step", "Building engine", 0), stamp("done", True, None, None)]
            builds.handle(process, ("records", number, records, len(records), 0))
            assert current.state.outcome is Outcome.SUCCESS
            assert current.build_id == builds.all[-1].monitor.build_id  # type: ignore[union-attr]
    first, second = (build.monitor for build in builds.all)
    assert first is not None and second is not None and first.build_id != second.build_id
    assert len(folded) == 2, "one state per build, and no other"
    assert sorted(set(ids) for ids in folded.values()) == sorted(
        [{first.build_id}, {second.build_id}]
    ), "no state folds two builds"
    assert current.state is second.state


def test_a_program_that_exits_0_during_a_build_ended_it_by_exiting_not_by_a_signal() -> None:
    """The program exited with code 0 (``os._exit(0)`` from another thread) while a build ran:
    the build's end says it exited, with its code; only a negative code is a signal's."""
    with a_run() as (builds, _, process):
        builds.handle(process, ("begin", 1, {}, time.time_ns(), time.monotonic_ns()))
        build = builds.active
        assert build is not None and build.monitor is not None
        builds.end_unfinished(lambda unfinished: _unfinished(unfinished, 0, process.pid, None, 5.0))
        end = build.monitor.log.recent()[-1]
    assert isinstance(end, BuildFinished)
    assert (end.outcome, end.detail, end.error_type) == (
        Outcome.FAILURE,
        "the program exited (exit code 0) during the build",
        "ProgramExited",
    )


class InterruptedAtTheFirstLook(ProgramBuilds):
    """A run's builds (the program makes none) that stand for the user: at the run's first
    look at them, Ctrl-C to the run; at its second, the program is let go on to its own end (a
    line written to ``release``, a FIFO the program reads until then)."""

    def __init__(self, release: Path) -> None:
        super().__init__(EventLog(), warn=quiet, say=quiet)
        self.release = release
        self.looks = 0

    def overdue(self, grace_s: float) -> ProgramBuild | None:
        self.looks += 1
        if self.looks == 1:
            os.kill(os.getpid(), signal.SIGINT)  # the run's handler takes it, on this thread
        elif self.looks == 2:
            with open(self.release, "w") as fifo:
                fifo.write("cleaned up\n")
        return super().overdue(grace_s)


@pytest.mark.e2e
def test_a_first_ctrl_c_leaves_the_program_running_to_its_own_end(tmp_path: Path) -> None:
    """The first Ctrl-C cancels the builds and stops nothing: the program, still running at the
    run's next look, ends as it chooses (here cleanly, exit code 0), and the run exits 130.
    Only a second Ctrl-C stops the program."""
    release = tmp_path / "release"
    os.mkfifo(release)
    program = "import sys; print(open(sys.argv[1]).read(), end='')"
    said: list[str] = []
    builds = InterruptedAtTheFirstLook(release)
    ended = run_program(
        [sys.executable, "-c", program, str(release)], builds, grace_s=30.0, say=said.append
    )
    assert (ended.exit_code, ended.returncode) == (130, 0), ended.summary
    assert builds.looks >= 2, "the run looked again after the interrupt"
    assert ended.summary.endswith("the program ended: exit code 0"), ended.summary
    assert not [line for line in said if "stopping the program" in line], said
