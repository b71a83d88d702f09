"""The ``trt-otel`` command: ``demo``, ``build``, ``replay`` and ``watch``. It parses options
into typed configuration (:mod:`trt_otel.app.arguments`), and :mod:`trt_otel.app.session` runs.

Exit codes (the contract): 0 built; 2 usage or configuration error, before any build starts;
3 cancelled; 4 the build failed; 5 slower than ``--fail-if-slower`` allows; 130 interrupted by
the user (Ctrl-C).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from trt_otel.app.commands import (
    BuildCommand,
    DemoCommand,
    McpCommand,
    ReplayCommand,
    RunCommand,
    WatchCommand,
    command_of,
    parse_command_line,
)
from trt_otel.app.components import attach_views, console_view
from trt_otel.app.config import ObservabilityConfig, SessionConfig, UsageError, supervises
from trt_otel.app.diffing import DiffCommand, diff_command, gate
from trt_otel.app.fleet_arguments import FleetCommand
from trt_otel.app.ladder import run_ladder
from trt_otel.app.reporting import ReportCommand, report, summarised
from trt_otel.app.session import (
    EXIT_CANCELLED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    exit_code_of,
    warn,
)
from trt_otel.app.store_command import StoreCommand
from trt_otel.builder.build import (
    BuildJob,
    BuildSetupError,
    check_builder_options,
    model_attributes,
    read_model,
    select_backend,
)
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.options import BuildOptions
from trt_otel.builder.preflight import PreflightError, check_build_files
from trt_otel.builder.provenance import provenance_attributes, timing_cache_attributes
from trt_otel.builder.simulator.callbacks import TraceError
from trt_otel.capture.backends import record_attributes
from trt_otel.capture.checked import read_journal
from trt_otel.capture.liveness import Writer
from trt_otel.capture.supervisor import StopNow
from trt_otel.capture.watch import WatchError, follow_journal, follow_url
from trt_otel.core.attempts import attempt_of
from trt_otel.core.builds import builds_of
from trt_otel.core.durations import format_duration
from trt_otel.core.events import BuildStarted, Outcome
from trt_otel.core.exiting import exit_without_teardown
from trt_otel.core.journal_codec import JournalError
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.startup import startup_done, take_lost_interrupt
from trt_otel.views.console import render_build
from trt_otel.views.otlp_settings import OtlpConfigError
from trt_otel.views.terminal import PipeSafeStream, pipe_safe_stderr, printable, say

# The commands that are not a build (run, watch with a session, the simulator's demo) import
# what only they use where they run: every build pays for what the command imports up front.


def main(argv: Sequence[str] | None = None) -> int:
    startup_done()  # Ctrl-C from here on: the command's own handling
    # A reader that goes away (`trt-otel demo 2>&1 | head`) changes neither the outcome nor
    # the cleanup: what is left to say is dropped.
    try:
        with pipe_safe_stderr():
            code = _main(argv)
            if code != EXIT_INTERRUPTED and take_lost_interrupt():
                # A Ctrl-C that Python dropped on its way (see trt_otel.core.startup) and no
                # build's handling took: the command went on to its end, but the user did
                # interrupt it.
                raise KeyboardInterrupt
            return code
    except KeyboardInterrupt:  # between the two, or on the way out: still one line, not a trace
        print("trt-otel: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def run() -> NoReturn:
    """The ``trt-otel`` command (its console script, ``python -m trt_otel.app.cli``): :func:`main`,
    and out."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` as :func:`sys.exit` would, without the interpreter's teardown where
    that is safe (:func:`~trt_otel.core.exiting.exit_without_teardown`)."""
    exit_without_teardown(code)
    sys.exit(code)


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = parse_command_line(argv)
        command = command_of(args)
        if isinstance(command, DemoCommand | BuildCommand):
            return _build_or_demo(command)
        if isinstance(command, WatchCommand):
            return watch(command)
        if isinstance(command, RunCommand):
            from trt_otel.app.program_session import run_program_session

            with summarised(command.session, command.summary) as session:
                return run_program_session(command.program, session)
        if isinstance(command, McpCommand):
            return mcp(command)
        if isinstance(command, FleetCommand):
            return fleet(command)
        if isinstance(command, ReportCommand):
            return report(command)
        if isinstance(command, DiffCommand):
            return diff_command(command)
        if isinstance(command, StoreCommand):
            from trt_otel.app.store_command import run_store

            return run_store(command)
        return replay(command)
    except StopNow:  # a second SIGTERM outside the build: still a cancel
        return EXIT_CANCELLED
    except KeyboardInterrupt:  # outside the build's own handling (start-up, watch, replay)
        print("trt-otel: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (
        UsageError,
        BuildSetupError,
        JournalError,
        TraceError,
        OtlpConfigError,
        WatchError,
        PreflightError,
    ) as error:
        say(f"error: {error}", tagged=True)  # paths and names given: escaped, bounded
        return EXIT_USAGE


def _build_or_demo(command: DemoCommand | BuildCommand) -> int:
    """The build, its summary for CI (``$GITHUB_STEP_SUMMARY``), and with
    ``--fail-if-slower``, the gate against its history, which needs a journal of the build."""
    gated = command.fail_if_slower is not None
    files = [
        ("model", command.model),
        ("engine", command.output),
        ("timing cache", command.builder.timing_cache),
        ("trace", command.simulator.trace if isinstance(command, DemoCommand) else None),
    ]
    with summarised(command.session, command.summary, keep_journal=gated, files=files) as session:
        command = dataclasses.replace(command, session=session)
        code = demo(command) if isinstance(command, DemoCommand) else build(command)
    if code == EXIT_OK and command.fail_if_slower is not None:
        observe = command.session.observe
        return gate(observe.journal, observe.history, command.fail_if_slower)
    return code


def demo(command: DemoCommand) -> int:
    from trt_otel.builder.simulator import SIMULATOR_VERSION, load_trace

    trace = command.simulator.trace
    preflight(command.session, command.builder, command.model, command.output, trace)
    # Parsed here, once: a bad trace is a usage error before the build, not a failure in the
    # worker, and the worker gets the parsed trace.
    plan = load_trace(trace) if trace is not None else None
    if command.model is not None:
        model_path, model = command.model, read_model(command.model)
        carried: bytes | None = None  # the worker reads the file itself
    else:
        model_path, model = Path("trt-otel-demo-mnist.onnx"), demo_model_bytes()
        carried = model
    attributes: dict[str, Any] = {
        "trt.backend": "simulator",
        "trt.version": SIMULATOR_VERSION,
        **model_attributes(model_path, model),
        **provenance_attributes(),
    }
    if trace is not None:
        attributes["simulator.trace"] = str(trace)
    else:
        attributes["simulator.shape"] = command.simulator.shape
    attributes.update(command.builder.attributes())
    attributes.update(timing_cache_attributes(command.builder.timing_cache, "before"))
    job = BuildJob(
        model_path=model_path,
        model=carried,
        engine_path=command.output,
        options=command.builder,
        simulator=command.simulator,
        plan=plan,
    )
    return run_ladder(job, command.session, attributes, command.retries)


def build(command: BuildCommand) -> int:
    preflight(command.session, command.builder, command.model, command.output)
    model = read_model(command.model)
    # The library is imported here too (cheap; no CUDA context): its real version goes in the
    # record, and an option it does not have is refused before the build (exit 2).
    backend, module = select_backend(command.backend)
    for options in (command.builder, *(rung.builder for rung in command.retries)):
        check_builder_options(module, options)
    attributes = {
        **record_attributes(backend, module),
        **model_attributes(command.model, model),
        **command.builder.attributes(),
        **timing_cache_attributes(command.builder.timing_cache, "before"),
        **provenance_attributes(backend.name),
    }
    job = BuildJob(
        model_path=command.model,
        engine_path=command.output,
        options=command.builder,
        backend=backend.name,
    )
    return run_ladder(job, command.session, attributes, command.retries)


def preflight(
    session: SessionConfig,
    builder: BuildOptions,
    model: Path | None,
    engine: Path | None,
    trace: Path | None = None,
) -> None:
    """The build's files, checked before anything is opened or truncated (exit 2)."""
    check_build_files(
        model=model,
        engine=engine,
        journal=session.observe.journal,
        timing_cache=builder.timing_cache,
        trace=trace,
        cancel_file=session.policy.cancel_file,
    )


def mcp(command: McpCommand) -> int:
    try:
        from trt_otel.app.mcp_server import serve
    except ImportError as error:
        raise UsageError(
            f"the MCP server needs the mcp package ({error}): pip install 'trt-otel[mcp]'"
        ) from None
    if command.scheduler is not None:
        from trt_otel.app.fleet_command import scheduled_fleet
        from trt_otel.app.fleet_requests import FleetError
        from trt_otel.app.mcp_server import serve_fleet

        try:
            fleet = scheduled_fleet(
                command.scheduler,
                command.address,
                command.state_dir,
                num_gpus=command.num_gpus,
                num_cpus=command.num_cpus,
                partition=command.partition,
                time_limit_s=command.time_limit_s,
                allow_network=command.allow_network,
            )
        except FleetError as error:
            raise UsageError(str(error)) from None
        serve_fleet(fleet)
        return EXIT_OK
    serve(command.state_dir, command.roots, allow_network=command.allow_network)
    return EXIT_OK


def fleet(command: FleetCommand) -> int:
    """``trt-otel fleet``: builds as Ray or SLURM jobs (Ray's client is imported only here)."""
    from trt_otel.app.fleet_command import run_fleet

    return run_fleet(command)


def replay(command: ReplayCommand) -> int:
    """Every build of the journal (``run`` and retries write several, one after another), each
    its tree on stdout in order; the exit code is the worst build's, as ``watch`` gives it for
    one (a build with no end counts as failed)."""
    journal = read_journal(command.journal)
    for problem in journal.problems:
        say(f"{command.journal}: {problem}", tagged=True)
    builds = builds_of(journal.events)
    if not journal.events:
        raise JournalError(f"{command.journal}: no build in this journal (its header alone)")
    from rich.console import Console  # replay's alone: a build's console may be plain lines

    model = ReadModel()
    out = Console(file=PipeSafeStream(sys.stdout))  # type: ignore[arg-type]
    code = EXIT_OK
    # The resource of where it is replayed, and of the GPU the journal says the build had.
    first = next((e for e in journal.events if type(e) is BuildStarted), None)
    attributes = first.attributes if first else None
    with contextlib.ExitStack() as stack:
        # The views of a live build that read only the model: its spans and log records.
        observe = ObservabilityConfig(spans=command.spans)
        attach_views(stack, None, observe, runner=None, model=model, attributes=attributes)
        # The same model and projections as the live run, fed the same events: the same tree
        # and the same spans.
        for index, events in enumerate(builds):
            model.handle(events)
            last = index == len(builds) - 1
            if last:
                model.close()
            state = model.state
            unended = state.outcome is None
            if unended:
                said = _no_end(journal.header, model, followed=not last)
                name = f"build {index + 1} of {len(builds)}: " if len(builds) > 1 else ""
                say(f"{command.journal}: {name}{said}", tagged=True)
            attempt = attempt_of(state.attributes)
            if attempt is not None:
                after = f", after {attempt.retry_reason}" if attempt.retry_reason else ""
                line = printable(f"attempt {attempt.number} of {attempt.of}{after}")
                out.print(line, markup=False, highlight=False)
            out.print(render_build(model, never_ended=unended))
            outcome = Outcome.FAILURE if state.outcome is None else state.outcome
            # A retry ladder's attempts: the last one's is the ladder's code, as it was live.
            ended = exit_code_of(outcome)
            code = ended if attempt is not None else max(code, ended)
    return code


def _no_end(header: dict[str, Any], model: ReadModel, *, followed: bool = False) -> str:
    """What a journal without the build's end means, said plainly. ``followed``: another build
    of the journal starts after it."""
    state = model.state
    start, last = state.start_mono_ns or 0, state.last_event_mono_ns or 0
    inner = state.innermost_open()
    where = f", in {inner!r}" if inner is not None else ""
    if followed:
        return (
            f"the build never ended: its record stops after "
            f"{format_duration((last - start) / 1e9)}{where}, and the next build starts there"
        )
    writer = Writer.from_header(header)
    if writer.running_here():
        return (
            f"the build has not ended yet: its writer ({writer.describe()}) is still running "
            "(`trt-otel watch` follows it)"
        )
    return (
        f"the build never ended: its record stops after {format_duration((last - start) / 1e9)}"
        f"{where}, and its writer died or was stopped before the end (the tree below is where "
        "it was then)"
    )


def watch(command: WatchCommand) -> int:
    supervising = supervises(command.session, command.control_file)
    if command.journal is not None and (supervising or command.terminate_after_s is not None):
        from trt_otel.app.remote import watch_and_supervise

        end = watch_and_supervise(
            command.journal,
            command.session,
            command.control_file,
            lost_after_s=command.lost_after_s,
            terminate_after_s=command.terminate_after_s,
        )
        if end is None:
            print("trt-otel: error: lost the build before its end", file=sys.stderr)
            return EXIT_USAGE
        return exit_code_of(end.outcome)
    model = ReadModel()
    console_view(command.console, model)
    try:
        if command.url is not None:
            end = follow_url(command.url, model.handle, warn=warn, retry_for_s=command.lost_after_s)
        else:
            assert command.journal is not None
            end = follow_journal(
                command.journal, model.handle, warn=warn, lost_after_s=command.lost_after_s
            )
    finally:
        model.close()
    if end is None:
        print("trt-otel: error: lost the build before its end", file=sys.stderr)
        return EXIT_USAGE
    return exit_code_of(end.outcome)


if __name__ == "__main__":  # pragma: no cover
    run()
