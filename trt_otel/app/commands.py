"""The ``trt-otel`` command line: its parser, and the typed command each subcommand becomes.

Below both the command (:mod:`trt_otel.app.cli`) and the fleet (:mod:`trt_otel.app.fleet`), which
checks a build's command line with this same parser before it starts one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trt_otel.app.arguments import (
    Parser,
    add_builder_options,
    add_session_options,
    add_span_options,
    builder_options,
    non_negative_float,
    percent,
    positive_seconds,
    seconds,
    session_config,
    span_config,
)
from trt_otel.app.config import (
    ConsoleConfig,
    SessionConfig,
    SpanConfig,
    UsageError,
    default_state_dir,
    supervises,
)
from trt_otel.app.diffing import DiffCommand
from trt_otel.app.fleet_arguments import (
    FleetCommand,
    Scheduler,
    add_fleet,
    add_resource_options,
    add_scheduler_options,
    fleet_command_of,
    scheduler_target,
    split_build_options,
)
from trt_otel.app.reporting import FORMATS, ReportCommand
from trt_otel.app.retries import Rung, add_retry_option, retry_rungs
from trt_otel.app.store_command import StoreCommand, add_store, store_command_of
from trt_otel.builder.build import SimulatorSettings
from trt_otel.builder.options import BuildOptions
from trt_otel.builder.simulator import SHAPES
from trt_otel.capture.backends import BACKEND_NAMES
from trt_otel.capture.liveness import DEFAULT_LOST_AFTER_S
from trt_otel.core.version import __version__


def parse_command_line(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``trt-otel``'s command line (``sys.argv``'s by default) as its parser reads it, with
    ``fleet submit``'s build options, after its ``--``, apart."""
    words, build_options = split_build_options(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(words)
    if build_options:
        args.options = build_options
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trt-otel",
        description="Watch and stop TensorRT engine builds.",
    )
    parser.add_argument("--version", action="version", version=f"trt-otel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adders = (
        _add_demo,
        _add_build,
        _add_replay,
        _add_run,
        _add_mcp,
        _add_watch,
        add_fleet,
        _add_report,
        _add_diff,
        add_store,
    )
    for add in adders:
        add(commands)
    return parser


def _add_demo(commands: argparse._SubParsersAction[Parser]) -> None:
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
    add_retry_option(demo)
    _add_summary_option(demo)
    _add_gate_option(demo)


def _add_build(commands: argparse._SubParsersAction[Parser]) -> None:
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
    add_retry_option(build)
    _add_summary_option(build)
    _add_gate_option(build)


def _add_replay(commands: argparse._SubParsersAction[Parser]) -> None:
    replay = commands.add_parser(
        "replay",
        help="show a recorded build again from its journal, and export its spans",
        description="Render a journal's final tree and, with an OTLP endpoint, export the same "
        "spans the live build did (same ids, times and attributes).",
    )
    replay.add_argument("journal", type=Path)
    add_span_options(replay, flush_timeout_s=30.0, metrics=False)


def _add_run(commands: argparse._SubParsersAction[Parser]) -> None:
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
    _add_summary_option(run)
    run.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def _add_mcp(commands: argparse._SubParsersAction[Parser]) -> None:
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
    mcp.add_argument(
        "--root",
        type=Path,
        action="append",
        metavar="DIR",
        help="a directory the paths a client names (model, output, path options) must lie "
        "in, symlinks resolved; repeatable (default: the state directory and the working "
        "directory; with --ray or --slurm, the shared folder alone)",
    )
    add_scheduler_options(mcp)
    add_resource_options(mcp)
    mcp.add_argument(
        "--allow-network-options",
        action="store_true",
        help="let a client's build options name where the build sends or reads data or "
        "listens (--otlp-endpoint, --cancel-url, --pushgateway, --prometheus-port, "
        "--prometheus-address); refused by default, when only this server's own OTEL_* "
        "settings apply",
    )


def _add_watch(commands: argparse._SubParsersAction[Parser]) -> None:
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
        "(TensorRT silent) is stopped from outside: its process, named in the journal, on "
        "this host and proven its writer (it holds the journal's write lock; a reader never "
        "is), gets SIGTERM, then SIGKILL 5 s later, and watch ends its journal",
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


def _add_summary_option(parser: Parser) -> None:
    parser.add_argument(
        "--no-summary",
        dest="summary",
        action="store_false",
        help="do not append the build's markdown report to $GITHUB_STEP_SUMMARY (appended "
        "when that variable is set, as GitHub Actions sets it)",
    )


def _add_gate_option(parser: Parser, *, after_build: bool = True) -> None:
    parser.add_argument(
        "--fail-if-slower",
        type=percent,
        metavar="PCT",
        help="exit 5 when the build is slower than "
        + ("the median of the matching builds of --history" if after_build else "the baseline")
        + " by more than PCT percent (5 or 5%%; a CI gate)",
    )


def _add_diff(commands: argparse._SubParsersAction[Parser]) -> None:
    diff = commands.add_parser(
        "diff",
        help="what changed between two builds: their record, their phases, a verdict",
        description="Compare the last build of CANDIDATE with the last build of BASELINE, or "
        "with the median of the matching successful builds in --history DIR (matched by "
        "fingerprint): what differs in their record, then their phases side by side, the "
        "largest changes first, then a verdict.",
        usage="trt-otel diff (BASELINE | --history DIR) CANDIDATE [--fail-if-slower PCT]",
    )
    diff.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL")
    diff.add_argument(
        "--history", type=Path, metavar="DIR", help="a folder of journals: the baseline is "
        "the median of its builds that match the candidate",
    )  # fmt: skip
    _add_gate_option(diff, after_build=False)


def _add_report(commands: argparse._SubParsersAction[Parser]) -> None:
    report = commands.add_parser(
        "report",
        help="explain finished builds from their journals: an HTML page, markdown or a trace",
        description="A self-contained HTML page of each build of the journals (a timeline of "
        "the phases with the silent windows, the cancel and the outcome; the builder's and "
        "GPU's resource lines; the phases that took the time; the build's record), or the same "
        "as markdown (CI summaries) or as a Trace Event Format file (Perfetto, chrome://tracing).",
    )
    report.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL")
    report.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here (default: standard output)"
    )
    report.add_argument(
        "--format", choices=FORMATS, default="html", help="html (default), markdown or chrome-trace"
    )


@dataclass(frozen=True, slots=True)
class DemoCommand:
    """``trt-otel demo``: a simulated build (a generated plan or a recorded trace)."""

    session: SessionConfig
    builder: BuildOptions
    simulator: SimulatorSettings
    model: Path | None = None
    output: Path | None = None
    retries: tuple[Rung, ...] = ()
    summary: bool = True
    """Append the markdown report to ``$GITHUB_STEP_SUMMARY`` when that is set."""
    fail_if_slower: float | None = None
    """With ``--history``: exit 5 when slower than the history's median by more (percent)."""


@dataclass(frozen=True, slots=True)
class BuildCommand:
    """``trt-otel build``: a real engine."""

    session: SessionConfig
    builder: BuildOptions
    model: Path
    output: Path
    backend: str | None = None
    """``tensorrt`` or ``tensorrt-rtx``; None: the one installed."""
    retries: tuple[Rung, ...] = ()
    summary: bool = True
    fail_if_slower: float | None = None


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
    """With a journal: the exporters and policies of a build run elsewhere (trt_otel.app.remote)."""
    control_file: Path | None = None
    terminate_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunCommand:
    """``trt-otel run -- COMMAND``: a program's builds."""

    session: SessionConfig
    program: tuple[str, ...]
    summary: bool = True


@dataclass(frozen=True, slots=True)
class McpCommand:
    """``trt-otel mcp``: the MCP server over stdio."""

    state_dir: Path
    roots: tuple[Path, ...]
    """Where the paths a client names must lie, resolved."""
    scheduler: Scheduler | None = None
    """With ``--ray`` or ``--slurm``: where the builds run as jobs; they lie in the shared
    folder, which is then :attr:`state_dir`."""
    address: str | None = None
    """Ray's job API (``--ray``)."""
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    partition: str | None = None
    """SLURM's: the partition of each build's job."""
    time_limit_s: float | None = None
    """SLURM's: each build's time limit."""
    allow_network: bool = False
    """Whether a client may set the options that point a build at the network."""


Command = (
    DemoCommand
    | BuildCommand
    | ReplayCommand
    | WatchCommand
    | RunCommand
    | McpCommand
    | FleetCommand
    | ReportCommand
    | DiffCommand
    | StoreCommand
)


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
            retries=retry_rungs(args, threads=args.threads),
            summary=args.summary,
            fail_if_slower=_gate(args),
        )
    if args.command == "build":
        return BuildCommand(
            session=session_config(args),
            builder=builder_options(args),
            model=args.model,
            output=args.output,
            backend=args.backend,
            retries=retry_rungs(args),
            summary=args.summary,
            fail_if_slower=_gate(args),
        )
    if args.command == "run":
        program = args.program[1:] if args.program[:1] == ["--"] else args.program
        if not program:
            raise UsageError("give the program to run after --, e.g. -- python build.py")
        return RunCommand(session_config(args), tuple(program), summary=args.summary)
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
    if args.command == "fleet":
        return fleet_command_of(args)
    if args.command == "store":
        return store_command_of(args)
    if args.command == "mcp" and (args.ray or args.slurm or args.shared_dir):
        return _scheduled_mcp_command(args)
    if args.command in ("diff", "report"):
        return _explaining(args)
    if args.command == "mcp":
        return _mcp_command(args)
    return ReplayCommand(args.journal, span_config(args))


def _scheduled_mcp_command(args: argparse.Namespace) -> McpCommand:
    """``trt-otel mcp --ray`` or ``--slurm``: the shared folder is the one root (the
    scheduler's nodes see nothing else), and a ``--root`` outside it is refused."""
    scheduler, address, shared_dir = scheduler_target(args.ray, args.slurm, args.shared_dir)
    if scheduler != "slurm" and (args.partition is not None or args.time_limit is not None):
        raise UsageError("--partition and --time-limit are SLURM's: give --slurm")
    for root in args.root or ():
        if not root.expanduser().resolve().is_relative_to(shared_dir):
            raise UsageError(
                f"--root {root} is outside --shared-dir {shared_dir}: with --{scheduler}, "
                "builds run on the scheduler's nodes, which see the shared folder only"
            )
    return McpCommand(
        shared_dir,
        (shared_dir,),
        scheduler=scheduler,
        address=address,
        partition=args.partition,
        time_limit_s=args.time_limit,
        num_gpus=args.num_gpus,
        num_cpus=args.num_cpus,
        allow_network=args.allow_network_options,
    )


def _mcp_command(args: argparse.Namespace) -> McpCommand:
    state_dir = args.state_dir or default_state_dir()
    for root in args.root or ():
        if not root.expanduser().is_dir():
            raise UsageError(f"--root {root}: not a directory")
    try:
        roots = tuple(root.expanduser().resolve() for root in args.root or [state_dir, Path.cwd()])
    except (OSError, RuntimeError) as error:  # a loop of symlinks
        raise UsageError(f"--root: {error}") from None
    return McpCommand(state_dir, roots, allow_network=args.allow_network_options)


def _gate(args: argparse.Namespace) -> float | None:
    if args.fail_if_slower is not None and args.history is None:
        raise UsageError("--fail-if-slower needs --history DIR: the builds to compare with")
    return args.fail_if_slower  # type: ignore[no-any-return]


def _explaining(args: argparse.Namespace) -> ReportCommand | DiffCommand:
    """``report`` and ``diff``: finished builds explained, from their journals."""
    journals: list[Path] = args.journals
    if args.command == "report":
        return ReportCommand(tuple(journals), args.output, args.format)
    if args.history is not None:
        if len(journals) != 1:
            raise UsageError("diff --history DIR takes one journal: the candidate")
        return DiffCommand(journals[0], history=args.history, fail_if_slower=args.fail_if_slower)
    if len(journals) != 2:
        raise UsageError("diff takes two journals, BASELINE CANDIDATE (or --history DIR)")
    return DiffCommand(journals[1], baseline=journals[0], fail_if_slower=args.fail_if_slower)
