"""A real local Ray cluster for the tests: a head (with Ray's dashboard, which serves the Job
Submission API) and a second node joined to it, each a ``ray start --block`` process of its own
session, on free ports (nothing of another Ray on this machine is touched), stopped by ending
those sessions.

The jobs' entrypoint is ``trt-otel ...``: the nodes are started with this interpreter's folder
first on their PATH, as a cluster's image would have trt-otel installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_server import free_port
from restarts import started_afresh

STARTUP_S = 180.0


@dataclass(frozen=True)
class RayCluster:
    address: str
    """The Job Submission API's address (the head's dashboard)."""
    gcs: str
    processes: tuple[subprocess.Popen[bytes], ...]
    logs: Path

    def node_ids(self) -> set[str]:
        with urllib.request.urlopen(f"{self.address}/nodes?view=summary", timeout=10) as f:
            body = json.load(f)
        return {
            node["raylet"]["nodeId"]
            for node in body["data"]["summary"]
            if node["raylet"].get("state") == "ALIVE"
        }


def _ports() -> list[str]:
    """Every port a node listens on, free ones: Ray's defaults are fixed numbers."""
    return [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--worker-port-list={','.join(str(free_port()) for _ in range(8))}",
    ]


def _start(arguments: list[str], log: Path) -> subprocess.Popen[bytes]:
    ray = shutil.which("ray", path=os.path.dirname(sys.executable))
    assert ray is not None, "ray's command is installed with the ray package"
    environment = {
        **os.environ,
        "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [ray, "start", "--block", "--disable-usage-stats", *arguments],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,  # its own session: ended whole, and only it
        )
    _LOGS[process.pid] = log
    return process


_LOGS: dict[int, Path] = {}
"""Each started node's log, by its process id."""


def _log_tail(process: subprocess.Popen[bytes]) -> str:
    log = _LOGS.get(process.pid)
    if log is None or not log.exists():
        return "no log"
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])


def _wait(condition: object, what: str, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        for process in processes:
            if process.poll() is not None:
                raise RayNodeExitedError(f"a Ray node exited while {what}: {_log_tail(process)}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            if condition():  # type: ignore[operator]
                return
        assert time.monotonic() < deadline, f"Ray: timed out while {what}"
        time.sleep(0.5)


@contextlib.contextmanager
def ray_cluster(head_cpus: int = 1, worker_cpus: int = 2) -> Iterator[RayCluster]:
    """A head and a second node; yields once the head's job API answers and both nodes are
    alive (started again, with other ports, when a node exits while starting)."""

    def start(stack: contextlib.ExitStack[bool | None]) -> RayCluster:
        return stack.enter_context(_one_cluster(head_cpus, worker_cpus))

    with started_afresh(start, RayNodeExitedError) as cluster:
        yield cluster


class RayNodeExitedError(AssertionError):
    """A Ray node exited while the cluster started (its log's tail says why)."""


@contextlib.contextmanager
def _one_cluster(head_cpus: int, worker_cpus: int) -> Iterator[RayCluster]:
    temp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # short: Ray's socket paths
    gcs_port, dashboard_port = free_port(), free_port()
    gcs = f"127.0.0.1:{gcs_port}"
    address = f"http://127.0.0.1:{dashboard_port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        started.append(
            _start(
                [
                    "--head",
                    f"--port={gcs_port}",
                    "--node-ip-address=127.0.0.1",
                    f"--num-cpus={head_cpus}",
                    "--num-gpus=0",
                    "--include-dashboard=true",
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={dashboard_port}",
                    f"--ray-client-server-port={free_port()}",
                    f"--temp-dir={temp}",
                    *_ports(),
                ],
                temp / "head.log",
            )
        )
        cluster = RayCluster(address, gcs, tuple(started), temp)

        def head_serves() -> bool:
            with urllib.request.urlopen(f"{address}/api/version", timeout=5) as f:
                return bool(f.status == 200)

        _wait(head_serves, "the head started", started)
        started.append(
            _start(
                [
                    f"--address={gcs}",
                    "--node-ip-address=127.0.0.1",
                    f"--num-cpus={worker_cpus}",
                    "--num-gpus=0",
                    *_ports(),
                ],
                temp / "worker.log",
            )
        )
        cluster = RayCluster(address, gcs, tuple(started), temp)
        _wait(lambda: len(cluster.node_ids()) == 2, "the second node joined", started)
        yield cluster
    finally:
        # Killed, not stopped: on SIGTERM, `ray start --block` waits some 30 s for its raylet
        # and GCS to wind down, and nothing of a test cluster is worth keeping. Every process
        # of a node (its raylet, GCS, dashboard, workers and jobs) is in the node's session and
        # process group, and its files are in the temporary folder removed below.
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in started:
            process.wait()
        shutil.rmtree(temp, ignore_errors=True)
