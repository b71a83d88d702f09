"""``trt-otel run`` as the command runs it: one event log for every build of the program, the
same followers and sinks as a build's session (:mod:`trt_otel.app.components`), and the program.

The parts built for one build see the run through :class:`~trt_otel.capture.program.CurrentBuild`:
the HTTP view shows and cancels the build being made, and its event stream runs across all of
them; the metrics read the current build, and :class:`~trt_otel.capture.program.RunCollector` counts
the builds by outcome. The GPU is sampled while a build is being made.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trt_otel.app.assembly import attach_session
from trt_otel.app.components import Views, build_context, sampling
from trt_otel.app.config import SessionConfig, signal_grace_s
from trt_otel.app.run import resolve_command, run_program
from trt_otel.app.run_span import RunSpan
from trt_otel.capture.gpu import GpuReader
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.program import CurrentBuild, ProgramBuilds, RunCollector
from trt_otel.core.log import EventLog
from trt_otel.core.readmodel import ReadModel
from trt_otel.views import terminal
from trt_otel.views.terminal import warn
from trt_otel.views.trace_ids import TRACEPARENT_ATTRIBUTE


def say(message: str) -> None:
    """Lines among the program's own: tagged."""
    terminal.say(message, tagged=True)


def run_program_session(command: Sequence[str], config: SessionConfig) -> int:
    """Run ``command`` with its builds observed as ``config`` asks; returns the exit code."""
    argv = resolve_command(command)  # a usage error before anything starts
    run_span = RunSpan.start(argv)
    with observed_builds(config, {"program.command": shlex.join(argv)}, run=run_span) as builds:
        env = run_span.environment(os.environ)  # the program joins the run's trace
        ended = run_program(
            argv,
            builds,
            grace_s=config.policy.grace_s,
            signal_grace_s=signal_grace_s(config),
            say=say,
            env=env,
        )
        run_span.exit_code = ended.exit_code
    if config.observe.journal is not None:
        say(f"journal: {config.observe.journal}")
    say(ended.summary)
    return ended.exit_code


@contextlib.contextmanager
def observed_builds(
    config: SessionConfig,
    attributes: dict[str, Any],
    *,
    progress: bool = True,
    run: RunSpan | None = None,
) -> Iterator[ProgramBuilds]:
    """Builds on one log with everything ``config`` asks for attached, for as long as the
    context lasts: ``trt-otel run``'s, and ``trt_otel.instrument()``'s. ``progress``: plain
    lines on stderr. ``run``: the run's span, every build's parent, exported at the end."""
    observe = config.observe
    with contextlib.ExitStack() as stack:
        gpu, history = build_context(stack, observe, attributes, config.policy)
        if run is not None:  # inside the traced job's trace (build_context read TRACEPARENT)
            attributes[TRACEPARENT_ATTRIBUTE] = run.traceparent
        log = EventLog()
        builds = ProgramBuilds(
            log, attributes=attributes, policy=config.policy.policy, warn=warn, say=say
        )
        # What the one-build views read of a build (ObservedBuild): the current one's.
        run_id = uuid.uuid4().hex
        current = CurrentBuild(builds, run_id)
        model = ReadModel(history)  # the builds folded once, for every view below

        policy = config.policy.policy()

        def announce(views: Views) -> None:
            if run is not None and views.spans is not None:
                say(f"trace: {run.trace_id:032x}")
            if policy is not None:
                say(f"policy (each build): {policy.describe()}")

        # Plain lines even on a terminal: a live tree redraws lines the program writes.
        console = dataclasses.replace(observe.console, live=False) if progress else None
        views = attach_session(
            stack,
            current,
            observe,
            model=model,
            collectors=[RunCollector(builds)],
            attributes=attributes,
            console=console,
            builds_in_a_run=True,
            before_following=announce,
        )
        builds.listeners = (_sample_while_building(gpu, config),)
        yield builds
        if run is not None and views.spans is not None:
            views.spans.emit(run.record(run_id, run.exit_code))


def _sample_while_building(
    gpu: GpuReader | None, config: SessionConfig
) -> Callable[[BuildMonitor, int], Callable[[], None]]:
    """Sample the process that builds (and the GPU, where there is one) while a build runs."""

    def start(monitor: BuildMonitor, pid: int) -> Callable[[], None]:
        stack = contextlib.ExitStack()
        stack.enter_context(sampling(monitor, gpu, config.observe.sample_interval_s))(pid)
        return stack.close

    return start
