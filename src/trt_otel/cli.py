"""The ``trt-otel`` command: ``demo``, ``build`` and ``replay``.

Exit codes (the contract): 0 built; 2 usage or configuration error, before any build starts;
3 cancelled; 4 the build failed; 130 interrupted by the user (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from trt_otel import __version__
from trt_otel.build import (
    BuildOptions,
    BuildSetupError,
    import_tensorrt,
    model_attributes,
    read_model,
    run_build,
)
from trt_otel.console import LiveConsole, PlainLines, render_build
from trt_otel.events import Outcome
from trt_otel.followers import FollowerWorker
from trt_otel.journal import JournalError, JournalWriter, read_journal
from trt_otel.log import EventLog
from trt_otel.model import demo_model_bytes
from trt_otel.monitor import BuildMonitor
from trt_otel.simulator import SimulatedTensorRT, TraceError, load_trace
from trt_otel.sinks.otlp import PROTOCOLS, OtlpConfigError, OtlpSettings, OtlpSpanExport
from trt_otel.sinks.prometheus import MetricsServer, push_build_metrics
from trt_otel.spans import (
    DEFAULT_FOLD_UNDER_NS,
    DEFAULT_SPAN_BUDGET,
    TRACEPARENT_ATTRIBUTE,
    parse_traceparent,
    trace_id_for,
)
from trt_otel.state import BuildState

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CANCELLED = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input found before a build starts (exit code 2)."""


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


def _add_observability_options(parser: argparse.ArgumentParser) -> None:
    _add_span_options(parser)
    group = parser.add_argument_group("observability")
    group.add_argument("--journal", type=Path, help="write the build's events to this JSONL file")
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
    _add_observability_options(demo)

    build = commands.add_parser(
        "build",
        help="build a TensorRT engine from an ONNX model",
        description="Build a real engine with TensorRT, observable and cancelable.",
    )
    build.add_argument("model", type=Path, help="the ONNX model")
    build.add_argument("-o", "--output", type=Path, required=True, help="the engine file")
    build.add_argument("--max-threads", type=int, help="builder threads (TensorRT's max_threads)")
    _add_observability_options(build)

    replay = commands.add_parser(
        "replay",
        help="show a recorded build again from its journal, and export its spans",
        description="Render a journal's final tree and, with an OTLP endpoint, export the same "
        "spans the live build did (same ids, times and attributes).",
    )
    replay.add_argument("journal", type=Path)
    _add_span_options(replay, flush_timeout_s=30.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "build":
            return _build(args)
        return _replay(args)
    except (UsageError, BuildSetupError, JournalError, TraceError, OtlpConfigError) as error:
        print(f"trt-otel: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _demo(args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise UsageError("--threads must be at least 1")
    trace = load_trace(args.trace) if args.trace is not None else None
    trt = SimulatedTensorRT(speed=args.speed, silence_s=args.silence, trace=trace)
    if args.model is not None:
        model_path, model = args.model, read_model(args.model)
    else:
        model_path, model = Path("trt-otel-demo-mnist.onnx"), demo_model_bytes()
    attributes: dict[str, Any] = {
        "trt.backend": "simulator",
        "trt.version": trt.__version__,
        **model_attributes(model_path, model),
    }
    if args.trace is not None:
        attributes["simulator.trace"] = str(args.trace)
    return _run(trt, model_path, model, args, attributes)


def _build(args: argparse.Namespace) -> int:
    model = read_model(args.model)
    trt = import_tensorrt()
    attributes = {
        "trt.backend": "tensorrt",
        "trt.version": str(getattr(trt, "__version__", "unknown")),
        **model_attributes(args.model, model),
    }
    return _run(trt, args.model, model, args, attributes)


def _run(
    trt: Any, model_path: Path, model: bytes, args: argparse.Namespace, attributes: dict[str, Any]
) -> int:
    log = EventLog()
    spans = _open_span_export(args)
    _join_parent_trace(attributes)
    journal = _open_journal(args.journal) if args.journal is not None else None
    monitor = BuildMonitor(log=log, attributes=attributes)
    if journal is not None:
        log.follow(journal, capacity=1_000_000)
    if spans is not None:
        # Losing an event would misshape the tree, and this follower does no I/O: a deep queue.
        log.follow(spans, capacity=1_000_000)
    metrics = _serve_metrics(monitor, args, spans)
    if spans is not None:
        remote = parse_traceparent(str(attributes.get(TRACEPARENT_ATTRIBUTE, "")))
        print(f"trace: {trace_id_for(monitor.build_id, remote):032x}", file=sys.stderr)
    use_live = not args.no_progress and sys.stderr.isatty()
    log.follow(LiveConsole() if use_live else PlainLines(sys.stderr))
    interrupted = False
    try:
        with _cancel_on_signals(monitor) as signals:
            monitor.start()
            result = run_build(
                trt,
                model_path,
                model,
                monitor,
                engine_path=getattr(args, "output", None),
                options=_options(args),
            )
            interrupted = signals.interrupted
    except KeyboardInterrupt:
        interrupted = True
        monitor.cancel("interrupted by the user", source="signal")
        monitor.end(Outcome.CANCELLATION, "interrupted by the user")
        result = None
    finally:
        workers = log.workers
        if not log.close(timeout_s=5.0):
            print("trt-otel: warning: a follower did not finish in time", file=sys.stderr)
        _report_follower_health(workers)
        if spans is not None:
            _finish_spans(spans, args)
        _finish_metrics(monitor, metrics, args)
    if journal is not None:
        print(f"journal: {journal.path}", file=sys.stderr)
    if interrupted:
        return EXIT_INTERRUPTED
    assert result is not None
    if result.outcome is Outcome.SUCCESS:
        if result.engine_path is not None:
            print(f"engine: {result.engine_path} ({result.engine_bytes:,} bytes)", file=sys.stderr)
        return EXIT_OK
    if result.outcome in (Outcome.CANCELLATION, Outcome.TIMEOUT):
        return EXIT_CANCELLED
    return EXIT_FAILED


def _open_span_export(args: argparse.Namespace) -> OtlpSpanExport | None:
    settings = OtlpSettings.resolve(
        args.otlp_endpoint,
        args.otlp_protocol,
        span_budget=args.span_budget,
        fold_under_ns=round(args.span_fold_under * 1e9),
    )
    if settings is None:
        return None
    # The exporters' own log lines would repeat every retry on the terminal; the export queue
    # reports the first failure itself, and counts the rest.
    logging.getLogger("opentelemetry").propagate = False
    export = OtlpSpanExport(settings, warn=_warn)
    print(f"spans: {settings.endpoint} ({settings.protocol})", file=sys.stderr)
    return export


def _join_parent_trace(attributes: dict[str, Any]) -> None:
    """Inside a traced CI job (``TRACEPARENT`` set), the build's span joins the job's trace."""
    traceparent = os.environ.get("TRACEPARENT", "").strip()
    if not traceparent:
        return
    if parse_traceparent(traceparent) is None:
        _warn(f"ignoring TRACEPARENT {traceparent!r}: not a W3C traceparent")
        return
    attributes[TRACEPARENT_ATTRIBUTE] = traceparent


def _finish_spans(spans: OtlpSpanExport, args: argparse.Namespace) -> None:
    health = spans.shutdown(args.otlp_flush_timeout)
    lost = health.failed + health.dropped
    if lost:
        _warn(
            f"{lost:,} spans not exported ({health.failed:,} refused or unreachable, "
            f"{health.dropped:,} dropped; last error: {health.last_error or 'none'})"
        )
    else:
        print(f"spans: {health.exported:,} exported", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"trt-otel: warning: {message}", file=sys.stderr)


def _serve_metrics(
    monitor: BuildMonitor, args: argparse.Namespace, spans: OtlpSpanExport | None = None
) -> MetricsServer | None:
    if args.prometheus_port is None:
        return None
    try:
        server = MetricsServer(
            monitor,
            args.prometheus_port,
            args.prometheus_address,
            build_id_label=args.metrics_build_id,
            span_health=spans.queue.health if spans is not None else None,
        )
    except OSError as error:
        raise UsageError(
            f"cannot serve metrics on {args.prometheus_address}:{args.prometheus_port}: "
            f"{error.strerror or error}"
        ) from None
    print(f"metrics: http://{server.address}:{server.port}/metrics", file=sys.stderr)
    return server


def _finish_metrics(
    monitor: BuildMonitor, server: MetricsServer | None, args: argparse.Namespace
) -> None:
    """Let the final values reach Prometheus: push them, and wait for a last scrape."""
    if args.pushgateway is not None:
        try:
            push_build_metrics(monitor, args.pushgateway, build_id_label=args.metrics_build_id)
        except OSError as error:
            print(
                f"trt-otel: warning: cannot push metrics to {args.pushgateway}: {error}",
                file=sys.stderr,
            )
    if server is not None:
        began = time.monotonic()
        if server.linger(args.prometheus_linger):
            waited = time.monotonic() - began
            print(f"metrics: final values scraped after {waited:.1f}s", file=sys.stderr)
        server.close()


def _open_journal(path: Path) -> JournalWriter:
    try:
        return JournalWriter(path)
    except OSError as error:
        raise UsageError(f"cannot write journal {path}: {error.strerror or error}") from None


def _report_follower_health(workers: Sequence[FollowerWorker]) -> None:
    """Say what a follower lost or failed at; the build itself was not affected."""
    for worker in workers:
        health = worker.health()
        if health.dropped or health.errors:
            print(
                f"trt-otel: warning: {health.name}: {health.dropped:,} events dropped, "
                f"{health.errors:,} errors (last: {health.last_error or 'none'})",
                file=sys.stderr,
            )


def _options(args: argparse.Namespace) -> BuildOptions:
    threads = getattr(args, "threads", None) or getattr(args, "max_threads", None)
    return BuildOptions(max_threads=threads)


class _SignalState:
    interrupted = False
    received = 0


@contextlib.contextmanager
def _cancel_on_signals(monitor: BuildMonitor) -> Iterator[_SignalState]:
    """First SIGINT or SIGTERM: cancel gracefully at the next step. Second: stop now."""
    state = _SignalState()

    def cancel(name: str) -> None:
        if monitor.cancel(f"received {name}", source="signal"):
            print(
                f"\ntrt-otel: {name}: cancelling at TensorRT's next step (again to stop now)",
                file=sys.stderr,
            )

    def handler(signum: int, frame: FrameType | None) -> None:
        # A handler runs on the main thread between two bytecodes, possibly while that thread
        # holds the event log's lock inside a callback (or is writing to stderr): it must take
        # no lock and do no I/O itself, so the cancel is handed to a thread of its own.
        name = signal.Signals(signum).name
        if signum == signal.SIGINT:
            state.interrupted = True
        state.received += 1
        if state.received > 1 or monitor.cancelled:
            raise KeyboardInterrupt
        threading.Thread(target=cancel, args=(name,), name="trt-otel-signal", daemon=True).start()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _replay(args: argparse.Namespace) -> int:
    journal = read_journal(args.journal)
    for problem in journal.problems:
        print(f"trt-otel: {args.journal}: {problem}", file=sys.stderr)
    spans = _open_span_export(args)
    state = BuildState()
    for event in journal.events:
        state.apply(event)
    Console(stderr=True).print(render_build(state))
    if spans is not None:
        # The same projection as the live run, fed the same events: the same spans.
        spans.handle(journal.events)
        spans.close()
        _finish_spans(spans, args)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
