"""``trt-otel fleet ACTION``: builds on Ray, for people (and, with ``--json``, programs).

Each action is one call on :class:`~trt_otel.app.ray_fleet.RayFleet`; what is printed is its
answer, in lines for a terminal (every value from outside escaped) or as JSON. ``wait`` exits
with the build's exit code (0 built, 3 cancelled, 4 failed), as ``watch`` does; a build that
cannot be followed to its end (lost, never started, still running at the timeout) is 2.
"""

from __future__ import annotations

import json
import sys
import time

import msgspec

from trt_otel.app.config import UsageError
from trt_otel.app.fleet_arguments import FleetCommand
from trt_otel.app.fleet_documents import BuildList, BuildRequest, BuildStatus
from trt_otel.app.fleet_requests import FleetError
from trt_otel.app.ray_fleet import RayFleet
from trt_otel.app.session import EXIT_OK, EXIT_USAGE
from trt_otel.core.durations import format_duration
from trt_otel.views.terminal import printable


def run_fleet(command: FleetCommand) -> int:
    try:
        fleet = RayFleet(command.address, command.shared_dir)
        return _act(fleet, command)
    except FleetError as error:
        raise UsageError(str(error)) from None


def _act(fleet: RayFleet, command: FleetCommand) -> int:
    if command.action == "submit":
        request = BuildRequest(
            kind=command.kind,
            model=command.model,
            output=command.output,
            options=tuple(command.options),
            overwrite=command.overwrite,
        )
        status = fleet.start(request, num_gpus=command.num_gpus, num_cpus=command.num_cpus)
        _print(command, status, [f"submitted {status.id} (Ray job trt-otel-{status.id})",
                                 *_status_lines(status)])  # fmt: skip
        return EXIT_OK
    if command.action == "list":
        listed = BuildList.of(fleet.list())
        lines = [f"{'ID':<13}{'STATE':<16}{'PROGRESS':>9}  {'RAY':<10} MODEL"]
        for build in listed.builds:
            lines.append(
                f"{build.id:<13}{build.outcome or build.state:<16}{build.progress:>8.0%}  "
                f"{build.ray_status or '?':<10} {build.model or '-'}"
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
    lines.append(f"  ray: {status.ray_status or 'unknown'}" + (
        f" on node {status.node[:12]}" if status.node else ""))  # fmt: skip
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
