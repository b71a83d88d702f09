"""What a stop signal means: someone cancelling the build, or the scheduler taking its job back.

SLURM stops a job it preempts with requeue (``PreemptMode=REQUEUE``), and one that
``scontrol requeue`` or a failed node sends back to the queue, as it stops one that ``scancel``
cancels: SIGTERM to every process of the job, SIGKILL ``KillWait`` later. Only the controller
tells them apart, and it does so at once: when the signal arrives, the job's ``Restarts``
counter already counts the requeue, while the run being stopped started with the count in its
``SLURM_RESTART_COUNT`` (unset on the first run). A build stopped that way is preempted, not
cancelled by a person and not failed: it will run again.

Asked once per signal name (:class:`SignalCauses`): the first signal's handler and the reading
of a worker that died of the same signal agree on one answer.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping

from trt_otel.core.events import CancelSource

SCONTROL_TIMEOUT_S = 2.0
"""How long the controller may take to say what it is doing to the job (a stop budget is
seconds; a controller that does not answer in time is taken to be cancelling it)."""
MAX_ANSWER_CHARS = 65_536
"""More than ``scontrol show job`` says of one job; an answer beyond it is not read."""

_NUMBER = re.compile(r"[0-9]{1,20}")
_RESTARTS = re.compile(r"(?:^|\s)Restarts=([0-9]{1,20})(?:\s|$)")

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


def slurm_requeue(environ: Mapping[str, str], show: ShowJob = show_job) -> str | None:
    """Why a SIGTERM reached this SLURM job, where the controller says it is being requeued
    (preempted, ``scontrol requeue``, a failed node): the reason, in words; None where it is
    not a SLURM job, or not requeued, or the controller cannot tell."""
    job = environ.get("SLURM_JOB_ID", "")
    if not _NUMBER.fullmatch(job):
        return None
    started = environ.get("SLURM_RESTART_COUNT", "")
    started_at = int(started) if _NUMBER.fullmatch(started) else 0
    answer = show(job)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return None
    found = _RESTARTS.search(answer)
    if found is None or int(found.group(1)) <= started_at:
        return None
    restart = found.group(1)
    return f"preempted: SLURM requeued job {job} (SIGTERM; it runs again as restart {restart})"


class SignalCauses:
    """Each stop signal's reason and cancel source, asked of the scheduler once and kept. A
    second caller waits for the first's answer (at most :data:`SCONTROL_TIMEOUT_S`)."""

    def __init__(self, environ: Mapping[str, str], show: ShowJob = show_job) -> None:
        self._environ = environ
        self._show = show
        self._lock = threading.Lock()
        self._known: dict[str, tuple[str, CancelSource]] = {}

    def of(self, name: str) -> tuple[str, CancelSource]:
        """``name``'s (``SIGTERM``) reason and source: preemption where the scheduler is taking
        the job back, else ``received SIGTERM`` from a signal."""
        with self._lock:
            known = self._known.get(name)
            if known is None:
                preempted = slurm_requeue(self._environ, self._show) if name == "SIGTERM" else None
                if preempted is not None:
                    known = (preempted, CancelSource.PREEMPTION)
                else:
                    known = (f"received {name}", CancelSource.SIGNAL)
                self._known[name] = known
            return known
