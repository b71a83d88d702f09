"""The ``trt-otel`` command: ``demo``, ``build`` and ``replay``; it parses, and
:mod:`trt_otel.session` runs.

Exit codes (the contract): 0 built; 2 usage or configuration error, before any build starts;
3 cancelled; 4 the build failed; 130 interrupted by the user (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import sys
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from trt_otel import __version__
from trt_otel.build import (
    BuildJob,
    BuildSetupError,
    SimulatorSettings,
    import_tensorrt,
    model_attributes,
    read_model,
)
from trt_otel.console import LiveConsole, PlainLines, render_build
from trt_otel.eta import EtaProjection
from trt_otel.events import Event
from trt_otel.journal import JournalError, read_journal
from trt_otel.model import demo_model_bytes
from trt_otel.options import (
    LOG_LEVELS,
    PRECISIONS,
    BuildOptions,
    OptionError,
    check_precisions,
    parse_memory_pool,
    parse_size,
    shape_ranges,
)
from trt_otel.session import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    exit_code_of,
    finish_spans,
    open_span_export,
    run_session,
    warn,
)
from trt_otel.simulator import SIMULATOR_VERSION, TraceError, load_trace
from trt_otel.sinks.otlp import PROTOCOLS, OtlpConfigError
from trt_otel.spans import DEFAULT_FOLD_UNDER_NS, DEFAULT_SPAN_BUDGET
from trt_otel.state import BuildState
from trt_otel.supervisor import DEFAULT_GRACE_S
from trt_otel.watch import WatchError, follow_journal, follow_url


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _seconds(text: str) -> float:
    """A duration: a plain number of seconds, or with a unit: ``90s``, ``15m``, ``2h``."""
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    stripped = text.strip().lower()
    for suffix in ("ms", "s", "m", "h"):
        if stripped.endswith(suffix):
            return _non_negative_float(stripped[: -len(suffix)]) * units[suffix]
    return _non_negative_float(stripped)


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return value


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def _http_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def _add_span_options(parser: argparse.ArgumentParser, *, flush_timeout_s: float = 3.0) -> None:
    group = parser.add_argument_group(
        "spans (OTEL_EXPORTER_OTLP_*, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES honoured)"
    )
    group.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export each phase as an OpenTelemetry span to this OTLP collector "
        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; no export without one)",
    )
    group.add_argument(
        "--otlp-protocol",
        choices=PROTOCOLS,
        help="OTLP transport (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc on port 4317 "
        "and http/protobuf elsewhere)",
    )
    group.add_argument(
        "--span-budget",
        type=_positive_int,
        default=DEFAULT_SPAN_BUDGET,
        metavar="N",
        help=f"after N spans, fold short leaf phases into their parent's span "
        f"(default: {DEFAULT_SPAN_BUDGET:,})",
    )
    group.add_argument(
        "--span-fold-under",
        type=_seconds,
        default=DEFAULT_FOLD_UNDER_NS / 1e9,
        metavar="DURATION",
        help="beyond the budget, fold leaf phases shorter than this (default: 1s)",
    )
    group.add_argument(
        "--otlp-flush-timeout",
        type=_seconds,
        default=flush_timeout_s,
        metavar="DURATION",
        help="at the end, wait at most this long for the last spans to be exported "
        f"(default: {flush_timeout_s:g}s)",
    )


def _add_builder_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "builder (named after trtexec; trtexec's spellings are accepted too)"
    )
    for precision in PRECISIONS:
        group.add_argument(
            f"--{precision}",
            dest="precisions",
            action="append_const",
            const=precision,
            help=f"allow {precision} kernels",
        )
    group.add_argument(
        "--strongly-typed",
        "--stronglyTyped",
        action="store_true",
        help="a strongly typed network: its own types decide precision (no precision flags)",
    )
    group.add_argument(
        "--workspace", metavar="SIZE", help="workspace memory pool limit (e.g. 4G, 512M)"
    )
    group.add_argument(
        "--mem-pool-size",
        "--memPoolSize",
        action="append",
        default=[],
        metavar="POOL:SIZE",
        help="a memory pool limit: workspace, dlaSRAM, dlaLocalDRAM, dlaGlobalDRAM, tacticDRAM, "
        "tacticSharedMem (repeatable, or comma-separated)",
    )
    group.add_argument(
        "--builder-optimization-level",
        "--builderOptimizationLevel",
        type=int,
        choices=range(6),
        metavar="0-5",
        help="builder optimization level (TensorRT's default: 3)",
    )
    group.add_argument(
        "--max-threads", type=int, metavar="N", help="builder threads (TensorRT's max_threads)"
    )
    group.add_argument(
        "--timing-cache",
        "--timingCacheFile",
        type=Path,
        metavar="FILE",
        help="load the timing cache from FILE if it exists, and save it there after the build",
    )
    group.add_argument(
        "--shapes",
        action="append",
        default=[],
        metavar="INPUT:MIN,OPT,MAX",
        help="shape range of a dynamic input, e.g. input:1x3x224x224,8x3x224x224,32x3x224x224",
    )
    for bound, word in (("min", "smallest"), ("opt", "tuned-for"), ("max", "largest")):
        group.add_argument(
            f"--{bound}-shapes",
            f"--{bound}Shapes",
            dest=f"{bound}_shapes",
            action="append",
            default=[],
            metavar="INPUT:DIMS,...",
            help=f"{word} shapes of dynamic inputs, as trtexec writes them",
        )
    group.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="info",
        help="least severe builder message kept as a log event (default: info)",
    )
    group.add_argument("--verbose", action="store_true", help="the same as --log-level verbose")


def _add_policy_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "cancel policies (any of them stops the build; the reason shows everywhere)"
    )
    group.add_argument(
        "--timeout", type=_positive_seconds, metavar="DURATION", help="stop after this long"
    )
    group.add_argument(
        "--stall-timeout",
        type=_positive_seconds,
        metavar="DURATION",
        help="stop when nothing progressed (no step, no phase started or finished) this long; "
        "real builds go silent for minutes, so allow for that",
    )
    group.add_argument(
        "--cancel-file",
        type=Path,
        metavar="PATH",
        help="stop when this file exists (its first line, if any, is the reason)",
    )
    group.add_argument(
        "--cancel-url",
        type=_http_url,
        metavar="URL",
        help="stop when this URL answers true (polled; see the README for the answer format)",
    )
    group.add_argument(
        "--cancel-url-interval",
        type=_positive_seconds,
        default=5.0,
        metavar="DURATION",
        help="how often to poll --cancel-url (default: 5s)",
    )
    group.add_argument(
        "--cancel-url-fail-closed",
        action="store_true",
        help="stop the build after 3 failed polls in a row (default: keep building)",
    )
    group.add_argument(
        "--grace",
        type=_seconds,
        default=DEFAULT_GRACE_S,
        metavar="DURATION",
        help="time a cancelled build gets to stop at TensorRT's next step before its process "
        f"is terminated (default: {DEFAULT_GRACE_S:g}s)",
    )
    group.add_argument(
        "--in-process",
        action="store_true",
        help="build in this process instead of a worker process: no escalation, so a silent "
        "build stops only at its next step",
    )


def _add_observability_options(parser: argparse.ArgumentParser) -> None:
    _add_policy_options(parser)
    _add_span_options(parser)
    group = parser.add_argument_group("observability")
    group.add_argument("--journal", type=Path, help="write the build's events to this JSONL file")
    group.add_argument(
        "--http-port",
        type=_port,
        metavar="PORT",
        help="serve /status, /events (SSE), /metrics, /healthz and POST /cancel on this port "
        "(0 picks a free one)",
    )
    group.add_argument(
        "--http-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address to serve HTTP on (default: 127.0.0.1)",
    )
    group.add_argument(
        "--cancel-token",
        metavar="TOKEN",
        help="bearer token POST /cancel requires (default: TRT_OTEL_CANCEL_TOKEN, else one is "
        "generated and written to a file only you can read)",
    )
    group.add_argument(
        "--gpu",
        metavar="GPU",
        help="the GPU to sample through NVML, by index or UUID (default: the first of "
        "CUDA_VISIBLE_DEVICES, else 0)",
    )
    group.add_argument(
        "--gpu-interval",
        type=_positive_seconds,
        default=1.0,
        metavar="DURATION",
        help="how often to sample the GPU (default: 1s)",
    )
    group.add_argument(
        "--no-gpu", action="store_true", help="do not sample the GPU (on where NVML is present)"
    )
    group.add_argument(
        "--history",
        type=Path,
        metavar="DIR",
        help="journals of earlier builds of this model, for an ETA from how long they took",
    )
    group.add_argument(
        "--prometheus-port",
        type=_port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (0 picks a free one)",
    )
    group.add_argument(
        "--prometheus-address",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address to serve metrics on (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    group.add_argument(
        "--prometheus-linger",
        type=_seconds,
        default=15.0,
        metavar="DURATION",
        help="after the build, wait up to this long for a last scrape (default: 15s)",
    )
    group.add_argument(
        "--pushgateway",
        type=_http_url,
        metavar="URL",
        help="push the final metrics to this Prometheus Pushgateway when the build ends",
    )
    group.add_argument(
        "--metrics-build-id",
        action="store_true",
        help="add the build id as a label of trt_build_info (one series per build)",
    )
    group.add_argument(
        "--no-progress",
        action="store_true",
        help="plain lines instead of the live tree (the default when not on a terminal)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
        type=_non_negative_float,
        default=1.0,
        help="time scale: 1 paces the build over tens of seconds, 2 twice as fast, "
        "0 as fast as possible (default: 1)",
    )
    demo.add_argument(
        "--silence",
        type=_seconds,
        default=0.0,
        metavar="DURATION",
        help="insert one silent window of this length (e.g. 90s), as real builds have",
    )
    demo.add_argument(
        "--threads", type=int, default=1, help="builder threads calling back (default: 1)"
    )
    demo.add_argument("-o", "--output", type=Path, help="write the simulated engine here")
    _add_builder_options(demo)
    _add_observability_options(demo)

    build = commands.add_parser(
        "build",
        help="build a TensorRT engine from an ONNX model",
        description="Build a real engine with TensorRT, observable and cancelable.",
    )
    build.add_argument("model", type=Path, help="the ONNX model")
    build.add_argument("-o", "--output", type=Path, required=True, help="the engine file")
    _add_builder_options(build)
    _add_observability_options(build)

    replay = commands.add_parser(
        "replay",
        help="show a recorded build again from its journal, and export its spans",
        description="Render a journal's final tree and, with an OTLP endpoint, export the same "
        "spans the live build did (same ids, times and attributes).",
    )
    replay.add_argument("journal", type=Path)
    _add_span_options(replay, flush_timeout_s=30.0)

    watch = commands.add_parser(
        "watch",
        help="follow a build running elsewhere (its HTTP endpoint or its journal)",
        description="Follow a build through its event stream (--url, a build started with "
        "--http-port) or its journal as it grows, with the build's own terminal view. Exits "
        "with the build's exit code (0, 3, 4), or 2 when it cannot be followed.",
    )
    watch.add_argument("journal", nargs="?", type=Path, help="a journal being written")
    watch.add_argument("--url", metavar="URL", help="the build's HTTP endpoint")
    watch.add_argument(
        "--no-progress", action="store_true", help="plain lines instead of the live tree"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "build":
            return _build(args)
        if args.command == "watch":
            return _watch(args)
        return _replay(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (
        UsageError,
        BuildSetupError,
        JournalError,
        TraceError,
        OtlpConfigError,
        WatchError,
    ) as error:
        print(f"trt-otel: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _demo(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise UsageError("--threads must be at least 1")
    if args.trace is not None:
        load_trace(args.trace)  # a bad trace is a usage error here, not a failure in the worker
    if args.model is not None:
        model_path, model = args.model, read_model(args.model)
        carried: bytes | None = None  # the worker reads the file itself
    else:
        model_path, model = Path("trt-otel-demo-mnist.onnx"), demo_model_bytes()
        carried = model
    attributes: dict[str, Any] = {
        "trt.backend": "simulator",
        "trt.version": SIMULATOR_VERSION,
        **model_attributes(model_path, model),
    }
    if args.trace is not None:
        attributes["simulator.trace"] = str(args.trace)
    options = _options(args)
    attributes.update(options.attributes())
    job = BuildJob(
        model_path=model_path,
        model=carried,
        engine_path=args.output,
        options=options,
        simulator=SimulatorSettings(speed=args.speed, silence_s=args.silence, trace=args.trace),
    )
    return run_session(job, args, attributes)


def _build(args: argparse.Namespace) -> int:
    model = read_model(args.model)
    if args.in_process or importlib.util.find_spec("tensorrt") is None:
        import_tensorrt()  # says how to install it, exit 2, when it is missing
    try:
        version = importlib.metadata.version("tensorrt")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    options = _options(args)
    attributes = {
        "trt.backend": "tensorrt",
        "trt.version": version,
        **model_attributes(args.model, model),
        **options.attributes(),
    }
    job = BuildJob(model_path=args.model, engine_path=args.output, options=options)
    return run_session(job, args, attributes)


def _options(args: argparse.Namespace) -> BuildOptions:
    """The builder options, checked: a bad one is exit 2 before anything starts."""
    threads = args.max_threads if args.max_threads is not None else getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise UsageError("--max-threads must be at least 1")
    precisions = tuple(dict.fromkeys(args.precisions or ()))
    try:
        check_precisions(precisions, args.strongly_typed)
        pools: dict[str, int] = {}
        if args.workspace is not None:
            pools["WORKSPACE"] = parse_size(args.workspace)
        for text in args.mem_pool_size:
            for item in text.split(","):
                pool, size = parse_memory_pool(item)
                pools[pool] = size
        shapes = shape_ranges(args.shapes, args.min_shapes, args.opt_shapes, args.max_shapes)
    except OptionError as error:
        raise UsageError(str(error)) from None
    if args.timing_cache is not None and args.timing_cache.is_dir():
        raise UsageError(f"--timing-cache {args.timing_cache} is a directory")
    return BuildOptions(
        precisions=precisions,
        strongly_typed=args.strongly_typed,
        memory_pools=pools,
        optimization_level=args.builder_optimization_level,
        max_threads=threads,
        timing_cache=args.timing_cache,
        shapes=shapes,
        log_level="verbose" if args.verbose else args.log_level,
    )


def _replay(args: argparse.Namespace) -> int:
    journal = read_journal(args.journal)
    for problem in journal.problems:
        print(f"trt-otel: {args.journal}: {problem}", file=sys.stderr)
    spans = open_span_export(args)
    state = BuildState()
    for event in journal.events:
        state.apply(event)
    Console(stderr=True).print(render_build(state))
    if spans is not None:
        # The same projection as the live run, fed the same events: the same spans.
        spans.handle(journal.events)
        spans.close()
        finish_spans(spans, args)
    return EXIT_OK


def _watch(args: argparse.Namespace) -> int:
    if (args.journal is None) == (args.url is None):
        raise UsageError("watch takes a journal or --url URL (one of them)")
    eta = EtaProjection()
    use_live = not args.no_progress and sys.stderr.isatty()
    console = LiveConsole(eta=eta) if use_live else PlainLines(sys.stderr)

    def show(events: Sequence[Event]) -> None:
        eta.handle(events)
        console.handle(events)

    try:
        if args.url is not None:
            end = follow_url(args.url, show, warn=warn)
        else:
            end = follow_journal(args.journal, show, warn=warn)
    finally:
        console.close()
    if end is None:
        print("trt-otel: error: lost the build before its end", file=sys.stderr)
        return EXIT_USAGE
    return exit_code_of(end.outcome)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
