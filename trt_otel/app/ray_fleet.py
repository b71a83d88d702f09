"""Builds run as Ray jobs, through Ray's Job Submission API, found again through Ray and a folder
every node sees (laid out as :mod:`~trt_otel.app.shared_fleet` says).

Each build is a Ray job whose entrypoint is ``trt-otel build ...`` (or ``trt-otel demo ...``)
itself, asking Ray for the GPUs and CPUs it needs. The job's state is Ray's (``PENDING``,
``RUNNING``, ``SUCCEEDED``, ``FAILED``, ``STOPPED``); a job overdue after a cancel is stopped
through Ray (which sends SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from trt_otel.app.fleet_documents import BuildRequest, BuildStatus
from trt_otel.app.fleet_requests import FleetError
from trt_otel.app.shared_fleet import (
    STOP_SLACK_S,
    BuildRecord,
    Job,
    JobPhase,
    SharedFolderFleet,
    first_line,
)
from trt_otel.core.deadlines import DeadlineExceededError, call_within

PREFIX = "trt-otel-"
"""Ray's submission id of a build: this and the build's id."""
RAY_PHASES: dict[str, JobPhase] = {
    "PENDING": "pending",
    "RUNNING": "running",
    "SUCCEEDED": "ended",
    "FAILED": "ended",
    "STOPPED": "ended",
}
RAY_CALL_TIMEOUT_S = 30.0
"""What one call to Ray's job server gets in all: a submission, a job's status, a stop (a
dashboard under load answers in seconds, a hung one never)."""
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RayRecord(BuildRecord):
    """``build.json`` of a Ray job: the build's record, and its job's submission id."""

    submission_id: str


class RayFleet(SharedFolderFleet[RayRecord]):
    """The builds of one Ray cluster and one shared folder."""

    scheduler: ClassVar[str] = "ray"
    label: ClassVar[str] = "Ray"
    record_type = RayRecord
    job_key: ClassVar[str] = "submission_id"

    def __init__(
        self,
        address: str,
        shared_dir: Path,
        *,
        num_gpus: float = 0.0,
        num_cpus: float = 1.0,
        stop_slack_s: float = STOP_SLACK_S,
        client: Any = None,
        allow_network: bool = False,
        call_timeout_s: float = RAY_CALL_TIMEOUT_S,
    ) -> None:
        """``num_gpus``/``num_cpus``: what Ray reserves for a build when a request says
        nothing of it. ``stop_slack_s``: see :data:`STOP_SLACK_S`. ``call_timeout_s``: what
        each call to Ray's job server gets in all (:data:`RAY_CALL_TIMEOUT_S`)."""
        super().__init__(shared_dir, allow_network=allow_network, stop_slack_s=stop_slack_s)
        self.address = address
        self.call_timeout_s = call_timeout_s
        self.num_gpus, self.num_cpus = num_gpus, num_cpus
        if client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError as error:
                raise FleetError(
                    f"builds on Ray need Ray's job client ({error}): pip install 'trt-otel[ray]'"
                ) from None
            try:
                # The client asks the job server its version twice before it is made.
                client = self._ray(lambda: JobSubmissionClient(address))
            except (ConnectionError, RuntimeError, ValueError, DeadlineExceededError) as error:
                raise FleetError(f"cannot reach Ray at {address}: {error}") from None
        self.client = client

    def start(
        self,
        request: BuildRequest,
        *,
        num_gpus: float | None = None,
        num_cpus: float | None = None,
    ) -> BuildStatus:
        """Check the request as the command line would, submit it as a Ray job, and return its
        status. ``num_gpus``/``num_cpus``: what Ray reserves for the build's process;
        ``deadline`` and ``retries``: ``--deadline`` and the ``--retry`` rungs (a rung's paths
        inside the shared folder too)."""
        num_gpus = self.num_gpus if num_gpus is None else num_gpus
        num_cpus = self.num_cpus if num_cpus is None else num_cpus
        if not (0 <= num_gpus <= 64 and 0 <= num_cpus <= 256):
            raise FleetError("num_gpus must be 0 to 64 and num_cpus 0 to 256")
        planned = self._plan(request)
        record = RayRecord(**planned.record(num_gpus), submission_id=PREFIX + planned.id)
        self._write_record(planned, record)
        try:
            self._ray(
                lambda: self.client.submit_job(
                    entrypoint=shlex.join(record.entrypoint),
                    submission_id=record.submission_id,
                    entrypoint_num_gpus=num_gpus or None,
                    entrypoint_num_cpus=num_cpus or None,
                    metadata={"trt-otel.build": planned.id, "trt-otel.kind": planned.kind},
                )
            )
        except DeadlineExceededError as error:
            raise FleetError(
                f"Ray did not take the job ({error}); it may still start: fleet status {planned.id}"
            ) from None
        except Exception as error:  # Ray's client raises RuntimeError, ConnectionError, ...
            raise FleetError(f"Ray refused the job: {first_line(error)}") from None
        return self.status(planned.id)

    # -- Ray's part ------------------------------------------------------------------------

    def _check_record(self, record: RayRecord) -> None:
        if record.submission_id != PREFIX + record.id:
            raise FleetError(f"the record of build {record.id} names another Ray job")

    def _job(self, record: RayRecord) -> Job:
        try:
            info = self._ray(lambda: self.client.get_job_info(record.submission_id))
        except Exception as error:  # Ray unreachable, or the job unknown to it
            return Job(status=None, phase=None, message=f"Ray: {first_line(error)}")
        status = getattr(info.status, "value", info.status)
        status = str(status) if status is not None else None
        return Job(
            status=status,
            phase=RAY_PHASES.get(status) if status is not None else None,
            message=first_line(info.message or "") or None,
            exit_code=getattr(info, "driver_exit_code", None),
            node=getattr(info, "driver_node_id", None),
        )

    def _status_fields(self, record: RayRecord, job: Job, stop_requested: bool) -> dict[str, Any]:
        # Ray's names of the job's fields, as the fleet's clients of before read them.
        return {
            "job_id": record.submission_id,
            "ray_status": job.status,
            "ray_message": job.message,
            "ray_exit_code": job.exit_code,
            "ray_stop_requested": True if stop_requested else None,
        }

    def _stop(self, record: RayRecord) -> bool:
        try:
            return bool(self._ray(lambda: self.client.stop_job(record.submission_id)))
        except Exception:  # it ended meanwhile; the next call sees that
            return False

    def _ray(self, call: Callable[[], T]) -> T:
        """A call to Ray's job server, within :attr:`call_timeout_s` in all: its client makes a
        ``requests`` session for each call, with no timeout, out of reach."""
        return call_within(self.call_timeout_s, call, name="trt-otel-ray-call")
