"""``trt-otel fleet ACTION``: builds on Ray or SLURM, for people (and, with ``--json``, programs).

Each action is one call on the scheduler's fleet (:class:`~trt_otel.app.ray_fleet.RayFleet`,
:class:`~trt_otel.app.slurm_fleet.SlurmFleet`); what is printed is its answer, in lines for a
terminal (every value from outside escaped) or as JSON. ``wait`` exits with the build's exit
code (0 built, 3 cancelled, 4 failed), as ``watch`` does; a build that cannot be followed to its
end (lost, never started, still running at the timeout) is 2.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from trt_otel.app.config import UsageError
from trt_otel.app.fleet_arguments import FleetCommand, Scheduler
from trt_otel.app.fleet_documents import BuildList, BuildRequest, BuildStatus
from trt_otel.app.fleet_requests import FleetError
from trt_otel.app.session import EXIT_OK, EXIT_USAGE
from trt_otel.app.shared_fleet import SharedFolderFleet
from trt_otel.core.durations import format_duration
from trt_otel.views.terminal import printable


def scheduled_fleet(
    scheduler: Scheduler,
    address: str | None,
    shared_dir: Path,
    *,
    num_gpus: float = 0.0,
    num_cpus: float = 1.0,
    partition: str | None = None,
    time_limit_s: float | None = None,
    allow_network: bool = False,
) -> SharedFolderFleet[Any]:
    """The fleet of builds on ``scheduler`` (Ray at ``address``, or SLURM) and the shared
    folder; :class:`FleetError` when it cannot be reached or used."""
    if scheduler == "slurm":
        from trt_otel.app.slurm_fleet import SlurmFleet

        if not (float(num_gpus).is_integer() and float(num_cpus).is_integer()):
            raise FleetError("SLURM allocates whole GPUs and CPUs: --num-gpus and --num-cpus")
        return SlurmFleet(
            shared_dir,
            partition=partition,
            time_limit_s=time_limit_s,
            num_gpus=int(num_gpus),
            num_cpus=int(num_cpus),
            allow_network=allow_network,
        )
    from trt_otel.app.ray_fleet import RayFleet

    assert address is not None
    return RayFleet(
        address, shared_dir, num_gpus=num_gpus, num_cpus=num_cpus, allow_network=allow_network
    )


def run_fleet(command: FleetCommand) -> int:
    try:
        fleet = scheduled_fleet(
            command.scheduler,
            command.address,
            command.shared_dir,
            partition=command.partition,
            time_limit_s=command.time_limit_s,
        )
        return _act(fleet, command)
    except FleetError as error:
        raise UsageError(str(error)) from None


def _act(fleet: SharedFolderFleet[Any], command: FleetCommand) -> int:
    if command.action == "submit":
        request = BuildRequest(
            kind=command.kind,
            model=command.model,
            output=command.output,
            options=tuple(command.options),
            overwrite=command.overwrite,
        )
        status = fleet.start(request, num_gpus=command.num_gpus, num_cpus=command.num_cpus)
        job = f"{fleet.label} job {status.job_id}"
        _print(command, status, [f"submitted {status.id} ({job})", *_status_lines(status)])
        return EXIT_OK
    if command.action == "list":
        listed = BuildList.of(fleet.list())
        lines = [f"{'ID':<13}{'STATE':<16}{'PROGRESS':>9}  {fleet.label.upper():<10} MODEL"]
        for build in listed.builds:
            lines.append(
                f"{build.id:<13}{build.outcome or build.state:<16}{build.progress:>8.0%}  "
                f"{build.job_status or '?':<10} {build.model or '-'}"
            )
        if listed.engines is not None:
            lines.append(listed.engines)
        _print(command, listed, lines)
        return EXIT_OK
    assert command.build_id is not None
    if command.action == "status":
        status = fleet.status(command.build_id)
        _print(command, status, _status_lines(status))
        return EXIT_OK
    if command.action == "cancel":
        answer = fleet.cancel(command.build_id, command.reason, wait=command.wait)
        lines = [f"cancel of {command.build_id} requested: {answer.reason}", answer.note]
        if answer.status is not None:
            lines += _status_lines(answer.status)
        _print(command, answer, lines)
        return EXIT_OK
    began = time.monotonic()
    waited = fleet.wait(command.build_id, "end", command.timeout_s)
    status = waited.status
    lines = _status_lines(status)
    if waited.reason == "timeout":
        lines.append(f"still running after {format_duration(time.monotonic() - began)}")
    _print(command, waited, lines)
    return status.exit_code if status.exit_code is not None else EXIT_USAGE


def _status_lines(status: BuildStatus) -> list[str]:
    state = status.state
    lines = [f"{status.id}: {state}" + (f" ({status.outcome})" if status.outcome else "")]
    job = f" (job {status.job_id})" if status.scheduler == "slurm" else ""
    node = f" on node {status.node[:12]}" if status.node else ""
    lines.append(f"  {status.scheduler}: {status.job_status or 'unknown'}{job}{node}")
    if status.model:
        lines.append(f"  model: {status.model}")
    lines.append(f"  progress: {status.progress:.0%}, {status.steps_completed:,} steps")
    if status.open_phases:
        lines.append(f"  in: {' > '.join(phase.name for phase in status.open_phases)}")
    eta = status.eta
    if state == "running" and eta is not None and eta.seconds is not None:
        lines.append(f"  ETA {format_duration(eta.seconds)} ({eta.basis})")
    if status.cancel:
        lines.append(f"  cancel: {status.cancel.reason} ({status.cancel.source})")
    if status.detail:
        lines.append(f"  detail: {status.detail}")
    if status.error:
        lines.append(f"  error: {status.error}")
    lines.append(f"  journal: {status.journal}")
    return lines


def _print(command: FleetCommand, document: msgspec.Struct, lines: list[str]) -> None:
    if command.json:
        print(json.dumps(msgspec.to_builtins(document), indent=1))
    else:
        for line in lines:
            print(printable(line))
    sys.stdout.flush()
