"""``trt-otel run -- COMMAND``: run a program unchanged, and observe and stop its builds.

The program runs as a child process with the same terminal, stdin, stdout and stderr (nothing
of its output goes through trt-otel), and with :mod:`trt_otel.capture.bootstrap` first on its
``PYTHONPATH``, which records its TensorRT builds (:mod:`trt_otel.capture.program` receives them).

Cancels and signals:

- A policy (or ``POST /cancel``) cancels the build being made: TensorRT stops at its next step
  and the program sees ``None``, as for any cancel. If TensorRT is still silent ``grace_s``
  later, the building process is stopped: SIGTERM, then SIGKILL ``kill_after_s`` later.
- SIGTERM (or SIGHUP, treated the same) to trt-otel cancels the build being made and every
  later one; a program still running ``grace_s`` later is stopped the same way. SIGUSR1, a
  scheduler's warning that the job's time limit is near (SLURM's ``--signal=B:USR1@N``), does
  the same, each build a timeout.
- Ctrl-C reaches the program from the terminal as usual; trt-otel cancels the build being made,
  so that the program sees its interrupt when TensorRT's next step comes rather than after the
  whole build. A second Ctrl-C stops the program at once.

Exit codes: the program's own when nothing was cancelled; 3 when trt-otel cancelled a build (a
policy, an HTTP request, SIGTERM, SIGUSR1); 130 after Ctrl-C; 4 when the program died of a
signal it was not sent by trt-otel; 2 when the program cannot be started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from trt_otel.app.config import UsageError
from trt_otel.capture.program import ProgramBuild, ProgramBuilds, ProgramChannel
from trt_otel.control.preemption import SignalCauses, StopCause
from trt_otel.control.signals import (
    STOP_SIGNALS,
    TIME_LIMIT_SIGNAL,
    handling_interrupts,
)
from trt_otel.control.stopping import polling, stop_process
from trt_otel.core.durations import format_duration
from trt_otel.core.events import CancelSource, Outcome

EXIT_CANCELLED = 3
EXIT_DIED = 4
EXIT_INTERRUPTED = 130

Say = Callable[[str], None]


class ProgramNotFoundError(UsageError):
    """The command cannot be started (exit code 2)."""


@dataclass(frozen=True, slots=True)
class ProgramExit:
    """How the program ended, and the exit code ``trt-otel run`` ends with."""

    exit_code: int
    returncode: int
    """The program's own (negative: the signal that killed it)."""
    summary: str


def resolve_command(command: Sequence[str]) -> list[str]:
    """The command with its program found on PATH, or ProgramNotFoundError saying why not."""
    if not command:
        raise ProgramNotFoundError("give the program to run after --, e.g. -- python build.py")
    program = command[0]
    found = shutil.which(program) if os.sep not in program else program
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise ProgramNotFoundError(f"cannot run {program!r}: no such program on PATH")
    return [program, *command[1:]]


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Signals:
    def __init__(self) -> None:
        self.interrupts = 0
        self.terminated = False
        self.terminated_by = "SIGTERM"
        """The request to stop that came first: SIGTERM or SIGHUP."""
        self.causes = SignalCauses(os.environ)
        """What a SIGTERM meant: a SLURM job being requeued is preempted."""


@contextlib.contextmanager
def _handle_signals(builds: ProgramBuilds, say: Say) -> Iterator[_Signals]:
    """SIGINT, SIGTERM, SIGHUP and SIGUSR1 cancel the build being made (and later ones; SIGHUP
    as SIGTERM, SIGUSR1 as a timeout, neither a kill with no end in the journal); the main
    loop does the rest. A handler
    runs between two bytecodes of the main thread, possibly while it holds a lock: it only
    counts, and hands the cancel to a thread of its own."""
    state = _Signals()

    def cancel(name: str | None, message: str) -> None:
        """Cancel for Ctrl-C (``name`` None), the scheduler's time-limit warning (a timeout), or
        the request to stop ``name``, whose cause the scheduler may tell (a SLURM job being
        requeued is preempted)."""
        cause = (
            StopCause("interrupted by the user", CancelSource.SIGNAL)
            if name is None
            else state.causes.of(name)
        )
        builds.cancel_all(cause.reason, cause.source, timeout=cause.timeout)
        say(message)

    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            state.interrupts += 1
            if state.interrupts > 1:
                return  # the main loop stops the program now
            args: tuple[str | None, str] = (
                None,
                "Ctrl-C: cancelling the build at TensorRT's next step (again to stop now)",
            )
        else:
            if not state.terminated:
                state.terminated_by = signal_name(signum)
            state.terminated = True
            name = state.terminated_by
            why = " (the job's time limit is near)" if name == TIME_LIMIT_SIGNAL.name else ""
            args = (name, f"{name}{why}: cancelling the builds")
        threading.Thread(target=cancel, args=args, name="trt-otel-signal", daemon=True).start()

    with handling_interrupts(handler, (*STOP_SIGNALS, TIME_LIMIT_SIGNAL)):
        yield state


# Long: the program's whole life in one loop (start, wait, cancel's grace, Ctrl-C, stop),
# read top to bottom; each step is a call.
def run_program(
    command: Sequence[str],
    builds: ProgramBuilds,
    *,
    grace_s: float,
    kill_after_s: float = 5.0,
    say: Say,
    env: dict[str, str] | None = None,
    poll_s: float = 0.1,
    signal_grace_s: float | None = None,
) -> ProgramExit:
    """Run ``command`` with its builds recorded into ``builds``; returns how it ended. Once a
    signal has asked to stop, ``signal_grace_s`` (the stop budget's share) is the grace."""
    argv = resolve_command(command)
    channel = ProgramChannel(builds, warn=lambda m: say(f"warning: {m}"))
    try:
        try:
            process = subprocess.Popen(argv, env=channel.environment(env or os.environ))
        except OSError as error:
            raise ProgramNotFoundError(
                f"cannot run {argv[0]!r}: {error.strerror or error}"
            ) from None

        def program_ended_within(timeout_s: float) -> bool:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True

        stopped_with: str | None = None
        stopped_why = ""
        terminated_at: float | None = None
        with _handle_signals(builds, say) as signals:
            while process.poll() is None:
                program_ended_within(poll_s)
                if process.returncode is not None:
                    break
                if signals.interrupts > 1 and stopped_with is None:
                    say("Ctrl-C again: stopping the program now")
                    stopped_why = "interrupted by the user"
                    stopped_with = stop_process(process.pid, program_ended_within, kill_after_s)
                    continue
                if signals.terminated and terminated_at is None:
                    terminated_at = time.monotonic()
                if (signals.terminated or signals.interrupts) and signal_grace_s is not None:
                    grace_s = min(grace_s, signal_grace_s)
                overdue = builds.overdue(grace_s)
                if overdue is not None:
                    stopped_why = _stop_overdue(
                        overdue,
                        process,
                        program_ended_within=program_ended_within,
                        grace_s=grace_s,
                        kill_after_s=kill_after_s,
                        say=say,
                    )
                    if overdue.process.pid == process.pid:
                        stopped_with = overdue.stopped_with
                elif (
                    terminated_at is not None
                    and stopped_with is None
                    and time.monotonic() - terminated_at >= grace_s
                ):
                    name = signals.terminated_by
                    say(f"the program is still running {format_duration(grace_s)} after {name}")
                    stopped_why = f"received {name}"
                    stopped_with = stop_process(process.pid, program_ended_within, kill_after_s)
        returncode = process.returncode
        if not channel.drain(5.0):
            say("warning: a process of the program still holds its connection; not waiting")
        builds.end_unfinished(
            lambda build: _unfinished(build, returncode, process.pid, stopped_with, grace_s)
        )
        return _conclude(builds, returncode, signals, stopped_with, stopped_why)
    finally:
        channel.close()


def _stop_overdue(
    build: ProgramBuild,
    process: subprocess.Popen[bytes],
    *,
    program_ended_within: Callable[[float], bool],
    grace_s: float,
    kill_after_s: float,
    say: Say,
) -> str:
    pid = build.process.pid
    say(
        f"build {build.index}: TensorRT has not stopped {format_duration(grace_s)} after the "
        f"cancel; stopping {'the program' if pid == process.pid else f'process {pid}'}"
    )
    wait = program_ended_within if pid == process.pid else polling(pid)
    build.stopped_with = stop_process(pid, wait, kill_after_s)
    monitor = build.monitor
    cancel = monitor.state.cancel if monitor is not None else None
    return cancel.reason if cancel is not None else "cancelled"


def _unfinished(
    build: ProgramBuild,
    returncode: int,
    program_pid: int,
    stopped_with: str | None,
    grace_s: float,
) -> tuple[Outcome, str, str]:
    """How a build ended whose process ended first."""
    monitor = build.monitor
    cancel = monitor.state.cancel if monitor is not None else None
    signal_sent = build.stopped_with or (stopped_with if build.process.pid == program_pid else None)
    if signal_sent is not None and cancel is not None:
        outcome = Outcome.TIMEOUT if cancel.timeout else Outcome.CANCELLATION
        if build.stopped_with is not None:
            detail = (
                f"{cancel.reason}; TensorRT had not stopped {format_duration(grace_s)} later, so "
                f"its process was stopped with {signal_sent}"
            )
        else:
            detail = f"{cancel.reason}; the program was stopped with {signal_sent}"
        return outcome, detail, "timeout" if cancel.timeout else "Cancelled"
    if build.process.pid != program_pid:
        return (
            Outcome.FAILURE,
            f"process {build.process.pid} of the program ended during the build",
            "ProgramExited",
        )
    if returncode < 0:
        name = signal_name(-returncode)
        return Outcome.FAILURE, f"the program died during the build (killed by {name})", name
    return (
        Outcome.FAILURE,
        f"the program exited (exit code {returncode}) during the build",
        "ProgramExited",
    )


def _conclude(
    builds: ProgramBuilds,
    returncode: int,
    signals: _Signals,
    stopped_with: str | None,
    stopped_why: str,
) -> ProgramExit:
    made = len(builds.all)
    if made == 0:
        what = "the program made no TensorRT build"
    else:
        counts = ", ".join(f"{n} {o.value}" for o, n in sorted(builds.outcomes.items()))
        what = f"{made} build{'s' if made != 1 else ''}: {counts}"
    if stopped_with is not None:
        how = f"stopped with {stopped_with} ({stopped_why})"
    elif returncode < 0:
        how = f"killed by {signal_name(-returncode)}"
    else:
        how = f"exit code {returncode}"
    summary = f"{what}; the program ended: {how}"
    if signals.interrupts or returncode == -signal.SIGINT:
        code = EXIT_INTERRUPTED
    elif builds.cancelled_by_us or signals.terminated:
        code = EXIT_CANCELLED
    elif returncode < 0:
        code = EXIT_DIED
    else:
        code = returncode
    return ProgramExit(code, returncode, summary)
