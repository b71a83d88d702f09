"""``trt-otel run``'s record of a program's builds, fed the messages its recorder sends."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from trt_otel.capture.program import CurrentBuild, ProgramBuilds, ProgramProcess
from trt_otel.core.events import Outcome
from trt_otel.core.log import EventLog

PHASES = 5_000


def quiet(_message: str) -> None:
    pass


def stamp(kind: str, *arguments: Any) -> tuple[Any, ...]:
    return (kind, time.time_ns(), time.monotonic_ns(), "builder", *arguments)


def test_a_runs_memory_follows_what_is_open_not_every_phase_it_made() -> None:
    log = EventLog()
    builds = ProgramBuilds(log, warn=quiet, say=quiet)
    current = CurrentBuild(builds, "run")
    ours, theirs = multiprocessing.Pipe()
    process = ProgramProcess(ours, os.getpid(), ["program"])
    try:
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
    finally:
        ours.close()
        theirs.close()
