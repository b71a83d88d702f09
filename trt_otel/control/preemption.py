"""What a stop signal means: someone cancelling the build, or the scheduler taking its job back.

SLURM stops a job it preempts with requeue (``PreemptMode=REQUEUE``), and one that
``scontrol requeue`` or a failed node sends back to the queue, as it stops one that ``scancel``
cancels: SIGTERM to every process of the job, SIGKILL ``KillWait`` later. Only the controller
tells them apart, and it does so at once: when the signal arrives, the job's ``Restarts``
counter already counts the requeue, while the run being stopped started with the count in its
``SLURM_RESTART_COUNT`` (unset on the first run). A build stopped that way is preempted, not
cancelled by a person and not failed: it will run again. The job's time limit, with no warning
asked for, stops it the same way too, and the controller then gives ``Reason=TimeLimit``: a
timeout. What is left is a cancel, SLURM's (``scancel``), and the reason says so.

Asked once per signal name (:class:`SignalCauses`): the first signal's handler and the reading
of a worker that died of the same signal agree on one answer.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trt_otel.control.signals import TIME_LIMIT_REASON, TIME_LIMIT_SIGNAL
from trt_otel.core.events import CancelSource

SCONTROL_TIMEOUT_S = 2.0
"""How long the controller may take to say what it is doing to the job (a stop budget is
seconds; a controller that does not answer in time is taken to be cancelling it)."""
MAX_ANSWER_CHARS = 65_536
"""More than ``scontrol show job`` says of one job; an answer beyond it is not read."""

_NUMBER = re.compile(r"[0-9]{1,20}")
_RESTARTS = re.compile(r"(?:^|\s)Restarts=([0-9]{1,20})(?:\s|$)")
_TIME_LIMIT = re.compile(r"(?:^|\s)Reason=TimeLimit(?:\s|$)")
_ENDING = re.compile(r"(?:^|\s)JobState=(?:COMPLETING|CANCELLED)(?:\s|$)")

ShowJob = Callable[[str], str | None]
"""What SLURM's controller says of a job (``scontrol show job --oneliner ID``), or None where
it cannot be asked or does not answer in time."""


def show_job(job: str) -> str | None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run(
            [scontrol, "show", "job", "--oneliner", job],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclass(frozen=True, slots=True)
class StopCause:
    """Why a signal stops a build: the cancel's reason, its source, and whether it is a
    timeout (a scheduler's time limit)."""

    reason: str
    source: CancelSource
    timeout: bool = False


def received(name: str) -> StopCause:
    """The cause of a signal that says nothing more of itself: ``received SIGTERM``."""
    return StopCause(f"received {name}", CancelSource.SIGNAL)


TIME_LIMIT = StopCause(TIME_LIMIT_REASON, CancelSource.SIGNAL, timeout=True)
"""The cause of :data:`~trt_otel.control.signals.TIME_LIMIT_SIGNAL`, a scheduler's warning."""


def slurm_cause(environ: Mapping[str, str], show: ShowJob = show_job) -> StopCause | None:
    """Why a SIGTERM reached this SLURM job, as the controller says at that moment (SLURM 22.05,
    seen on a real one): a job being requeued (preempted, ``scontrol requeue``, a failed node)
    counts the run to come in its ``Restarts``; one whose time limit ended it says
    ``Reason=TimeLimit``; one ``scancel`` ended is ``COMPLETING`` with neither. None where it
    is not a SLURM job, or the controller cannot tell."""
    job = environ.get("SLURM_JOB_ID", "")
    if not _NUMBER.fullmatch(job):
        return None
    started = environ.get("SLURM_RESTART_COUNT", "")
    started_at = int(started) if _NUMBER.fullmatch(started) else 0
    answer = show(job)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    found = _RESTARTS.search(answer)
    if found is not None and int(found.group(1)) > started_at:
        restart = found.group(1)
        return StopCause(
            f"preempted: SLURM requeued job {job} (SIGTERM; it runs again as restart {restart})",
            CancelSource.PREEMPTION,
        )
    if _TIME_LIMIT.search(answer):
        return StopCause(f"SLURM's time limit ended job {job} (SIGTERM)", CancelSource.SIGNAL, True)
    if _ENDING.search(answer):
        return StopCause(f"SLURM cancelled job {job} (SIGTERM)", CancelSource.SIGNAL)
    return None


class SignalCauses:
    """Each stop signal's cause, asked of the scheduler once and kept. A second caller waits
    for the first's answer (at most :data:`SCONTROL_TIMEOUT_S`)."""

    def __init__(self, environ: Mapping[str, str], show: ShowJob = show_job) -> None:
        self._environ = environ
        self._show = show
        self._lock = threading.Lock()
        self._known: dict[str, StopCause] = {}

    def of(self, name: str) -> StopCause:
        """``name``'s cause: for ``SIGUSR1``, the scheduler's time-limit warning (a timeout);
        for ``SIGTERM``, what SLURM is doing to the job where it is one (a preemption, its time
        limit, a cancel); else :func:`received`."""
        if name == TIME_LIMIT_SIGNAL.name:
            return TIME_LIMIT
        with self._lock:
            known = self._known.get(name)
            if known is None:
                slurm = slurm_cause(self._environ, self._show) if name == "SIGTERM" else None
                known = slurm or received(name)
                self._known[name] = known
            return known
