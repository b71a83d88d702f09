"""A real one-node SLURM cluster for the tests: ``munged`` on a key and a socket of its own,
``slurmctld`` and ``slurmd`` on free ports, all configured by a ``slurm.conf`` in a folder of the
test's (its state, spool and logs are there too), and the clients pointed at it with
``SLURM_CONF``. Nothing of a SLURM already on the machine (its ``/etc/slurm``, its munge socket)
is read or touched. Started as root, as a node's daemons are; every daemon is stopped by its
process id at the end, after the cluster's jobs have ended.

Processes are tracked by their parentage (``proctrack/linuxproc``) and tasks are not bound
(``task/none``), so no cgroup is needed: it runs in a container.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from prometheus_server import free_port
from restarts import started_afresh

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scancel", "scontrol", "sinfo", "squeue", "srun")
STARTUP_S = 60.0
FINAL_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
     "PREEMPTED", "TIMEOUT"}
)  # fmt: skip
"""A job's states once it has ended and its processes are gone (``COMPLETING`` is shown until
they are)."""


def _program(name: str) -> str | None:
    """Where ``name`` is: on PATH, or in the sbin folders a daemon is installed in."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")


def skip_without_slurm() -> dict[str, str]:
    """Every program the cluster needs, by name; or a skip that says what is missing."""
    found = {name: _program(name) for name in (*DAEMONS, "munge", *CLIENTS)}
    missing = sorted(name for name, path in found.items() if path is None)
    if missing:
        pytest.skip(
            f"SLURM is not installed here (no {', '.join(missing)}): "
            "apt-get install slurmctld slurmd munge slurm-client, as .ci/run does"
        )
    if os.geteuid() != 0:
        pytest.skip("a SLURM node's daemons run as root, and these tests are not root")
    return {name: path for name, path in found.items() if path is not None}


@dataclass(frozen=True)
class Job:
    """What ``scontrol show job`` says of a job: its fields, by name."""

    fields: Mapping[str, str]

    @property
    def state(self) -> str:
        return self.fields["JobState"]

    @property
    def exit_code(self) -> tuple[int, int]:
        """``ExitCode=STATUS:SIGNAL``: the batch script's exit status and the signal that ended
        it (0 where none did)."""
        status, _, signal_number = self.fields["ExitCode"].partition(":")
        return int(status), int(signal_number)


@dataclass(frozen=True)
class SlurmCluster:
    directory: Path
    conf: Path
    node: str
    programs: Mapping[str, str]
    daemons: tuple[subprocess.Popen[bytes], ...]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with the clients pointed at the cluster: a job sees it
        (``sbatch`` passes the submitter's environment on)."""
        return {**os.environ, **(extra or {}), "SLURM_CONF": str(self.conf)}

    def client(self, name: str, *arguments: str, env: Mapping[str, str] | None = None) -> str:
        """A client's output; fails, with what it said, when it fails."""
        done = subprocess.run(
            [self.programs[name], *arguments],
            env=self.environment(env), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{name} {' '.join(arguments)}: {done.stderr.strip()}"
        return done.stdout

    def sbatch(self, script: Path, *options: str, env: Mapping[str, str] | None = None) -> int:
        """Submits ``script``; its job id."""
        return int(self.client("sbatch", "--parsable", *options, str(script), env=env).strip())

    def job(self, job_id: int | str) -> Job:
        """A job, or an array's task (``ID_INDEX``)."""
        line = self.client("scontrol", "show", "job", "--oneliner", str(job_id)).strip()
        return Job(dict(token.partition("=")[::2] for token in line.split(" ") if "=" in token))

    def wait_for_state(
        self, job_id: int | str, states: frozenset[str], timeout_s: float = 60
    ) -> Job:
        deadline = time.monotonic() + timeout_s
        while (job := self.job(job_id)).state not in states:
            self._check_daemons("a job was awaited")
            assert time.monotonic() < deadline, (
                f"job {job_id} is {job.state}, not {' or '.join(sorted(states))}, "
                f"after {timeout_s:g}s"
            )
            time.sleep(0.05)
        return job

    def wait_for_end(self, job_id: int | str, timeout_s: float = 60) -> Job:
        """Until the job has ended and its processes are gone; what SLURM recorded of it."""
        return self.wait_for_state(job_id, FINAL_STATES, timeout_s)

    def logged_of(self, job_id: int | str, lines: int = 20) -> str:
        """The last lines the controller and the node logged of a job, for a failure's message:
        what SLURM did with it (allocated, requeued, launched, failed) and when."""
        job = str(job_id).partition("_")[0]
        marks = (f"JobId={job} ", f"JobId={job}\n", f"job {job} ", f"job {job}\n", f"[{job}.")
        said: list[str] = []
        for name in ("slurmctld", "slurmd"):
            log = self.directory / f"{name}.log"
            with contextlib.suppress(OSError):
                said += [
                    f"{name}: {line.rstrip()}"
                    for line in log.read_text(errors="replace").splitlines(keepends=True)
                    if any(mark in line for mark in marks)
                ]
        return "\n".join(sorted(said, key=lambda line: line.partition("[")[2])[-lines:])

    def node_state(self) -> str:
        return self.client("sinfo", "--noheader", "--nodes", self.node, "--format=%T").strip()

    def _check_daemons(self, what: str) -> None:
        for daemon in self.daemons:
            if daemon.poll() is not None:
                raise AssertionError(f"while {what}, {_log_tail(self.directory, daemon)}")

    def cancel_all(self, timeout_s: float = 60) -> None:
        """Cancels every job of the cluster, and waits until their processes are gone."""
        jobs = self.client("squeue", "--noheader", "--format=%i").split()
        if jobs:
            self.client("scancel", *jobs)
        for job in jobs:
            with contextlib.suppress(AssertionError):  # one gone from the records already
                self.wait_for_end(int(job.partition("_")[0]), timeout_s)


def trt_otel_on_path(folder: Path) -> dict[str, str]:
    """What a job's environment needs for ``trt-otel`` to be this checkout's: a ``trt-otel``
    command on PATH (written in ``folder``), as an installed one would be (the templates and
    the fleet's jobs call it by name)."""
    command = folder / "trt-otel"
    command.write_text(f'#!/bin/sh\nexec {sys.executable} -m trt_otel.app.cli "$@"\n')
    command.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO_ROOT)}


REPO_ROOT = Path(__file__).resolve().parents[1]


def _memory_mb() -> int:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


def _configuration(directory: Path, node: str) -> str:
    cpus = os.cpu_count() or 1
    memory = max(1, _memory_mb() // 2)  # below the host's: a node that has less is drained
    return f"""\
ClusterName=trtotel
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={directory}/munge.socket
CredType=cred/munge
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool
SlurmctldPidFile={directory}/slurmctld.pid
SlurmdPidFile={directory}/slurmd.pid
SlurmctldLogFile={directory}/slurmctld.log
SlurmdLogFile={directory}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={directory}/jobcomp.txt
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=3600
SchedulerParameters=sched_interval=1
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={node} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def slurm_cluster(directory: Path | None = None) -> Iterator[SlurmCluster]:
    """A one-node cluster whose node is idle, in a new folder under ``directory`` (kept, with
    its logs) or under the system's temporary folder (removed); its jobs cancelled and its
    daemons stopped at the end. Skips, saying why, where SLURM is not installed or this
    process is not root."""
    programs = skip_without_slurm()

    def start(stack: contextlib.ExitStack[bool | None]) -> SlurmCluster:
        where = Path(tempfile.mkdtemp(prefix="slurm-", dir=directory))
        if directory is None:
            stack.callback(shutil.rmtree, where, ignore_errors=True)
        return stack.enter_context(_one_cluster(where, programs))

    with started_afresh(start, DaemonExitedError) as cluster:
        yield cluster


class DaemonExitedError(AssertionError):
    """A daemon exited while the cluster started (its log's tail says why)."""


@contextlib.contextmanager
def _one_cluster(directory: Path, programs: Mapping[str, str]) -> Iterator[SlurmCluster]:
    node = socket.gethostname().split(".")[0]
    for folder in ("state", "spool"):
        (directory / folder).mkdir()
    conf = directory / "slurm.conf"
    conf.write_text(_configuration(directory, node), encoding="ascii")
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    environment = {**os.environ, "SLURM_CONF": str(conf)}
    started: list[subprocess.Popen[bytes]] = []

    def start(*command: str) -> subprocess.Popen[bytes]:
        name = Path(command[0]).name
        with open(directory / f"{name}.out", "wb") as output:
            process = subprocess.Popen(
                command, stdout=output, stderr=subprocess.STDOUT, env=environment,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        started.append(process)
        return process

    cluster = SlurmCluster(directory, conf, node, programs, ())
    try:
        start(
            programs["munged"], "--foreground", "--force",
            f"--socket={directory}/munge.socket", f"--key-file={key}",
            f"--log-file={directory}/munged.log", f"--pid-file={directory}/munged.pid",
            f"--seed-file={directory}/munged.seed",
        )  # fmt: skip
        _wait((directory / "munge.socket").exists, "munged started", directory, started)
        start(programs["slurmctld"], "-D", "-i", "-f", str(conf))
        start(programs["slurmd"], "-D", "-N", node, "-f", str(conf))
        cluster = SlurmCluster(directory, conf, node, programs, tuple(started))

        def idle() -> bool:
            return cluster.node_state() == "idle"

        _wait(idle, f"node {node} became idle", directory, started)
        yield cluster
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            if len(started) == len(DAEMONS) and all(p.poll() is None for p in started):
                cluster.cancel_all()
        for process in reversed(started):  # slurmd, slurmctld, then the munged they talk to
            _stop(process)


def _log_tail(directory: Path, process: subprocess.Popen[bytes]) -> str:
    """The last lines a daemon logged (its log file, else what it printed)."""
    name = Path(str(process.args[0])).name  # type: ignore[index]
    for log in (directory / f"{name}.log", directory / f"{name}.out"):
        if log.exists() and (lines := log.read_text(errors="replace").strip().splitlines()):
            return f"{name} exited ({process.returncode}): {' | '.join(lines[-5:])}"
    return f"{name} exited ({process.returncode}), saying nothing"


def _wait(
    condition: Callable[[], bool],
    what: str,
    directory: Path,
    processes: list[subprocess.Popen[bytes]],
) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        for process in processes:
            if process.poll() is not None:
                raise DaemonExitedError(f"while {what}, {_log_tail(directory, process)}")
        with contextlib.suppress(AssertionError, OSError):
            if condition():
                return
        assert time.monotonic() < deadline, f"SLURM: timed out while {what}"
        time.sleep(0.05)
