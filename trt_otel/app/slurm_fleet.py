"""Builds run as SLURM batch jobs, found again through SLURM and a folder every node sees (laid out
as :mod:`~trt_otel.app.shared_fleet` says).

Each build is a batch job submitted with ``sbatch``, whose script ``exec``s ``trt-otel build ...``
(or ``trt-otel demo ...``): trt-otel is the batch shell itself, so what SLURM sends the job reaches
it, as ``deploy/slurm/build.sbatch`` does (docs/fleet.md, "SLURM"). ``scancel``'s SIGTERM is a
cancel, exit 3; with a time limit (``--time-limit``) the job asks SLURM for its warning
(``--signal=B:USR1@120``), on which the build stops as a timeout before the limit kills it. A job
is not requeued (``--no-requeue``): its journal is its one run's, so a preempted build ends as a
cancel, SLURM's state of its job ``PREEMPTED``, and the caller submits it again.

The job's state is SLURM's (``scontrol show job``, else ``sacct`` where the cluster keeps
accounting); a job SLURM no longer knows and whose journal has no end is ``unknown``. A job
overdue after a cancel is stopped with ``scancel``. Every call to SLURM's commands is bounded in
time and in what is read of its answer, and SLURM's answers are parsed, never evaluated.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from trt_otel.app.fleet_documents import BuildRequest, BuildStatus
from trt_otel.app.fleet_requests import FleetError
from trt_otel.app.shared_fleet import (
    STOP_SLACK_S,
    BuildRecord,
    Job,
    JobPhase,
    Planned,
    SharedFolderFleet,
    first_line,
)
from trt_otel.core.files import write_atomically

JOB_NAME_PREFIX = "trt-otel-"
"""A build's job name in ``squeue``: this and the build's id."""
SLURM_CALL_TIMEOUT_S = 30.0
"""What one call of SLURM's commands gets (a controller under load answers in seconds)."""
MAX_ANSWER_CHARS = 65_536
"""What is read of a SLURM command's answer: one job's line is a few hundred characters."""
TIME_LIMIT_WARNING_S = 120
"""How long before a job's time limit SLURM warns the build (``--signal=B:USR1@120``): more
than a signal's stop budget, and SLURM's timer may send it up to a minute earlier."""
MIN_TIME_LIMIT_S = TIME_LIMIT_WARNING_S + 60
SLURM_PHASES: dict[str, JobPhase] = {
    "PENDING": "pending",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "REQUEUE_HOLD": "pending",
    "RESV_DEL_HOLD": "pending",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "SIGNALING": "running",
    "STAGE_OUT": "running",
    "RESIZING": "running",
    "COMPLETED": "ended",
    "CANCELLED": "ended",
    "FAILED": "ended",
    "TIMEOUT": "ended",
    "PREEMPTED": "ended",
    "NODE_FAIL": "ended",
    "BOOT_FAIL": "ended",
    "DEADLINE": "ended",
    "OUT_OF_MEMORY": "ended",
    "REVOKED": "ended",
    "SPECIAL_EXIT": "ended",
}
"""SLURM's job states (``squeue --help``'s list, 22.05), by where the job is. ``COMPLETING``
is running: its processes are not all gone yet."""


@dataclass(frozen=True, slots=True)
class SlurmRecord(BuildRecord):
    """``build.json`` of a SLURM job: the build's record, and its job's id."""

    slurm_job_id: str
    partition: str | None
    time_limit_s: float | None


class SlurmError(Exception):
    """A SLURM command failed, or did not answer in time; its message is SLURM's first line."""


class SlurmFleet(SharedFolderFleet[SlurmRecord]):
    """The builds of one SLURM cluster (the one ``sbatch`` reaches here, ``SLURM_CONF``'s) and one
    shared folder."""

    scheduler: ClassVar[str] = "slurm"
    label: ClassVar[str] = "SLURM"
    record_type = SlurmRecord
    job_key: ClassVar[str] = "slurm_job_id"

    def __init__(
        self,
        shared_dir: Path,
        *,
        partition: str | None = None,
        time_limit_s: float | None = None,
        num_gpus: int = 0,
        num_cpus: int = 1,
        stop_slack_s: float = STOP_SLACK_S,
        allow_network: bool = False,
        call_timeout_s: float = SLURM_CALL_TIMEOUT_S,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        """``partition``, ``time_limit_s``, ``num_gpus`` (``--gres=gpu:N``) and ``num_cpus``
        (``--cpus-per-task``): what each build's job asks SLURM for, unless its request says.
        ``environment``: what SLURM's commands run with, and so what the jobs get (``sbatch``
        passes it on): this process's by default."""
        super().__init__(shared_dir, allow_network=allow_network, stop_slack_s=stop_slack_s)
        self.partition = _checked_partition(partition)
        self.time_limit_s = _checked_time_limit(time_limit_s)
        self.num_gpus, self.num_cpus = num_gpus, num_cpus
        self.call_timeout_s = call_timeout_s
        self.environment = dict(os.environ if environment is None else environment)
        search = self.environment.get("PATH", os.defpath)
        self._programs = {
            name: shutil.which(name, path=search) for name in ("sbatch", "scontrol", "scancel")
        }
        missing = sorted(name for name, path in self._programs.items() if path is None)
        if missing:
            raise FleetError(
                f"builds on SLURM need its commands ({', '.join(missing)} not found on PATH): "
                "run where jobs are submitted (a login node)"
            )
        self._sacct = shutil.which("sacct", path=search)

    def start(
        self,
        request: BuildRequest,
        *,
        num_gpus: float | None = None,
        num_cpus: float | None = None,
    ) -> BuildStatus:
        """Check the request as the command line would, submit it as a batch job, and return
        its status. ``num_gpus``/``num_cpus``: what SLURM allocates for the build (whole
        numbers: ``--gres=gpu:N``, ``--cpus-per-task``)."""
        gpus = self.num_gpus if num_gpus is None else num_gpus
        cpus = self.num_cpus if num_cpus is None else num_cpus
        if not (float(gpus).is_integer() and float(cpus).is_integer()):
            raise FleetError("SLURM allocates whole GPUs and CPUs: num_gpus and num_cpus")
        if not (0 <= gpus <= 64 and 1 <= cpus <= 256):
            raise FleetError("num_gpus must be 0 to 64 and num_cpus 1 to 256")
        planned = self._plan(request)
        script = planned.folder / "job.sh"
        write_atomically(script, _script(planned).encode(), mode=0o644)
        try:
            answer = self._slurm("sbatch", *self._sbatch_options(planned, int(gpus), int(cpus)),
                                 str(script))  # fmt: skip
        except SlurmError as error:
            raise FleetError(f"SLURM refused the job: {error}") from None
        job_id = answer.strip().partition(";")[0]  # --parsable: ID, or ID;CLUSTER
        if not job_id.isdigit() or len(job_id) > 20:
            raise FleetError(f"sbatch answered no job id: {first_line(answer)[:80]!r}")
        record = SlurmRecord(
            **planned.record(gpus),
            slurm_job_id=job_id,
            partition=self.partition,
            time_limit_s=self.time_limit_s,
        )
        try:
            self._write_record(planned, record)
        except OSError as error:  # a job nobody could find again: not left to run
            self._stop(record)
            raise FleetError(f"cannot write the build's record ({error}); job cancelled") from None
        return self.status(planned.id)

    def _sbatch_options(self, planned: Planned, gpus: int, cpus: int) -> list[str]:
        options = [
            "--parsable",
            f"--job-name={JOB_NAME_PREFIX}{planned.id}",
            f"--output={planned.folder / 'slurm.out'}",
            f"--chdir={self.shared_dir}",
            "--no-requeue",
            f"--cpus-per-task={cpus}",
        ]
        if gpus:
            options.append(f"--gres=gpu:{gpus}")
        if self.partition is not None:
            options.append(f"--partition={self.partition}")
        if self.time_limit_s is not None:
            options.append(f"--time={math.ceil(self.time_limit_s / 60)}")
            options.append(f"--signal=B:USR1@{TIME_LIMIT_WARNING_S}")
        return options

    # -- SLURM's part ----------------------------------------------------------------------

    def _check_record(self, record: SlurmRecord) -> None:
        if not record.slurm_job_id.isdigit() or len(record.slurm_job_id) > 20:
            raise FleetError(f"the record of build {record.id} names no SLURM job")

    def _job(self, record: SlurmRecord) -> Job:
        job_id = record.slurm_job_id
        try:
            fields = scontrol_fields(self._slurm("scontrol", "show", "job", "--oneliner", job_id))
        except SlurmError as error:  # ended long ago (MinJobAge), or the controller is down
            accounted = self._accounted(job_id)
            if accounted is not None:
                return accounted
            return Job(status=None, phase=None, message=f"SLURM: {error}")
        if fields.get("JobId") != job_id:
            return Job(status=None, phase=None, message=f"SLURM: no job {job_id}")
        return job_of(
            fields.get("JobState", ""),
            fields.get("ExitCode"),
            fields.get("NodeList"),
            fields.get("Reason"),
        )

    def _accounted(self, job_id: str) -> Job | None:
        """What SLURM's accounting kept of a job (``sacct``), where the cluster keeps it."""
        if self._sacct is None:
            return None
        try:
            answer = self._slurm("sacct", "--noheader", "--parsable2", "--allocations",
                                 "--jobs", job_id, "--format=State,ExitCode,NodeList")  # fmt: skip
        except SlurmError:
            return None
        lines = answer.strip().splitlines()
        if not lines or lines[0].count("|") != 2:
            return None
        state, exit_code, nodes = lines[0].split("|")
        return job_of(state.split(" ")[0], exit_code, nodes, None)  # "CANCELLED by 0"

    def _status_fields(self, record: SlurmRecord, job: Job, stop_requested: bool) -> dict[str, Any]:
        return {"job_id": record.slurm_job_id}

    def _stop(self, record: SlurmRecord) -> bool:
        try:
            self._slurm("scancel", record.slurm_job_id)
        except SlurmError:  # it ended meanwhile; the next call sees that
            return False
        return True

    def _slurm(self, name: str, *arguments: str) -> str:
        """A SLURM command's answer; :class:`SlurmError` with what it said when it fails."""
        program = self._sacct if name == "sacct" else self._programs[name]
        assert program is not None
        try:
            done = subprocess.run(
                [program, *arguments],
                env=self.environment,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.call_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{name} did not answer in {self.call_timeout_s:g}s") from None
        except OSError as error:
            raise SlurmError(f"{name}: {error}") from None
        answer = done.stdout[:MAX_ANSWER_CHARS].decode("utf-8", "replace")
        if done.returncode != 0:
            said = first_line(done.stderr[:MAX_ANSWER_CHARS].decode("utf-8", "replace"))
            raise SlurmError(said or f"{name} exited {done.returncode}")
        return answer


def scontrol_fields(answer: str) -> dict[str, str]:
    """``scontrol show job --oneliner``'s fields, by name (a value with a space, such as a
    command's arguments, keeps its first word: only single-word fields are read)."""
    line = answer.strip().splitlines()[0] if answer.strip() else ""
    fields: dict[str, str] = {}
    for token in line.split(" "):
        name, equals, value = token.partition("=")
        if equals and name and name not in fields:
            fields[name] = value
    return fields


def job_of(state: str, exit_code: str | None, nodes: str | None, reason: str | None) -> Job:
    """A SLURM job as the fleet tells it: its state's phase, the script's exit status (of
    ``STATUS:SIGNAL``), the node, and the reason it waits or ended (``None`` is none)."""
    status = state.strip().upper()[:40] or None
    code = None
    if exit_code is not None:
        number, _, _ = exit_code.partition(":")
        code = int(number) if number.isdigit() and len(number) < 4 else None
    node = nodes.strip()[:200] if nodes and nodes.strip() not in ("", "(null)", "None") else None
    message = reason.strip()[:200] if reason and reason.strip() != "None" else None
    phase = SLURM_PHASES.get(status) if status is not None else None
    return Job(status=status, phase=phase, message=message, exit_code=code, node=node)


def _script(planned: Planned) -> str:
    return (
        "#!/bin/sh\n"
        f"# The build {planned.id} of trt-otel's fleet (trt-otel fleet --slurm).\n"
        "# exec: trt-otel is the batch shell itself, so what SLURM sends the job (scancel's\n"
        "# SIGTERM, the time limit's warning) reaches it.\n"
        f"exec {shlex.join(['trt-otel', *planned.argv])}\n"
    )


def _checked_partition(partition: str | None) -> str | None:
    if partition is None:
        return None
    if (
        not partition
        or len(partition) > 64
        or not all(c.isalnum() or c in "-_." for c in partition)
    ):
        raise FleetError(
            f"partition {partition[:40]!r}: a SLURM partition's name (letters, digits, -_.)"
        )
    return partition


def _checked_time_limit(time_limit_s: float | None) -> float | None:
    if time_limit_s is None:
        return None
    if not MIN_TIME_LIMIT_S <= time_limit_s <= 365 * 24 * 3600:
        raise FleetError(
            f"a time limit must leave room for SLURM's warning {TIME_LIMIT_WARNING_S} s before "
            f"it: {MIN_TIME_LIMIT_S} s or more"
        )
    return time_limit_s
