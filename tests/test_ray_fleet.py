"""``trt-otel fleet`` and ``trt-otel mcp --ray``: builds run as Ray jobs on a real local Ray
cluster (a head and a second node, shared by every test here), with real TensorRT-RTX builds:
several at once, one cancelled with its reason, one failing, every journal complete. Each
``trt-otel fleet`` call is a process of its own, and the MCP server is restarted between calls:
nothing lives in them but what Ray and the shared folder hold.

Skipped only where Ray or TensorRT-RTX does not install, with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from cli import CLI, run_cli
from ray_cluster import RayCluster
from rtx_builds import HELD_BLOCKS, held_in_silent_step, import_rtx, write_conv, write_residual
from trt_otel import Outcome, read_journal
from trt_otel.app.fleet_documents import BuildRequest
from trt_otel.app.ray_fleet import RayFleet
from trt_otel.builder.onnx_models import CONV_SHAPES, RESIDUAL_SHAPES
from trt_otel.capture.liveness import Writer
from trt_otel.core.events import BuildFinished, CancelRequested
from trt_otel.core.journal_codec import JournalError
from waiting import wait_for_text, wait_until

# The first test also waits for the cluster to start (up to three attempts of STARTUP_S).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), pytest.mark.timeout(900)]

REASON = "the GPU is needed for a training run"


def fleet(cluster: RayCluster, shared: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``trt-otel fleet ...``: a new process every time."""
    return run_cli(
        "fleet", *arguments[:1], "--ray", cluster.address, "--shared-dir", shared,
        *arguments[1:], timeout=300,
    )  # fmt: skip


def fleet_json(cluster: RayCluster, shared: Path, *arguments: str) -> dict[str, Any]:
    done = fleet(cluster, shared, arguments[0], "--json", *arguments[1:])
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def status_until(
    cluster: RayCluster, shared: Path, build_id: str, ready: Any, timeout_s: float = 180
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = fleet_json(cluster, shared, "status", build_id)
        if ready(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def complete_journal(path: str) -> list[Any]:
    events = read_journal(Path(path)).events
    assert isinstance(events[-1], BuildFinished), f"{path} has its end"
    return events


def ray_job(cluster: RayCluster, build_id: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(cluster.address).get_job_info(f"trt-otel-{build_id}")


async def mcp_call(
    cluster: RayCluster, shared: Path, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    """One tool call on a new ``trt-otel mcp --ray`` server, which ends after it."""
    from mcp_client import call_once

    flags = ["--ray", cluster.address, "--shared-dir", str(shared)]
    return await call_once(flags, name, arguments, env={**os.environ}, cwd=shared)


@pytest.mark.e2e
def test_three_real_builds_on_ray_one_built_one_failed_one_cancelled_with_its_reason(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    import_rtx()
    pytest.importorskip("mcp")
    shared = tmp_path / "shared"
    shared.mkdir()
    conv = write_conv(shared / "conv.onnx")
    # Held in its silent step while the test looks at it and cancels it (each look is a
    # command of its own): left to run, its window needed 1,500 blocks, 20-30 s of a core.
    residual = write_residual(shared / "residual.onnx", blocks=HELD_BLOCKS)
    broken = shared / "broken.onnx"
    broken.write_bytes(b"not an ONNX model")

    to_cancel = fleet_json(ray_cluster, shared, "submit", str(residual), "--",
                           "--shapes", RESIDUAL_SHAPES, "--no-gpu", "--grace", "5m")  # fmt: skip
    journal = Path(to_cancel["journal"])
    with held_in_silent_step(journal):
        submitted = {
            "built": fleet_json(ray_cluster, shared, "submit", str(conv), "--",
                                "--shapes", CONV_SHAPES, "--no-gpu"),
            "cancelled": to_cancel,
            "failed": fleet_json(ray_cluster, shared, "submit", str(broken), "--", "--no-gpu"),
        }  # fmt: skip
        ids = {name: status["id"] for name, status in submitted.items()}
        listed = fleet_json(ray_cluster, shared, "list")["builds"]
        assert {build["id"] for build in listed} == set(ids.values())
        # An MCP server started now (on the same Ray and folder) finds them as they are.
        seen = anyio.run(mcp_call, ray_cluster, shared, "list_builds", {})
        assert {build["id"] for build in seen["builds"]} == set(ids.values())

        # Followed through its journal while Ray runs it; then cancelled, with a reason.
        running = status_until(
            ray_cluster, shared, ids["cancelled"],
            lambda s: s["state"] == "running" and s["steps_completed"] > 0,
        )  # fmt: skip
        assert running["ray_status"] == "RUNNING"
        assert running["node"] in ray_cluster.node_ids()
        assert running["open_phases"], "where it is"
        cancel = fleet(
            ray_cluster, shared, "cancel", ids["cancelled"], "--reason", REASON, "--no-wait"
        )
        assert cancel.returncode == 0, cancel.stderr
        assert f"cancel of {ids['cancelled']} requested: {REASON}" in cancel.stdout
        # Decided while TensorRT is held: it stops at the step that ends its window.
        wait_for_text(journal, b'"type":"cancel"')

    codes = {name: fleet(ray_cluster, shared, "wait", build_id) for name, build_id in ids.items()}
    assert {name: done.returncode for name, done in codes.items()} == {
        "built": 0, "cancelled": 3, "failed": 4,
    }, {name: done.stdout + done.stderr for name, done in codes.items()}  # fmt: skip

    statuses = {name: fleet_json(ray_cluster, shared, "status", i) for name, i in ids.items()}
    assert {name: s["outcome"] for name, s in statuses.items()} == {
        "built": "success", "cancelled": "cancellation", "failed": "failure",
    }  # fmt: skip
    events = {name: complete_journal(s["journal"]) for name, s in statuses.items()}
    (cancelled,) = [e for e in events["cancelled"] if isinstance(e, CancelRequested)]
    assert (cancelled.source, cancelled.reason) == ("file", REASON)
    end = events["cancelled"][-1]
    assert end.outcome is Outcome.CANCELLATION
    assert "stopped with" not in end.detail, "TensorRT stopped at its next step, not killed"
    assert Path(statuses["built"]["engine"]).stat().st_size > 0
    assert not Path(statuses["cancelled"]["engine"]).exists()
    assert not Path(statuses["failed"]["engine"]).exists()
    # Ray's own view of the three jobs: the exit codes of the contract.
    wait_until(
        lambda: all(ray_job(ray_cluster, i).driver_exit_code is not None for i in ids.values()),
        "Ray never gave the three jobs' exit codes",
        60,
    )
    exits = {name: ray_job(ray_cluster, i).driver_exit_code for name, i in ids.items()}
    assert exits == {"built": 0, "cancelled": 3, "failed": 4}


@pytest.mark.e2e
def test_a_build_that_outlives_its_grace_period_after_a_cancel_is_stopped_through_ray(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """trt-otel itself hung (stopped with SIGSTOP) in a silent window: the cancel file cannot
    land and trt-otel cannot escalate, so the Ray job is stopped, and only after the grace
    period."""
    shared = tmp_path / "shared"
    shared.mkdir()
    builds = RayFleet(ray_cluster.address, shared, stop_slack_s=1.0)
    options = ("--speed", "0", "--silence", "10m", "--grace", "3s", "--no-gpu")
    started = builds.start(BuildRequest(kind="demo", options=options))
    journal = Path(started.journal)
    wait_for_text(journal, b"Computing profile costs", timeout_s=120)
    writer = Writer.from_header(read_journal(journal).header)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        answer = builds.cancel(started.id, REASON, wait=True)
        waited_s = time.monotonic() - began
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(writer.pid, signal.SIGCONT)
    status = answer.status
    assert status is not None
    assert status.ray_status == "STOPPED", status
    assert status.state == "lost", "stopped from outside: its journal has no end"
    assert waited_s >= 3 + 1, "not before the grace period (and the slack) had passed"
    assert Path(shared / "builds" / started.id / "cancel").read_text() == f"{REASON}\n"


@pytest.mark.e2e
def test_requests_that_cannot_work_are_refused_before_anything_is_submitted(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"x")
    model = shared / "m.onnx"
    model.write_bytes(b"x")
    refusals = {
        "outside the shared folder": ("submit", str(outside)),
        "--journal is set by the fleet": ("submit", str(model), "--", "--journal", "j.jsonl"),
        "unrecognized arguments: --no-such-option": (
            "submit", str(model), "--", "--no-such-option",
        ),
        "ids are 12 hex digits": ("status", "../../etc"),
        "no build 0123456789ab": ("cancel", "0123456789ab"),
    }  # fmt: skip
    for message, arguments in refusals.items():
        done = fleet(ray_cluster, shared, *arguments)
        assert done.returncode == 2, (arguments, done.stderr)
        assert message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert not (shared / "builds").exists() or not any((shared / "builds").iterdir())


@pytest.mark.e2e
def test_a_build_record_of_the_shared_folder_is_checked_before_it_is_used(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """The shared folder is written by others: a record naming a path outside it, of the wrong
    shape, or that is not a file is refused in one line, and nothing is written or read."""
    shared = tmp_path / "shared"
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    good = {
        "id": "aaaaaaaaaaaa", "kind": "build", "submission_id": "trt-otel-aaaaaaaaaaaa",
        "entrypoint": ["trt-otel"], "model": None, "engine": None,
        "journal": str(shared / "journals" / "aaaaaaaaaaaa.jsonl"), "cancel_file": str(victim),
        "grace_s": 1.0, "num_gpus": 0.0, "submitted_wall_s": 0.0,
    }  # fmt: skip
    inside = str(shared / "c")
    records = {
        "aaaaaaaaaaaa": (json.dumps(good), "is outside the shared folder"),
        "bbbbbbbbbbbb": (json.dumps({**good, "id": "bbbbbbbbbbbb", "grace_s": "x"}), "cannot read"),
        "cccccccccccc": (json.dumps({**good, "cancel_file": inside}), "is not the record"),
        "dddddddddddd": (None, "not a regular file"),
    }  # fmt: skip
    for build_id, (text, _) in records.items():
        folder = shared / "builds" / build_id
        folder.mkdir(parents=True)
        if text is None:
            os.mkfifo(folder / "build.json")  # would block a plain open
        else:
            (folder / "build.json").write_text(text)
    for build_id, (_, message) in records.items():
        for action in ("status", "cancel"):
            done = fleet(ray_cluster, shared, action, build_id)
            assert done.returncode == 2, (build_id, done.stderr)
            assert message in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1
    assert victim.read_text() == "untouched\n"


@pytest.mark.e2e
def test_bad_ray_settings_are_usage_errors(tmp_path: Path) -> None:
    for arguments, message in (
        (["--ray", "127.0.0.1:8265", "--shared-dir", str(tmp_path)], "is an http:// address"),
        (["--ray", "http://127.0.0.1:1", "--shared-dir", str(tmp_path / "no")], "not a directory"),
        (["--shared-dir", str(tmp_path)], "give Ray's address"),
    ):
        done = subprocess.run(
            [*CLI, "fleet", "list", *arguments], capture_output=True, text=True, timeout=60,
            env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert message in done.stderr


@pytest.mark.e2e
def test_the_mcp_server_on_ray_restarted_between_calls_loses_nothing(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    pytest.importorskip("mcp")
    import_rtx()
    shared = tmp_path / "shared"
    shared.mkdir()
    # Held in its silent step until it is cancelled: the build still runs after a few server
    # restarts, however long they take (left to run, its window needed 3,000 blocks).
    residual = write_residual(shared / "residual.onnx", blocks=HELD_BLOCKS)
    hold = contextlib.ExitStack()

    async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await mcp_call(ray_cluster, shared, name, arguments)  # a new server each call

    async def scenario() -> None:
        started = await call(
            "start_build",
            {"kind": "build", "model": str(residual),
             # Stopped from outside soon after the cancel: what is left of its silent step
             # once it is let go need not be waited out.
             "options": ["--shapes", RESIDUAL_SHAPES, "--no-gpu", "--grace", "2s"]},
        )  # fmt: skip
        build_id = started["id"]
        journal = Path(started["journal"])
        await anyio.to_thread.run_sync(hold.enter_context, held_in_silent_step(journal))
        listed = await call("list_builds", {})
        assert [b["id"] for b in listed["builds"]] == [build_id]
        progressed = await call(
            "wait_build", {"id": build_id, "until": "progress", "timeout_s": 120}
        )
        assert progressed["status"]["state"] in ("running", "pending")
        deadline = time.monotonic() + 180
        while (await call("build_status", {"id": build_id}))["steps_completed"] == 0:
            assert time.monotonic() < deadline
        await call("cancel_build", {"id": build_id, "reason": REASON})
        # Decided while TensorRT is held, as in the test above: let go, it ends as a cancel.
        await anyio.to_thread.run_sync(wait_for_text, journal, b'"type":"cancel"')
        hold.close()
        ended = await call("wait_build", {"id": build_id, "until": "end", "timeout_s": 300})
        assert ended["reason"] == "ended"
        assert ended["status"]["outcome"] == "cancellation"
        assert ended["status"]["cancel"] == {"reason": REASON, "source": "file"}
        events = await call("build_events", {"id": build_id, "limit": 1000})
        assert events["events"][0]["type"] == "build_start"

    with hold:
        anyio.run(scenario)


@pytest.mark.e2e
def test_a_path_outside_the_shared_folder_is_refused_by_the_mcp_server_too(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [*CLI, "mcp", "--ray", "http://127.0.0.1:1", "--shared-dir", str(tmp_path),
         "--root", "/etc"],
        capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "outside --shared-dir" in done.stderr


def test_an_unfinished_journal_is_not_complete(tmp_path: Path) -> None:
    """The check the tests above rely on can fail."""
    journal = tmp_path / "j.jsonl"
    journal.write_text("")
    with pytest.raises((AssertionError, JournalError, IndexError)):
        complete_journal(str(journal))
