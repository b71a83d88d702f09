"""One build as the command runs it: the log and its followers, the policies, the worker, and
the outcome turned into an exit code.

The command line only parses; this module wires. Exit codes (the contract): 0 built; 2 usage or
configuration error, before any build starts; 3 cancelled; 4 the build failed; 130 interrupted by
the user (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry

from trt_otel.build import BuildJob, BuildResult, partial_files, run_build_job
from trt_otel.console import LiveConsole, PlainLines
from trt_otel.durations import format_duration
from trt_otel.eta import EtaProjection, History
from trt_otel.events import Outcome
from trt_otel.followers import FollowerWorker
from trt_otel.gpu import GpuReader, GpuSampler, open_reader
from trt_otel.journal import JournalWriter
from trt_otel.log import EventLog
from trt_otel.monitor import BuildMonitor
from trt_otel.policies import (
    CancelFile,
    CancelUrl,
    Policy,
    PolicyRunner,
    Stall,
    Timeout,
    any_of,
)
from trt_otel.sinks.http import StatusServer
from trt_otel.sinks.otlp import OtlpSettings, OtlpSpanExport
from trt_otel.sinks.prometheus import BuildCollector, MetricsServer, push_build_metrics
from trt_otel.spans import TRACEPARENT_ATTRIBUTE, parse_traceparent, trace_id_for
from trt_otel.supervisor import IsolatedResult, run_isolated

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CANCELLED = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input found before a build starts (exit code 2)."""


def warn(message: str) -> None:
    print(f"trt-otel: warning: {message}", file=sys.stderr)


def run_session(job: BuildJob, args: argparse.Namespace, attributes: dict[str, Any]) -> int:
    """Run one build with everything the options ask for attached; returns the exit code."""
    policy = policy_from_options(args)
    gpu_reader = _open_gpu(args, attributes)
    log = EventLog()
    spans = open_span_export(args)
    _join_parent_trace(attributes)
    journal = _open_journal(args.journal) if args.journal is not None else None
    monitor = BuildMonitor(log=log, attributes=attributes)
    if journal is not None:
        log.follow(journal, capacity=1_000_000)
    if spans is not None:
        # Losing an event would misshape the tree, and this follower does no I/O: a deep queue.
        log.follow(spans, capacity=1_000_000)
    runner = PolicyRunner(monitor, policy, warn=warn) if policy is not None else None
    history = _load_history(args.history, attributes)
    eta = EtaProjection(history)
    log.follow(eta, capacity=1_000_000)
    metrics = _serve_metrics(monitor, args, spans, runner, eta)
    status = _serve_status(monitor, args, eta=eta, metrics=metrics, spans=spans, runner=runner)
    if spans is not None:
        remote = parse_traceparent(str(attributes.get(TRACEPARENT_ATTRIBUTE, "")))
        print(f"trace: {trace_id_for(monitor.build_id, remote):032x}", file=sys.stderr)
    if policy is not None:
        print(f"policy: {policy.describe()}", file=sys.stderr)
    use_live = not args.no_progress and sys.stderr.isatty()
    log.follow(LiveConsole(eta=eta) if use_live else PlainLines(sys.stderr, history=history))
    interrupted = False
    sampler = (
        GpuSampler(log, gpu_reader, interval_s=args.gpu_interval, warn=warn)
        if gpu_reader is not None
        else None
    )
    try:
        with _cancel_on_signals(monitor) as signals:
            monitor.start()
            if runner is not None:
                runner.start()
            if sampler is not None:
                sampler.start()
            if args.in_process:
                result = run_build_job(monitor, job)
            else:
                isolated = run_isolated(run_build_job, job, monitor=monitor, grace_s=args.grace)
                result = _conclude(monitor, isolated, job, args.grace)
                interrupted = isolated.interrupted
            interrupted = interrupted or signals.interrupted
    except KeyboardInterrupt:
        interrupted = True
        monitor.cancel("interrupted by the user", source="signal")
        monitor.end(Outcome.CANCELLATION, "interrupted by the user")
        result = None
    finally:
        if runner is not None:
            runner.stop()
        if sampler is not None:
            sampler.stop()
        workers = log.workers
        if not log.close(timeout_s=5.0):
            warn("a follower did not finish in time")
        _report_follower_health(workers)
        if spans is not None:
            finish_spans(spans, args)
        _finish_metrics(monitor, metrics, args)
        if status is not None:
            status.close()
            if status.token_file is not None:
                status.token_file.unlink(missing_ok=True)
    if journal is not None:
        print(f"journal: {journal.path}", file=sys.stderr)
    if interrupted:
        return EXIT_INTERRUPTED
    assert result is not None
    if result.outcome is Outcome.SUCCESS and result.engine_path is not None:
        print(f"engine: {result.engine_path} ({result.engine_bytes:,} bytes)", file=sys.stderr)
    if monitor.state.error_type == "BuildSetupError":  # found only where the build runs
        return EXIT_USAGE
    return exit_code_of(result.outcome)


def exit_code_of(outcome: Outcome) -> int:
    if outcome is Outcome.SUCCESS:
        return EXIT_OK
    if outcome in (Outcome.CANCELLATION, Outcome.TIMEOUT):
        return EXIT_CANCELLED
    return EXIT_FAILED


def _conclude(
    monitor: BuildMonitor, isolated: IsolatedResult, job: BuildJob, grace_s: float
) -> BuildResult:
    """Record how the worker ended, as the build's outcome."""
    if isolated.returned and isinstance(isolated.value, BuildResult):
        if monitor.state.outcome is None:  # its end event was lost with the worker
            monitor.end(isolated.value.outcome, isolated.value.detail)
        return isolated.value
    if job.engine_path is not None and isolated.pid is not None:
        for leftover in partial_files(job.engine_path, isolated.pid):
            leftover.unlink(missing_ok=True)
    cancel = monitor.state.cancel
    if isolated.stopped_with is not None:
        if isolated.interrupted or cancel is None:
            detail = (
                f"interrupted by the user; the build's process was stopped with "
                f"{isolated.stopped_with}"
            )
            monitor.end(Outcome.CANCELLATION, detail)
            return BuildResult(Outcome.CANCELLATION, detail, None, 0)
        outcome = Outcome.TIMEOUT if cancel.timeout else Outcome.CANCELLATION
        detail = (
            f"{cancel.reason}; TensorRT had not stopped {format_duration(grace_s)} later, "
            f"so its process was stopped with {isolated.stopped_with}"
        )
        monitor.end(outcome, detail)
        return BuildResult(outcome, detail, None, 0)
    if isolated.error is not None:
        detail = f"{isolated.error_type}: {isolated.error}"
        monitor.end(Outcome.FAILURE, detail, error_type=isolated.error_type)
        return BuildResult(Outcome.FAILURE, detail, None, 0)
    died = isolated.died or "ended without a result"
    signal_name = died.removeprefix("killed by ") if died.startswith("killed by ") else None
    detail = f"the build's process died ({died})"
    monitor.end(Outcome.FAILURE, detail, error_type=signal_name or "WorkerDied")
    return BuildResult(Outcome.FAILURE, detail, None, 0)


def policy_from_options(args: argparse.Namespace) -> Policy | None:
    """The cancel policy the options describe (any of them decides), or None."""
    policies: list[Policy] = []
    if args.timeout is not None:
        policies.append(Timeout(args.timeout))
    if args.stall_timeout is not None:
        policies.append(Stall(args.stall_timeout))
    if args.cancel_file is not None:
        policies.append(CancelFile(args.cancel_file))
    if args.cancel_url is not None:
        policies.append(
            CancelUrl(
                args.cancel_url,
                interval_s=args.cancel_url_interval,
                fail_closed=args.cancel_url_fail_closed,
            )
        )
    return any_of(*policies) if policies else None


# -- followers and sinks -------------------------------------------------------------------------


def open_span_export(args: argparse.Namespace) -> OtlpSpanExport | None:
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
    export = OtlpSpanExport(settings, warn=warn)
    print(f"spans: {settings.endpoint} ({settings.protocol})", file=sys.stderr)
    return export


def finish_spans(spans: OtlpSpanExport, args: argparse.Namespace) -> None:
    health = spans.shutdown(args.otlp_flush_timeout)
    lost = health.failed + health.dropped
    if lost:
        warn(
            f"{lost:,} spans not exported ({health.failed:,} refused or unreachable, "
            f"{health.dropped:,} dropped; last error: {health.last_error or 'none'})"
        )
    else:
        print(f"spans: {health.exported:,} exported", file=sys.stderr)


def _join_parent_trace(attributes: dict[str, Any]) -> None:
    """Inside a traced CI job (``TRACEPARENT`` set), the build's span joins the job's trace."""
    traceparent = os.environ.get("TRACEPARENT", "").strip()
    if not traceparent:
        return
    if parse_traceparent(traceparent) is None:
        warn(f"ignoring TRACEPARENT {traceparent!r}: not a W3C traceparent")
        return
    attributes[TRACEPARENT_ATTRIBUTE] = traceparent


def _open_gpu(args: argparse.Namespace, attributes: dict[str, Any]) -> GpuReader | None:
    """The build's GPU, sampled unless ``--no-gpu``; one line says which, or why not."""
    if args.no_gpu:
        return None
    reader, line = open_reader(args.gpu)
    print(line, file=sys.stderr)
    if reader is not None:
        attributes.update(reader.describe())
    return reader


def _load_history(directory: Path | None, attributes: dict[str, Any]) -> History | None:
    if directory is None:
        return None
    if not directory.is_dir():
        raise UsageError(f"--history {directory} is not a directory of journals")
    model = attributes.get("model.sha256")
    history = History.load(directory, str(model) if model is not None else None)
    print(
        f"history: {len(history.builds)} earlier builds of this model in {directory}"
        + (f" ({len(history.skipped)} journals not used)" if history.skipped else ""),
        file=sys.stderr,
    )
    return history


def _eta_seconds(eta: EtaProjection, monitor: BuildMonitor) -> Callable[[], float | None]:
    return lambda: eta.current(monitor.log.clock.mono_ns()).build.seconds


def _serve_status(
    monitor: BuildMonitor,
    args: argparse.Namespace,
    *,
    eta: EtaProjection,
    metrics: MetricsServer | None,
    spans: OtlpSpanExport | None,
    runner: PolicyRunner | None,
) -> StatusServer | None:
    if args.http_port is None:
        return None
    token, token_file = _cancel_token(args.cancel_token, monitor.build_id)
    if metrics is not None:
        registry = metrics.registry
    else:
        registry = CollectorRegistry(auto_describe=True)
        registry.register(
            BuildCollector(
                monitor,
                build_id_label=args.metrics_build_id,
                span_health=spans.queue.health if spans is not None else None,
                policy_health=runner.health if runner is not None else None,
                eta=_eta_seconds(eta, monitor),
            )
        )
    try:
        server = StatusServer(
            monitor,
            eta,
            registry,
            port=args.http_port,
            address=args.http_address,
            cancel_token=token,
        )
    except OSError as error:
        raise UsageError(
            f"cannot serve HTTP on {args.http_address}:{args.http_port}: {error.strerror or error}"
        ) from None
    monitor.log.follow(server.feed, capacity=1_000_000)
    server.token_file = token_file
    print(f"http: {server.url}/status  {server.url}/events", file=sys.stderr)
    if token_file is not None:
        print(
            f'cancel: curl -X POST -H "Authorization: Bearer $(cat {token_file})" '
            f"{server.url}/cancel",
            file=sys.stderr,
        )
    return server


def _cancel_token(given: str | None, build_id: str) -> tuple[str, Path | None]:
    """The bearer token for ``POST /cancel``: given (option or ``TRT_OTEL_CANCEL_TOKEN``), or
    generated for this build and written to a file only its owner can read."""
    token = given or os.environ.get("TRT_OTEL_CANCEL_TOKEN", "").strip()
    if token:
        return token, None
    token = secrets.token_urlsafe(32)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    directory = Path(base) / f"trt-otel-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid() or directory.stat().st_mode & 0o077:
        raise UsageError(f"{directory} is not private to this user; give --cancel-token")
    path = directory / f"{build_id}.token"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return token, path


def _serve_metrics(
    monitor: BuildMonitor,
    args: argparse.Namespace,
    spans: OtlpSpanExport | None,
    runner: PolicyRunner | None,
    eta: EtaProjection,
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
            policy_health=runner.health if runner is not None else None,
            eta=_eta_seconds(eta, monitor),
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
            warn(f"cannot push metrics to {args.pushgateway}: {error}")
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
            warn(
                f"{health.name}: {health.lost:,} events may be missing from it "
                f"({health.dropped:,} dropped from a full queue, {health.failed_events:,} in "
                f"{health.errors:,} failed batches; last error: {health.last_error or 'none'})"
            )


# -- signals -------------------------------------------------------------------------------------


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
