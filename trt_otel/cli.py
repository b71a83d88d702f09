"""The ``trt-otel`` command: ``demo``, ``build``, ``replay`` and ``watch``. It parses options
into typed configuration (:mod:`trt_otel.arguments`), and :mod:`trt_otel.session` runs.

Exit codes (the contract): 0 built; 2 usage or configuration error, before any build starts;
3 cancelled; 4 the build failed; 130 interrupted by the user (Ctrl-C).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from trt_otel import __version__
from trt_otel.arguments import (
    Parser,
    add_builder_options,
    add_session_options,
    add_span_options,
    builder_options,
    non_negative_float,
    positive_seconds,
    seconds,
    session_config,
    span_config,
)
from trt_otel.backends import BACKEND_NAMES, record_attributes
from trt_otel.build import (
    BuildJob,
    BuildSetupError,
    SimulatorSettings,
    check_builder_options,
    model_attributes,
    read_model,
    select_backend,
)
from trt_otel.components import console_view, span_export
from trt_otel.config import ConsoleConfig, SessionConfig, SpanConfig, UsageError
from trt_otel.console import render_build
from trt_otel.durations import format_duration
from trt_otel.fleet import default_state_dir
from trt_otel.journal import JournalError, read_journal
from trt_otel.liveness import DEFAULT_LOST_AFTER_S, Writer
from trt_otel.model import demo_model_bytes
from trt_otel.options import BuildOptions
from trt_otel.preflight import PreflightError, check_build_files
from trt_otel.program_session import run_program_session
from trt_otel.readmodel import ReadModel
from trt_otel.remote import supervises, watch_and_supervise
from trt_otel.run import ProgramNotFoundError
from trt_otel.session import (
    EXIT_CANCELLED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    exit_code_of,
    run_session,
    warn,
)
from trt_otel.simulator import SHAPES, SIMULATOR_VERSION, TraceError, load_trace
from trt_otel.sinks.otlp import OtlpConfigError
from trt_otel.supervisor import StopNow
from trt_otel.terminal import pipe_safe_stderr
from trt_otel.watch import WatchError, follow_journal, follow_url


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trt-otel",
        description="Watch and stop TensorRT engine builds.",
    )
    parser.add_argument("--version", action="version", version=f"trt-otel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the pipeline on a simulated TensorRT build (no GPU needed)",
        description="A simulated TensorRT build of a small generated ONNX model, or a replay "
        "of a recorded callback trace, through the same monitor and projections as a real one.",
    )
    demo.add_argument(
        "--trace", type=Path, help="replay a recorded callback trace or a trt-otel journal"
    )
    demo.add_argument(
        "--model", type=Path, help="simulate a build of this ONNX model instead of the demo's"
    )
    demo.add_argument(
        "--speed",
        type=non_negative_float,
        default=1.0,
        help="time scale: 1 paces the build over tens of seconds, 2 twice as fast, "
        "0 as fast as possible (default: 1)",
    )
    demo.add_argument(
        "--silence",
        type=seconds,
        default=0.0,
        metavar="DURATION",
        help="insert one silent window of this length (e.g. 90s), as real builds have",
    )
    demo.add_argument(
        "--threads", type=int, default=1, help="builder threads calling back (default: 1)"
    )
    demo.add_argument(
        "--simulate",
        choices=SHAPES,
        default="tensorrt-10",
        help="whose phase tree to generate: tensorrt-10 (the recorded TensorRT 10.16 builds) "
        "or tensorrt-rtx (TensorRT-RTX 1.7's, with its silent window; default: tensorrt-10)",
    )
    demo.add_argument("-o", "--output", type=Path, help="write the simulated engine here")
    add_builder_options(demo)
    add_session_options(demo)

    build = commands.add_parser(
        "build",
        help="build a TensorRT engine from an ONNX model",
        description="Build a real engine with TensorRT or TensorRT-RTX, observable and cancelable.",
    )
    build.add_argument("model", type=Path, help="the ONNX model")
    build.add_argument("-o", "--output", type=Path, required=True, help="the engine file")
    build.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        help="the builder library: tensorrt or tensorrt-rtx (default: the one installed; "
        "tensorrt where both are)",
    )
    add_builder_options(build)
    add_session_options(build)

    replay = commands.add_parser(
        "replay",
        help="show a recorded build again from its journal, and export its spans",
        description="Render a journal's final tree and, with an OTLP endpoint, export the same "
        "spans the live build did (same ids, times and attributes).",
    )
    replay.add_argument("journal", type=Path)
    add_span_options(replay, flush_timeout_s=30.0)

    run = commands.add_parser(
        "run",
        help="run a Python program unchanged, observing (and able to stop) its TensorRT builds",
        description="Run COMMAND (a Python script, python -m module, or a console script such "
        "as polygraphy) with every TensorRT and TensorRT-RTX build it makes observed: each is "
        "a build of its own in one journal. Exits with the program's exit code, or 3 when "
        "trt-otel cancelled a build, 4 when the program died of a signal, 130 on Ctrl-C.",
        usage="trt-otel run [options] -- COMMAND [ARGS...]",
    )
    add_session_options(run, in_process=False)
    run.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)

    mcp = commands.add_parser(
        "mcp",
        help="a Model Context Protocol server (stdio) to start, follow and cancel builds",
        description="Serve MCP over stdin/stdout: tools to start builds (each a trt-otel "
        "process of its own, with its HTTP view and journal in the state directory), list "
        "them, read their status and events, wait for them, and cancel them.",
    )
    mcp.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the builds' folders are (default: $XDG_STATE_HOME/trt-otel/builds, "
        "else ~/.local/state/trt-otel/builds)",
    )

    watch = commands.add_parser(
        "watch",
        help="follow a build running elsewhere (its HTTP endpoint or its journal)",
        description="Follow a build through its event stream (--url, a build started with "
        "--http-port) or its journal as it grows, with the build's own terminal view. Exits "
        "with the build's exit code (0, 3, 4), or 2 when it cannot be followed.",
    )
    watch.add_argument(
        "watched", nargs="?", type=Path, metavar="JOURNAL", help="a journal being written"
    )
    watch.add_argument("--url", metavar="URL", help="the build's HTTP endpoint")
    watch.add_argument(
        "--control-file",
        type=Path,
        metavar="PATH",
        help="with a journal: where to write a cancel decided here (a policy, POST /cancel) "
        "for the build's monitor to read (its cancel file)",
    )
    watch.add_argument(
        "--terminate-after",
        type=positive_seconds,
        metavar="DURATION",
        help="with --control-file: a build still running this long after watch cancelled it "
        "(TensorRT silent) is stopped from outside: its process, named in the journal and on "
        "this host, gets SIGTERM, then SIGKILL 5 s later, and watch ends its journal",
    )
    watch.add_argument(
        "--lost-after",
        type=positive_seconds,
        default=DEFAULT_LOST_AFTER_S,
        metavar="DURATION",
        help="give the build up as lost (exit 2) after this long with no sign of life: no "
        "event and no touch of its journal, or no connection to its URL (default: 30s); a "
        "journal whose writer is gone from this host is lost at once",
    )
    add_session_options(watch, in_process=False)
    return parser


@dataclass(frozen=True, slots=True)
class DemoCommand:
    """``trt-otel demo``: a simulated build (a generated plan or a recorded trace)."""

    session: SessionConfig
    builder: BuildOptions
    simulator: SimulatorSettings
    model: Path | None = None
    output: Path | None = None


@dataclass(frozen=True, slots=True)
class BuildCommand:
    """``trt-otel build``: a real engine."""

    session: SessionConfig
    builder: BuildOptions
    model: Path
    output: Path
    backend: str | None = None
    """``tensorrt`` or ``tensorrt-rtx``; None: the one installed."""


@dataclass(frozen=True, slots=True)
class ReplayCommand:
    journal: Path
    spans: SpanConfig


@dataclass(frozen=True, slots=True)
class WatchCommand:
    console: ConsoleConfig
    journal: Path | None = None
    url: str | None = None
    lost_after_s: float = DEFAULT_LOST_AFTER_S
    session: SessionConfig = field(default_factory=SessionConfig)
    """With a journal: the exporters and policies of a build run elsewhere (trt_otel.remote)."""
    control_file: Path | None = None
    terminate_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunCommand:
    """``trt-otel run -- COMMAND``: a program's builds."""

    session: SessionConfig
    program: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class McpCommand:
    """``trt-otel mcp``: the MCP server over stdio."""

    state_dir: Path


Command = DemoCommand | BuildCommand | ReplayCommand | WatchCommand | RunCommand | McpCommand


def command_of(args: argparse.Namespace) -> Command:
    """The parsed command line as typed values, checked: a bad one raises :class:`UsageError`."""
    if args.command == "demo":
        if args.threads < 1:
            raise UsageError("--threads must be at least 1")
        return DemoCommand(
            session=session_config(args),
            builder=builder_options(args, threads=args.threads),
            simulator=SimulatorSettings(
                speed=args.speed, silence_s=args.silence, trace=args.trace, shape=args.simulate
            ),
            model=args.model,
            output=args.output,
        )
    if args.command == "build":
        return BuildCommand(
            session=session_config(args),
            builder=builder_options(args),
            model=args.model,
            output=args.output,
            backend=args.backend,
        )
    if args.command == "run":
        program = args.program[1:] if args.program[:1] == ["--"] else args.program
        if not program:
            raise UsageError("give the program to run after --, e.g. -- python build.py")
        return RunCommand(session_config(args), tuple(program))
    if args.command == "watch":
        if (args.watched is None) == (args.url is None):
            raise UsageError("watch takes a journal or --url URL (one of them)")
        session = session_config(args)
        if args.url is not None and supervises(session, args.control_file):
            raise UsageError("watch --url only shows the build: its own process exports it")
        return WatchCommand(
            ConsoleConfig(live=not args.no_progress),
            args.watched,
            args.url,
            session=session,
            control_file=args.control_file,
            lost_after_s=args.lost_after,
            terminate_after_s=args.terminate_after,
        )
    if args.command == "mcp":
        return McpCommand(args.state_dir or default_state_dir())
    return ReplayCommand(args.journal, span_config(args))


def main(argv: Sequence[str] | None = None) -> int:
    # A reader that goes away (`trt-otel demo 2>&1 | head`) changes neither the outcome nor
    # the cleanup: what is left to say is dropped.
    with pipe_safe_stderr():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        command = command_of(args)
        if isinstance(command, DemoCommand):
            return demo(command)
        if isinstance(command, BuildCommand):
            return build(command)
        if isinstance(command, WatchCommand):
            return watch(command)
        if isinstance(command, RunCommand):
            return run_program_session(command.program, command.session)
        if isinstance(command, McpCommand):
            return mcp(command)
        return replay(command)
    except StopNow:  # a second SIGTERM outside the build: still a cancel
        return EXIT_CANCELLED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (
        UsageError,
        BuildSetupError,
        JournalError,
        TraceError,
        OtlpConfigError,
        WatchError,
        PreflightError,
        ProgramNotFoundError,
    ) as error:
        print(f"trt-otel: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def demo(command: DemoCommand) -> int:
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
    }
    if trace is not None:
        attributes["simulator.trace"] = str(trace)
    else:
        attributes["simulator.shape"] = command.simulator.shape
    attributes.update(command.builder.attributes())
    job = BuildJob(
        model_path=model_path,
        model=carried,
        engine_path=command.output,
        options=command.builder,
        simulator=command.simulator,
        plan=plan,
    )
    return run_session(job, command.session, attributes)


def build(command: BuildCommand) -> int:
    preflight(command.session, command.builder, command.model, command.output)
    model = read_model(command.model)
    # The library is imported here too (cheap; no CUDA context): its real version goes in the
    # record, and an option it does not have is refused before the build (exit 2).
    backend, module = select_backend(command.backend)
    check_builder_options(module, command.builder)
    attributes = {
        **record_attributes(backend, module),
        **model_attributes(command.model, model),
        **command.builder.attributes(),
    }
    job = BuildJob(
        model_path=command.model,
        engine_path=command.output,
        options=command.builder,
        backend=backend.name,
    )
    return run_session(job, command.session, attributes)


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
        from trt_otel.mcp_server import serve
    except ImportError as error:
        raise UsageError(
            f"the MCP server needs the mcp package ({error}): pip install 'trt-otel[mcp]'"
        ) from None
    serve(command.state_dir)
    return EXIT_OK


def replay(command: ReplayCommand) -> int:
    journal = read_journal(command.journal)
    for problem in journal.problems:
        print(f"trt-otel: {command.journal}: {problem}", file=sys.stderr)
    model = ReadModel()
    with span_export(command.spans, model):
        # The same model and projections as the live run, fed the same events: the same tree
        # and the same spans.
        model.handle(journal.events)
        model.close()
        unended = model.state.outcome is None and model.state.start_mono_ns is not None
        if unended:
            print(f"trt-otel: {command.journal}: {_no_end(journal.header, model)}", file=sys.stderr)
        Console(stderr=True).print(render_build(model, never_ended=unended))
    return EXIT_OK


def _no_end(header: dict[str, Any], model: ReadModel) -> str:
    """What a journal without the build's end means, said plainly."""
    state = model.state
    start, last = state.start_mono_ns or 0, state.last_event_mono_ns or 0
    open_ids = state.open_phase_ids()
    where = f", in {state.phases[open_ids[-1]].name!r}" if open_ids else ""
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
    sys.exit(main())
