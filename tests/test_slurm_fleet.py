"""``trt-otel fleet --slurm``: builds submitted as SLURM batch jobs to a real one-node cluster of
the test's own (tests/slurm_cluster.py), followed through their journals and SLURM, cancelled
through their cancel files and, when they outlive their grace, through ``scancel``.

Skipped where SLURM is not installed or the tests are not root (a node's daemons run as root),
and the real build where ``tensorrt_rtx`` does not import, each with the reason.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from rtx_builds import import_rtx, write_conv
from slurm_cluster import SlurmCluster, trt_otel_on_path
from trt_otel import read_journal
from trt_otel.app.fleet_documents import BuildRequest
from trt_otel.app.fleet_requests import FleetError
from trt_otel.app.slurm_fleet import SlurmFleet
from trt_otel.builder.onnx_models import CONV_SHAPES
from trt_otel.control.signals import TIME_LIMIT_REASON
from trt_otel.core.events import CancelRequested
from waiting import wait_for_silence, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]


@dataclass(frozen=True)
class SlurmFleetHere:
    """The cluster, a shared folder, and the environment its jobs and clients get (this
    checkout's ``trt-otel`` on PATH, the cluster's ``SLURM_CONF``)."""

    cluster: SlurmCluster
    shared: Path
    environment: dict[str, str]

    def fleet(self, **settings: object) -> SlurmFleet:
        return SlurmFleet(self.shared, environment=self.environment, **settings)  # type: ignore[arg-type]

    def cli(self, *arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "fleet", *arguments[:1], "--slurm", "--shared-dir", str(self.shared),
             *arguments[1:]],
            env=self.environment, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip

    def jobs(self) -> list[str]:
        return self.cluster.client("squeue", "--noheader", "--format=%i").split()


@pytest.fixture
def here(
    one_node_slurm: SlurmCluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SlurmFleetHere]:
    environment = one_node_slurm.environment(trt_otel_on_path(tmp_path_factory.mktemp("bin")))
    shared = tmp_path / "shared"
    shared.mkdir()
    yield SlurmFleetHere(one_node_slurm, shared, environment)
    one_node_slurm.cancel_all()


def demo(*options: str) -> BuildRequest:
    return BuildRequest(kind="demo", options=("--speed", "0", "--no-gpu", *options))


@pytest.mark.slow
def test_a_real_build_on_slurm_is_built_and_followed_as_on_ray(here: SlurmFleetHere) -> None:
    """``fleet --slurm submit`` of a real TensorRT-RTX build: ``wait`` exits 0 with it, its
    status says the job (SLURM's id, state and exit code) and the build (outcome, engine), and
    ``list`` shows it (and not a Ray build's record in the same folder), as SLURM itself
    records it."""
    import_rtx()
    model = write_conv(here.shared / "conv.onnx", 4)
    submitted = here.cli("submit", str(model), "--", "--shapes", CONV_SHAPES, "--no-gpu")
    assert submitted.returncode == 0, submitted.stderr
    found = re.match(r"submitted ([0-9a-f]{12}) \(SLURM job (\d+)\)", submitted.stdout)
    assert found, submitted.stdout
    build_id, job_id = found.groups()
    waited = here.cli("wait", build_id)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    status = json.loads(here.cli("status", build_id, "--json").stdout)
    assert (status["scheduler"], status["job_id"]) == ("slurm", job_id)
    assert (status["state"], status["outcome"], status["exit_code"]) == ("finished", "success", 0)
    assert status["job_exit_code"] == 0
    assert status["job_status"] in ("COMPLETING", "COMPLETED"), status
    assert Path(status["engine"]).stat().st_size > 0
    assert status["engine"] == str(here.shared / "builds" / build_id / "model.engine")
    record = here.cluster.wait_for_end(job_id)
    assert (record.state, record.exit_code) == ("COMPLETED", (0, 0))
    ray_build = here.shared / "builds" / "0123456789ab"  # a Ray build's, in the same folder
    ray_build.mkdir()
    (ray_build / "build.json").write_text(json.dumps({"id": "0123456789ab", "submission_id": "x"}))
    listed = here.cli("list").stdout.splitlines()
    assert listed[0].split() == ["ID", "STATE", "PROGRESS", "SLURM", "MODEL"]
    assert listed[1].split() == [build_id, "success", "100%", "COMPLETED", str(model)]


def test_a_cancel_stops_the_build_at_its_next_step_with_its_reason_and_exit_3(
    here: SlurmFleetHere,
) -> None:
    """A build cancelled through the fleet in its silent window stops at the next step, with
    the caller's reason in its journal; ``fleet wait`` exits 3, as SLURM records the job."""
    fleet = here.fleet()
    started = fleet.start(demo("--silence", "3s"))
    assert started.scheduler == "slurm" and started.state in ("pending", "running")
    wait_for_silence(Path(started.journal))
    answer = fleet.cancel(started.id, "the GPU is needed for training", wait=True)
    assert (answer.accepted, answer.first) == (True, True)
    assert answer.status is not None
    assert (answer.status.outcome, answer.status.exit_code) == ("cancellation", 3)
    assert answer.status.cancel is not None
    assert answer.status.cancel.reason == "the GPU is needed for training"
    assert answer.status.job_stop_requested is None  # the build stopped itself, in time
    cancels = [e for e in read_journal(started.journal).events if isinstance(e, CancelRequested)]
    assert [(c.reason, c.source) for c in cancels] == [("the GPU is needed for training", "file")]
    assert started.job_id is not None
    record = here.cluster.wait_for_end(started.job_id)
    assert (record.state, record.exit_code) == ("FAILED", (3, 0))
    assert here.cli("wait", started.id).returncode == 3


def test_a_build_that_outlives_its_cancels_grace_is_stopped_with_scancel(
    here: SlurmFleetHere,
) -> None:
    """The cancel file is written first, and the build records the cancel; one still running
    its grace (and the fleet's slack) after it is stopped through SLURM: ``scancel``'s
    SIGTERM ends it, the caller's reason kept, exit 3."""
    fleet = here.fleet(stop_slack_s=30.0)
    started = fleet.start(demo("--silence", "120s", "--grace", "10m"))
    wait_for_silence(Path(started.journal))
    answer = fleet.cancel(started.id, "over budget")
    assert answer.status is None and "stopped if it still runs 630s from now" in answer.note
    wait_until(lambda: fleet.status(started.id).cancel is not None, "the cancel's record")
    cancelling = fleet.status(started.id)
    assert (cancelling.state, cancelling.job_stop_requested) == ("cancelling", None)
    cancel_file = here.shared / "builds" / started.id / "cancel"
    for ago, stopped in ((601, None), (631, True)):  # past the grace; past the slack too
        asked = time.time() - ago
        os.utime(cancel_file, (asked, asked))  # as if asked that long ago
        assert fleet.status(started.id).job_stop_requested is stopped, ago
    ended = fleet.wait(started.id, "end", 120).status
    assert (ended.state, ended.outcome, ended.exit_code) == ("finished", "cancellation", 3)
    assert ended.cancel is not None and ended.cancel.reason == "over budget"
    assert started.job_id is not None
    record = here.cluster.wait_for_end(started.job_id)
    assert (record.state, record.exit_code) == ("CANCELLED", (3, 0))


def test_a_pending_build_cancelled_is_never_started(here: SlurmFleetHere) -> None:
    """A build waiting for a node (every CPU taken) is cancelled through SLURM alone: its job
    never runs, and its status says it failed to start."""
    blocker = here.shared / "blocker.sh"
    blocker.write_text("#!/bin/sh\nexec sleep 600\n")
    cpus = os.cpu_count() or 1
    blocking = here.cluster.sbatch(
        blocker, f"--cpus-per-task={cpus}", f"--output={here.shared}/blocker.out"
    )
    here.cluster.wait_for_state(blocking, frozenset({"RUNNING"}))
    fleet = here.fleet(num_cpus=cpus)
    started = fleet.start(demo())
    assert started.job_id is not None
    wait_until(
        lambda: (
            here.cluster.job(started.job_id or "").fields.get("Reason") in ("Resources", "Priority")
        ),
        "the build's job to wait for the node",
    )
    assert fleet.status(started.id).state == "pending"
    answer = fleet.cancel(started.id, "not needed")
    assert answer.note == "the build had not started: its SLURM job was stopped"
    record = here.cluster.wait_for_end(started.job_id)
    assert record.state == "CANCELLED"
    status = fleet.status(started.id)
    assert (status.state, status.job_status) == ("failed_to_start", "CANCELLED")
    assert not Path(status.journal).exists()


def test_requests_slurm_cannot_run_are_refused_before_anything_is_submitted(
    here: SlurmFleetHere, tmp_path: Path
) -> None:
    """A model outside the shared folder, an option the fleet sets itself, a part of a GPU,
    no CPU, a partition's name that is not one, a time limit shorter than the warning: each
    refused with its reason, and no job reaches SLURM."""
    outside = write_conv(tmp_path / "outside.onnx", 4)
    inside = write_conv(here.shared / "conv.onnx", 4)
    fleet = here.fleet()
    refusals: dict[str, Callable[[], object]] = {
        "is outside the shared folder": lambda: fleet.start(
            BuildRequest(kind="build", model=str(outside))
        ),
        "--journal": lambda: fleet.start(
            BuildRequest(kind="build", model=str(inside), options=("--journal=x.jsonl",))
        ),
        "whole GPUs": lambda: fleet.start(demo(), num_gpus=0.5),
        "num_cpus 1 to 256": lambda: fleet.start(demo(), num_cpus=0),
        "a SLURM partition's name": lambda: here.fleet(partition="debug;rm"),
        "120 s": lambda: here.fleet(time_limit_s=60.0),
    }
    for said, refused in refusals.items():
        with pytest.raises(FleetError, match=re.escape(said)):
            refused()
    assert here.jobs() == []
    assert not (here.shared / "builds").exists() or not any((here.shared / "builds").iterdir())
    usage = here.cli("submit", "--ray", "http://head:8265", str(inside))
    assert usage.returncode == 2 and "not allowed with argument --slurm" in usage.stderr


@pytest.mark.slow
def test_a_time_limit_stops_the_build_on_slurms_warning_as_a_timeout(
    here: SlurmFleetHere,
) -> None:
    """A time limit becomes the job's ``--time`` and ``--signal=B:USR1@120``: SLURM warns the
    build, which stops at once as a timeout, its journal ended, long before SLURM's own stop
    at the limit (a partition given becomes the job's)."""
    fleet = here.fleet(time_limit_s=180.0, partition="urgent")  # not the default one
    started = fleet.start(demo("--silence", "10m", "--grace", "10m"))
    assert started.job_id is not None
    fields = here.cluster.job(started.job_id).fields
    assert (fields["TimeLimit"], fields["Partition"]) == ("00:03:00", "urgent")
    script = (here.shared / "builds" / started.id / "job.sh").read_text()
    assert script.splitlines()[-1].startswith("exec trt-otel demo ")
    ended = fleet.wait(started.id, "end", 150).status
    assert (ended.outcome, ended.exit_code) == ("timeout", 3), ended
    assert ended.cancel is not None and ended.cancel.reason == TIME_LIMIT_REASON
    record = here.cluster.wait_for_end(started.job_id)
    assert (record.state, record.exit_code) == ("FAILED", (3, 0))


def test_an_agent_starts_follows_and_cancels_builds_on_slurm_through_mcp(
    here: SlurmFleetHere,
) -> None:
    """``trt-otel mcp --slurm``: the same tools as on Ray, each build a SLURM job of the
    shared folder, a new server for each call (the folder and SLURM hold everything)."""
    pytest.importorskip("mcp")
    from mcp_client import call_once, run_async

    async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        flags = ["--slurm", "--shared-dir", str(here.shared)]
        return await call_once(flags, name, arguments, env=here.environment, cwd=here.shared)

    async def scenario() -> None:
        options = ["--speed", "0", "--no-gpu", "--silence", "2m", "--grace", "1s"]
        started = await call("start_build", {"kind": "demo", "options": options})
        assert (started["scheduler"], started["job_id"].isdigit()) == ("slurm", True)
        listed = await call("list_builds", {})
        assert [(b["id"], b["scheduler"]) for b in listed["builds"]] == [(started["id"], "slurm")]
        wait_for_silence(Path(started["journal"]))
        cancelled = await call("cancel_build", {"id": started["id"], "reason": "an agent's"})
        assert cancelled["accepted"] is True
        ended = await call("wait_build", {"id": started["id"], "until": "end", "timeout_s": 60})
        status = ended["status"]
        assert (status["outcome"], status["exit_code"]) == ("cancellation", 3), status
        assert status["cancel"]["reason"] == "an agent's"

    run_async(scenario)
