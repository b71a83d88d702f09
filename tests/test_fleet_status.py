"""A fleet's build as one document (app/fleet_status.py): from its journal, folded as it grows
and started again when the file is replaced, and, while it runs, from its own HTTP view's
``/status``, read field by field."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from trt_otel import BuildMonitor, JournalWriter, ManualClock
from trt_otel.app.commands import build_parser, command_of
from trt_otel.app.config import UsageError
from trt_otel.app.fleet import Fleet
from trt_otel.app.fleet_arguments import FleetCommand
from trt_otel.app.fleet_documents import BuildStatus, OpenPhase
from trt_otel.app.fleet_requests import MAX_EVENTS, FleetError
from trt_otel.app.fleet_status import (
    JournalFold,
    events_page,
    journal_events,
    journal_status,
    wait_for,
    with_view,
)
from trt_otel.app.ray_fleet import PREFIX, RayFleet
from trt_otel.app.slurm_fleet import SlurmFleet, job_of, scontrol_fields


def journal_of(path: Path, *, phases: int, took_s: float = 0.0) -> str:
    """A finished build's journal at ``path``, with ``phases`` phases, ``took_s`` long on its
    clock; its build id."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.log.follow(JournalWriter(path))
    monitor.start()
    for index in range(phases):
        monitor.phase_start(f"phase {index}", None, 1)
        monitor.step_complete(f"phase {index}", 0)
        monitor.phase_finish(f"phase {index}")
    clock.advance(took_s)
    monitor.end()
    monitor.close()
    return monitor.state.build_id or ""


def test_a_finished_builds_status_says_how_long_it_took(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal_of(journal, phases=1, took_s=12.5)
    fold = JournalFold(journal)
    state = fold.update()
    status = journal_status(
        state, fold.attempts, id="0123456789ab", kind="demo", state="finished", model=None,
        engine=None, journal=str(journal),
    )  # fmt: skip
    assert (status.outcome, status.exit_code, status.elapsed_s) == ("success", 0, 12.5)


def test_a_journal_replaced_by_another_is_folded_afresh(tmp_path: Path) -> None:
    """A retried build's journal written anew (another file renamed over it), larger than the
    first: its fold starts again rather than read on from where the first one's ended."""
    journal = tmp_path / "journal.jsonl"
    journal_of(journal, phases=1)
    fold = JournalFold(journal)
    fold.update()
    other = tmp_path / "other.jsonl"
    second = journal_of(other, phases=5)
    os.replace(other, journal)
    state = fold.update()
    assert state.build_id == second
    assert state.outcome is not None and state.steps_completed_total == 5


def test_the_open_phases_are_read_from_the_builds_view() -> None:
    """From the root to the innermost open phase, each with its steps done of its steps."""
    journal = Path("unused.jsonl")
    status = journal_status(
        JournalFold(journal).state, [], id="0123456789ab", kind="demo", state="running",
        model=None, engine=None, journal=str(journal),
    )  # fmt: skip
    view = {
        "status": "running",
        "steps_completed": 7,
        "phases": [
            {"name": "done", "status": "finished", "last_step": 0, "num_steps": 1},
            {
                "name": "Building engine",
                "status": "open",
                "last_step": 2,
                "num_steps": 10,
                "elapsed_s": 4.5,
                "children": [
                    {"name": "Tactics", "status": "open", "last_step": -1, "num_steps": 3,
                     "elapsed_s": "soon"},
                ],
            },
        ],
    }  # fmt: skip
    seen = with_view(status, view)
    assert seen.open_phases == [
        OpenPhase("Building engine", "3/10", 4.5),
        OpenPhase("Tactics", "0/3", None),  # what is no number is not shown as one
    ]
    assert (seen.state, seen.steps_completed) == ("running", 7)


def test_pages_of_events_go_on_from_where_the_last_one_ended(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal_of(journal, phases=2)
    events = journal_events(journal)
    first = events_page(events, -1, 3)
    assert first.more and first.next_seq == events[2].seq
    rest = events_page(events, first.next_seq, 1000)
    assert not rest.more and rest.next_seq == events[-1].seq
    assert len(first.events) + len(rest.events) == len(events)
    # Nothing after the last: the caller's place is kept, not sent back to the first event.
    after = events_page(events, rest.next_seq, 1000)
    assert (after.events, after.next_seq, after.more) == ([], rest.next_seq, False)


def _same(status: BuildStatus) -> BuildStatus:
    return status


def test_a_lost_build_ends_a_wait_at_once() -> None:
    """A build lost (its process gone without an end) or that failed to start will not
    progress: a wait for its end returns, rather than wait out its timeout."""
    journal = Path("unused.jsonl")
    for ended in ("lost", "failed_to_start", "finished"):
        status = journal_status(
            JournalFold(journal).state, [], id="0123456789ab", kind="demo", state=ended,
            model=None, engine=None, journal=str(journal),
        )  # fmt: skip
        waited = wait_for(functools.partial(_same, status), "end", 600.0, poll_s=600.0)
        assert waited.reason == "ended", ended


def test_the_fleets_list_says_when_each_build_started(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    folder = fleet.state_dir / "0123456789ab"
    folder.mkdir(parents=True)
    record = {"id": "0123456789ab", "kind": "demo", "argv": ["demo"], "pid": 2**22 + 1,
              "started_wall_s": 1_700_000_000.5, "model": None, "engine": None}  # fmt: skip
    (folder / "build.json").write_text(json.dumps(record))
    journal_of(folder / "journal.jsonl", phases=1)
    [listed] = fleet.list()
    assert (listed.id, listed.state, listed.started_wall_s) == (
        "0123456789ab",
        "finished",
        1_700_000_000.5,
    )


class StandInRay:
    """Ray's job client as the Ray fleet asks it, answering for one job in ``status``."""

    def __init__(self, status: str) -> None:
        self.status = status

    def get_job_info(self, submission_id: str) -> SimpleNamespace:
        return SimpleNamespace(
            status=self.status, message="the job ended", driver_exit_code=1, driver_node_id="n1"
        )

    def stop_job(self, submission_id: str) -> bool:
        return False


def ray_build(shared: Path, build_id: str) -> Path:
    """A build's record in Ray's shared folder, as the fleet writes it: its journal's path."""
    folder = shared / "builds" / build_id
    folder.mkdir(parents=True)
    journal = shared / "journals" / f"{build_id}.jsonl"
    journal.parent.mkdir(exist_ok=True)
    record = {"id": build_id, "kind": "demo", "submission_id": PREFIX + build_id,
              "entrypoint": ["trt-otel", "demo"], "model": None, "engine": None,
              "journal": str(journal), "cancel_file": str(folder / "cancel"), "grace_s": 30.0,
              "num_gpus": 0.0, "submitted_wall_s": 1_700_000_000.0}  # fmt: skip
    (folder / "build.json").write_text(json.dumps(record))
    return journal


def test_a_ray_job_that_ended_without_its_builds_end_is_lost_or_never_started(
    tmp_path: Path,
) -> None:
    """Ray says the job failed: a build whose journal began is lost (its open phases, how
    long they had run, still said), one whose journal never began failed to start."""
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=StandInRay("FAILED"))
    began = ray_build(tmp_path, "0123456789aa")
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(began))
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    monitor.close()  # the process died: no end
    ray_build(tmp_path, "0123456789bb")
    lost, never = fleet.status("0123456789aa"), fleet.status("0123456789bb")
    assert (lost.state, never.state) == ("lost", "failed_to_start")
    [phase] = lost.open_phases
    assert (phase.name, phase.steps) == ("Building engine", "0/3")
    assert phase.elapsed_s is not None and phase.elapsed_s > 0
    assert never.error == "the job ended" and lost.ray_status == "FAILED"


def test_fleet_wait_that_cannot_follow_a_build_to_its_end_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trt-otel fleet wait`` exits with the build's own exit code; a build it cannot follow
    to its end (still running at the timeout, or lost) has none, and is 2, never 0."""
    from trt_otel.app.fleet_arguments import FleetCommand
    from trt_otel.app.fleet_command import _act

    began = ray_build(tmp_path, "0123456789aa")
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(began))
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    monitor.close()  # no end (yet)
    finished = ray_build(tmp_path, "0123456789bb")
    journal_of(finished, phases=1)

    def wait(build_id: str, ray_status: str) -> int:
        fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=StandInRay(ray_status))
        command = FleetCommand(action="wait", address=fleet.address, shared_dir=tmp_path,
                               build_id=build_id, timeout_s=0.0)  # fmt: skip
        return _act(fleet, command)

    assert wait("0123456789aa", "RUNNING") == 2
    assert "still running after" in capsys.readouterr().out
    assert wait("0123456789aa", "FAILED") == 2
    assert "0123456789aa: lost" in capsys.readouterr().out
    assert wait("0123456789bb", "SUCCEEDED") == 0


def test_scontrol_and_sacct_answers_become_a_jobs_phase_exit_code_and_node() -> None:
    """SLURM's words for a job, parsed and never trusted: its state's phase, the script's exit
    status of ``STATUS:SIGNAL``, ``(null)`` for no node, a state SLURM may add unknown."""
    fields = scontrol_fields(
        "JobId=42 JobName=trt-otel-0123456789ab JobState=COMPLETING Reason=None "
        "ExitCode=3:0 NodeList=node-07 Command=/x/job.sh arg=with=equals\n"
    )
    job = job_of(fields["JobState"], fields["ExitCode"], fields["NodeList"], fields["Reason"])
    assert (job.status, job.phase, job.exit_code, job.node, job.message) == (
        "COMPLETING", "running", 3, "node-07", None,
    )  # fmt: skip
    waiting = job_of("PENDING", "0:0", "(null)", "Resources")
    assert (waiting.phase, waiting.node, waiting.message) == ("pending", None, "Resources")
    assert job_of("CANCELLED", "0:15", "n1", None).phase == "ended"
    assert job_of("PREEMPTED", "0:15", "n1", None).phase == "ended"
    assert job_of("SOMETHING_NEW", "x:y", "", None).phase is None
    assert job_of("FAILED", "99999:0", None, None).exit_code is None
    assert scontrol_fields("") == {}


def test_a_ray_jobs_exit_code_and_node_are_its_drivers(tmp_path: Path) -> None:
    """Ray's job info says the driver's exit code and node: the status's job exit code (and
    Ray's own name for it) and node are those."""
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=StandInRay("FAILED"))
    ray_build(tmp_path, "0123456789aa")
    status = fleet.status("0123456789aa")
    assert (status.job_exit_code, status.ray_exit_code, status.node) == (1, 1, "n1")


def test_a_page_of_a_fleets_events_holds_1_to_the_most_events(tmp_path: Path) -> None:
    """``limit`` is 1 to :data:`MAX_EVENTS`: an empty page or a larger one is refused."""
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=StandInRay("RUNNING"))
    journal = ray_build(tmp_path, "0123456789aa")
    journal_of(journal, phases=2)
    assert len(fleet.events("0123456789aa", limit=1).events) == 1
    for limit in (0, MAX_EVENTS + 1):
        with pytest.raises(FleetError, match="limit must be 1 to"):
            fleet.events("0123456789aa", limit=limit)


def fleet_command(shared: Path, action: str, *arguments: str) -> FleetCommand:
    command = command_of(
        build_parser().parse_args(
            ["fleet", action, "--ray", "http://head:8265", "--shared-dir", str(shared),
             *arguments]
        )
    )  # fmt: skip
    assert isinstance(command, FleetCommand)
    return command


def test_fleet_cancel_follows_the_build_to_its_end_unless_told_not_to(tmp_path: Path) -> None:
    assert fleet_command(tmp_path, "cancel", "0123456789ab").wait is True
    assert fleet_command(tmp_path, "cancel", "0123456789ab", "--no-wait").wait is False


def test_a_partition_or_a_time_limit_alone_needs_slurm(tmp_path: Path) -> None:
    """Each of SLURM's own options, given on its own without ``--slurm``, is refused."""
    for slurms in (("--partition", "debug"), ("--time-limit", "10m")):
        with pytest.raises(UsageError, match="SLURM's: give --slurm"):
            fleet_command(tmp_path, "submit", *slurms, "model.onnx")


def stand_in_slurm(folder: Path, *, sacct_says: str) -> dict[str, str]:
    """SLURM's commands as a cluster with accounting answers for a job its controller no
    longer knows (ended long ago): ``scontrol`` does not know it, ``sacct`` says
    ``sacct_says``. The environment that finds them."""
    folder.mkdir()
    scripts = {
        "sbatch": "exit 1",
        "scancel": "exit 1",
        "scontrol": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
        "sacct": f"printf '%s\\n' '{sacct_says}'",
    }
    for name, body in scripts.items():
        script = folder / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    return {"PATH": f"{folder}:{os.defpath}"}


@pytest.mark.e2e
def test_a_job_the_controller_forgot_is_told_by_slurms_accounting(tmp_path: Path) -> None:
    """``sacct``'s state of a job (``CANCELLED by 0``: the state, then who) and its node,
    where ``scontrol`` no longer knows the job: a build that never began failed to start."""
    shared = tmp_path / "shared"
    environment = stand_in_slurm(tmp_path / "bin", sacct_says="CANCELLED by 0|0:15|node-07")
    folder = shared / "builds" / "0123456789aa"
    folder.mkdir(parents=True)
    record = {"id": "0123456789aa", "kind": "demo", "slurm_job_id": "42",
              "entrypoint": ["trt-otel", "demo"], "model": None, "engine": None,
              "journal": str(shared / "journals" / "0123456789aa.jsonl"),
              "cancel_file": str(folder / "cancel"), "grace_s": 30.0, "num_gpus": 0.0,
              "submitted_wall_s": 1_700_000_000.0, "partition": None,
              "time_limit_s": None}  # fmt: skip
    (folder / "build.json").write_text(json.dumps(record))
    status = SlurmFleet(shared, environment=environment).status("0123456789aa")
    assert (status.job_status, status.job_exit_code, status.node) == ("CANCELLED", 0, "node-07")
    assert status.state == "failed_to_start"


def test_a_jobs_state_is_read_whatever_its_case() -> None:
    job = job_of("completing", "0:0", "n1", None)
    assert (job.status, job.phase) == ("COMPLETING", "running")
