"""One build as the command runs it: the log and its followers, the policies, the worker, and
the outcome turned into an exit code.

:func:`run_session` reads as the architecture: every part is a context manager (see
:mod:`trt_otel.app.components`) entered into one :class:`~contextlib.ExitStack` in the order of
the design's diagram, so they stop in reverse: the build first, then the policies and the GPU
sampler, then the log's followers (which drain into the sinks), then the sinks themselves.

Exit codes (the contract): 0 built; 2 usage or configuration error, before any build starts;
3 cancelled; 4 the build failed; 130 interrupted by the user (Ctrl-C).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from trt_otel.app.assembly import attach_session, policy_runner
from trt_otel.app.components import build_context, sampling
from trt_otel.app.config import SessionConfig, UsageError, signal_grace_s
from trt_otel.app.engine_store import StoreVisit, stored_builds, visit_store
from trt_otel.builder.build import BuildJob, BuildResult, partial_files, run_build_job
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.supervisor import IsolatedResult, StopNow, run_isolated
from trt_otel.control.preemption import SignalCauses, received
from trt_otel.control.signals import (
    STOP_SIGNALS,
    TIME_LIMIT_SIGNAL,
    StopClock,
    handling_interrupts,
)
from trt_otel.core.durations import format_duration
from trt_otel.core.eta import History
from trt_otel.core.events import CancelSource, Outcome
from trt_otel.core.forecast import Forecast, forecast
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.terminal import say, warn
from trt_otel.views.trace_ids import TRACEPARENT_ATTRIBUTE, parse_traceparent, trace_id_for

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Ended",
    "UsageError",
    "exit_code_of",
    "run_build",
    "run_session",
    "warn",
]

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_CANCELLED = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130

if TYPE_CHECKING:  # made by the components, or here, only when asked for
    from trt_otel.control.policies import Decision
    from trt_otel.control.runner import PolicyRunner


@dataclass(frozen=True, slots=True)
class Ended:
    """How one build ended, for what comes after it (a retry ladder's next rung)."""

    exit_code: int
    build_id: str
    outcome: Outcome | None
    """None when the user interrupted it."""
    cancel_source: str | None
    error_type: str | None
    detail: str


def run_session(job: BuildJob, config: SessionConfig, attributes: dict[str, Any]) -> int:
    """Run one build with everything ``config`` asks for attached; returns the exit code."""
    return run_build(job, config, attributes).exit_code


def run_build(job: BuildJob, config: SessionConfig, attributes: dict[str, Any]) -> Ended:
    """Run one build with everything ``config`` asks for attached; how it ended."""
    observe = config.observe
    with contextlib.ExitStack() as stack:
        gpu, history = build_context(stack, observe, attributes, config.policy, fingerprinted=True)
        visit = visit_store(stack, config.store, job, attributes)  # served, or why it is built
        ahead = _forecast(history, attributes, visit)
        model = ReadModel(history)  # the build folded once, for every view below
        policy = config.policy.policy(history=history, project=model.project)
        # Only a build in this process attaches this monitor to a builder library, and keeps
        # the minimum on TensorRT's threads (the model follows); a supervisor's monitor, which
        # replays its worker's callbacks, folds the model itself.
        monitor = BuildMonitor(
            attributes=attributes,
            backend=job.monitor_backend if config.in_process else "none",
            forget_closed=True,
            model=None if config.in_process else model,
        )
        runner = policy_runner(monitor, policy)
        stop = StopClock(config.policy.stop_budget_s)
        attach_session(
            stack,
            monitor,
            observe,
            model=model,
            runner=runner,
            attributes=attributes,
            console=observe.console,
            before_following=lambda views: _announce(
                monitor.build_id, attributes, views.spans is not None, runner
            ),
            stop=stop,
        )

        # Things that act during the build: policies, the samplers, signal handlers.
        monitor.start()
        # Asked before the runner starts, so the refusal is the first decision, not a check's.
        refused = runner.check_before_start() if runner is not None else None
        if runner is not None and refused is None:
            stack.enter_context(runner)
        watch = stack.enter_context(sampling(monitor, gpu, observe.sample_interval_s))
        signals = stack.enter_context(_cancel_on_signals(monitor, stop))
        result, interrupted = _make(
            monitor, job, config, refused=refused, visit=visit, watch=watch, signals=signals
        )
        interrupted = _interrupted(result, interrupted, signals)
    if observe.journal is not None:
        say(f"journal: {observe.journal}")
    state = monitor.state
    cancel_source = state.cancel.source if state.cancel is not None else None
    if interrupted:
        return Ended(EXIT_INTERRUPTED, monitor.build_id, None, cancel_source, None, "")
    assert result is not None
    if result.outcome is Outcome.SUCCESS and result.engine_path is not None:
        say(f"engine: {result.engine_path} ({result.engine_bytes:,} bytes)")
    if ahead is not None and result.outcome is Outcome.SUCCESS and state.end_mono_ns is not None:
        assert state.start_mono_ns is not None
        say(f"forecast: {ahead.judged((state.end_mono_ns - state.start_mono_ns) / 1e9)}")
    # A setup error is found only where the build runs.
    code = EXIT_USAGE if state.error_type == "BuildSetupError" else exit_code_of(result.outcome)
    detail = result.detail or state.outcome_detail or ""
    return Ended(code, monitor.build_id, result.outcome, cancel_source, state.error_type, detail)


def _forecast(
    history: History | None, attributes: dict[str, Any], visit: StoreVisit | None
) -> Forecast | None:
    """What a build about to be made is expected to take, said and put in its record (and so
    in /status, the fleet's status and its span); none for an engine the store serves."""
    if visit is not None and visit.served is not None:
        return None
    ahead = forecast(history, attributes, stored=stored_builds(visit))
    if ahead is not None:
        attributes.update(ahead.attributes())
        say(f"forecast: {ahead.describe()}")
    return ahead


def _announce(
    build_id: str, attributes: dict[str, Any], spans: bool, runner: PolicyRunner | None
) -> None:
    if spans:
        remote = parse_traceparent(str(attributes.get(TRACEPARENT_ATTRIBUTE, "")))
        say(f"trace: {trace_id_for(build_id, remote):032x}")
    if runner is not None:
        say(f"policy: {runner.policy.describe()}")


def _make(
    monitor: BuildMonitor,
    job: BuildJob,
    config: SessionConfig,
    *,
    refused: Decision | None,
    visit: StoreVisit | None,
    watch: Callable[[int], None],
    signals: _SignalState,
) -> tuple[BuildResult | None, bool]:
    """The engine made: refused before the build starts (nothing is spent), served from the
    engine store, or built (and stored); its result, and whether the user interrupted it."""
    if refused is not None:
        outcome = monitor.end()  # the cancel's: a timeout
        return BuildResult(outcome, refused.reason, None, 0), False
    if visit is not None and visit.served is not None:
        return visit.record_served(monitor, job), False
    result, interrupted = _build(monitor, job, config, watch, signals)
    if visit is not None and not signals.interrupted:
        visit.keep(monitor, result, job)
    return result, interrupted


def _build(
    monitor: BuildMonitor,
    job: BuildJob,
    config: SessionConfig,
    watch: Callable[[int], None],
    signals: _SignalState,
) -> tuple[BuildResult | None, bool]:
    """Run the build (in a worker process unless asked not to); its result, and whether the
    user interrupted it. ``watch`` is told the process that builds, for the samplers."""
    try:
        if config.in_process:
            watch(os.getpid())
            return run_build_job(monitor, job), False
        isolated = run_isolated(
            run_build_job,
            job,
            monitor=monitor,
            grace_s=config.policy.grace_s,
            signal_grace_s=signal_grace_s(config),
            backend=job.monitor_backend,
            on_start=watch,
        )
        return _conclude(monitor, isolated, job, signals), isolated.interrupted
    except StopNow as stop:  # in-process: nothing to stop but this build, which ends here
        detail = f"received {stop.signal_name} again: stopped at once"
        monitor.cancel(f"received {stop.signal_name}", source=CancelSource.SIGNAL)
        monitor.end(Outcome.CANCELLATION, detail)
        return BuildResult(Outcome.CANCELLATION, detail, None, 0), False
    except KeyboardInterrupt:
        monitor.cancel("interrupted by the user", source=CancelSource.SIGNAL)
        monitor.end(Outcome.CANCELLATION, "interrupted by the user")
        return None, True


def _interrupted(result: BuildResult | None, stopped: bool, signals: _SignalState) -> bool:
    """Whether the user interrupted the build (exit 130): a Ctrl-C that stopped it, or one that
    came while it ran and did not succeed. One that came as it ended (the engine saved, the
    success recorded) changes nothing of it: the exit says what the journal says."""
    if stopped:
        return True
    succeeded = result is not None and result.outcome is Outcome.SUCCESS
    if signals.interrupted and succeeded:
        say("Ctrl-C came as the build succeeded: the engine is kept")
    return signals.interrupted and not succeeded


def exit_code_of(outcome: Outcome) -> int:
    if outcome is Outcome.SUCCESS:
        return EXIT_OK
    if outcome in (Outcome.CANCELLATION, Outcome.TIMEOUT):
        return EXIT_CANCELLED
    return EXIT_FAILED


def _conclude(
    monitor: BuildMonitor, isolated: IsolatedResult, job: BuildJob, signals: _SignalState
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
        if isolated.stopped_now is not None:
            detail = (
                f"received {isolated.stopped_now} again; the build's process was stopped with "
                f"{isolated.stopped_with}"
            )
            monitor.end(Outcome.CANCELLATION, detail)
            return BuildResult(Outcome.CANCELLATION, detail, None, 0)
        if isolated.interrupted or cancel is None:
            detail = (
                f"interrupted by the user; the build's process was stopped with "
                f"{isolated.stopped_with}"
            )
            monitor.end(Outcome.CANCELLATION, detail)
            return BuildResult(Outcome.CANCELLATION, detail, None, 0)
        outcome = Outcome.TIMEOUT if cancel.timeout else Outcome.CANCELLATION
        detail = (
            f"{cancel.reason}; TensorRT had not stopped {format_duration(isolated.grace_s)} "
            "later, "
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
    if signal_name is not None and signal_name in signals.names:
        return _stopped_with_its_group(monitor, signal_name, signals.causes)
    detail = f"the build's process died ({died})"
    monitor.end(Outcome.FAILURE, detail, error_type=signal_name or "WorkerDied")
    return BuildResult(Outcome.FAILURE, detail, None, 0)


def _stopped_with_its_group(
    monitor: BuildMonitor, signal_name: str, causes: SignalCauses
) -> BuildResult:
    """The worker died of the signal this process received: one sent to the whole process
    group or job (SLURM's ``scancel`` or preemption, ``kill -- -PGID``, a runner stopping a
    process tree). A request to stop, honoured at once where the worker does not ignore it: a
    cancel (or a preemption), never a failure of the build."""
    cause = causes.of(signal_name)
    monitor.cancel(cause.reason, source=cause.source, timeout=cause.timeout)
    if cause == received(signal_name):
        detail = (
            f"received {signal_name}, and so did the build's process (the whole process group "
            "was signalled): it stopped at once"
        )
    else:
        detail = (
            f"{cause.reason}; {signal_name} reached the build's process too (the whole job was "
            "signalled): it stopped at once"
        )
    outcome = Outcome.TIMEOUT if cause.timeout else Outcome.CANCELLATION
    monitor.end(outcome, detail)
    return BuildResult(outcome, detail, None, 0)


# -- signals -------------------------------------------------------------------------------------


class _SignalState:
    """What the handler saw; written only by the handler, on the main thread. ``causes`` says
    what each signal meant (a SIGTERM may be the scheduler preempting the job)."""

    def __init__(self) -> None:
        self.interrupted = False
        self.received = 0
        self.names: list[str] = []
        self.causes = SignalCauses(os.environ)


@contextlib.contextmanager
def _cancel_on_signals(monitor: BuildMonitor, stop: StopClock) -> Iterator[_SignalState]:
    """First SIGINT, SIGTERM, SIGHUP (treated as SIGTERM) or SIGUSR1 (a scheduler's warning
    of the job's time limit: a timeout): cancel gracefully at the next step. Second: stop now."""
    state = _SignalState()

    def cancel(name: str) -> None:
        cause = state.causes.of(name)
        if monitor.cancel(cause.reason, source=cause.source, timeout=cause.timeout):
            print(
                f"\ntrt-otel: {name}: cancelling at TensorRT's next step (again to stop now)",
                file=sys.stderr,
            )

    def handler(signum: int, frame: FrameType | None) -> None:
        # A handler runs on the main thread between two bytecodes, possibly while that thread
        # holds the event log's lock inside a callback (or is writing to stderr): it must take
        # no lock and do no I/O itself, so the cancel is handed to a thread of its own.
        name = signal.Signals(signum).name
        stop.asked()
        if signum == signal.SIGINT:
            state.interrupted = True
        state.received += 1
        state.names.append(name)
        if state.received > 1 or monitor.cancelled:
            # SIGTERM is a request to stop, every time (exit 3); only Ctrl-C is the user's
            # interrupt (130).
            raise KeyboardInterrupt if state.interrupted else StopNow(name)
        threading.Thread(target=cancel, args=(name,), name="trt-otel-signal", daemon=True).start()

    with handling_interrupts(handler, (*STOP_SIGNALS, TIME_LIMIT_SIGNAL)):
        yield state
