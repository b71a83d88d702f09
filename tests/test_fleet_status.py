"""A fleet's build as one document (app/fleet_status.py): from its journal, folded as it grows
and started again when the file is replaced, and, while it runs, from its own HTTP view's
``/status``, read field by field."""

from __future__ import annotations

import functools
import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trt_otel import BuildMonitor, JournalWriter, ManualClock, Outcome
from trt_otel.app.commands import command_of, parse_command_line
from trt_otel.app.config import UsageError
from trt_otel.app.fleet import Fleet, _lifecycle
from trt_otel.app.fleet_arguments import FleetCommand
from trt_otel.app.fleet_command import _act, scheduled_fleet
from trt_otel.app.fleet_documents import BuildRequest, BuildStatus, OpenPhase, State
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
from trt_otel.app.shared_fleet import Planned
from trt_otel.app.slurm_fleet import SlurmFleet, job_of, scontrol_fields
from trt_otel.core.attempts import ATTEMPT, ATTEMPTS


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


@pytest.mark.parametrize(
    ("first", "then", "in_place"),
    [(1, 5, False), (5, 1, True)],
    ids=["replaced-by-a-larger-one", "rewritten-in-place-shorter"],
)
def test_a_journal_written_anew_is_folded_afresh(
    tmp_path: Path, first: int, then: int, in_place: bool
) -> None:
    """A retried build's journal written anew: another file renamed over it, larger than the
    first, or the same file truncated and written again, shorter than what was read of it. Its
    fold starts again rather than read on from where the first one's ended (or wait for it to
    grow past there)."""
    journal = tmp_path / "journal.jsonl"
    journal_of(journal, phases=first)
    fold = JournalFold(journal)
    fold.update()
    other = tmp_path / "other.jsonl"
    second = journal_of(other, phases=then)
    if in_place:
        inode = journal.stat().st_ino
        journal.write_bytes(other.read_bytes())
        assert journal.stat().st_ino == inode, "the same file"
    else:
        os.replace(other, journal)
    state = fold.update()
    assert (state.build_id, state.steps_completed_total) == (second, then)
    assert state.outcome is not None


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


def status_now(state: State, steps: int = 0) -> BuildStatus:
    """A build's status as a fleet answers it, ``steps`` steps done."""
    return BuildStatus(id="0123456789ab", kind="demo", state=state, model=None, engine=None,
                       journal="unused.jsonl", build_id="b", last_seq=steps, progress=0.0,
                       steps_completed=steps)  # fmt: skip


def one_after_another(*statuses: BuildStatus) -> Callable[[], BuildStatus]:
    """A build's status as it is asked again and again: each in turn, then the last."""
    left = list(statuses)
    return lambda: left.pop(0) if len(left) > 1 else left[0]


def test_a_wait_for_progress_returns_at_the_next_step_and_a_wait_for_the_end_at_the_end() -> None:
    def build() -> Callable[[], BuildStatus]:
        return one_after_another(
            status_now("running"), status_now("running", 1), status_now("finished", 2)
        )

    progressed = wait_for(build(), "progress", 600.0, poll_s=0.0)
    assert (progressed.reason, progressed.status.steps_completed) == ("progressed", 1)
    ended = wait_for(build(), "end", 600.0, poll_s=0.0)
    assert (ended.reason, ended.status.state) == ("ended", "finished")


def test_a_wait_for_the_end_goes_on_while_a_ladder_retries() -> None:
    """A retry ladder's attempt ended, the next to follow: the build has not ended."""
    build = one_after_another(
        status_now("running"), status_now("retrying", 1), status_now("finished", 2)
    )
    ended = wait_for(build, "end", 600.0, poll_s=0.0)
    assert (ended.reason, ended.status.state) == ("ended", "finished")


def test_a_build_its_view_says_is_cancelling_is_cancelling() -> None:
    status = status_now("running")
    assert with_view(status, {"status": "cancelling"}).state == "cancelling"
    assert with_view(status, {"status": "running"}).state == "running"


def attempt(journal: Path, number: int, of: int, outcome: Outcome) -> None:
    """Attempt ``number`` of a retry ladder of ``of``, ended in ``outcome``, added to
    ``journal``."""
    monitor = BuildMonitor(attributes={ATTEMPT: number, ATTEMPTS: of})
    monitor.log.follow(JournalWriter(journal, append=number > 1))
    monitor.start()
    monitor.end(outcome)
    monitor.close()


def test_each_attempt_of_a_ladder_says_how_it_ended(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    attempt(journal, 1, 2, Outcome.TIMEOUT)
    attempt(journal, 2, 2, Outcome.SUCCESS)
    fold = JournalFold(journal)
    fold.update()
    assert [(a.number, a.of, a.outcome, a.exit_code) for a in fold.attempts] == [
        (1, 2, "timeout", 3),
        (2, 2, "success", 0),
    ]


def test_a_ladders_attempt_ended_is_retrying_and_its_last_one_finished(tmp_path: Path) -> None:
    """While the build's process lives on: after an attempt that is not the last, the next
    may follow; after the last, the build has finished."""
    journal = tmp_path / "journal.jsonl"
    fold = JournalFold(journal)
    attempt(journal, 1, 2, Outcome.TIMEOUT)
    assert _lifecycle(fold.update(), True, None, fold.attempts, tmp_path) == ("retrying", None)
    attempt(journal, 2, 2, Outcome.TIMEOUT)
    assert _lifecycle(fold.update(), True, None, fold.attempts, tmp_path) == ("finished", None)


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


def test_the_local_fleet_lists_its_builds_oldest_first(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    for build_id, started in (("bbbbbbbbbbbb", 1_700_000_000), ("aaaaaaaaaaaa", 1_700_000_100)):
        folder = fleet.state_dir / build_id
        folder.mkdir(parents=True)
        record = {"id": build_id, "kind": "demo", "argv": ["demo"], "pid": 2**22 + 1,
                  "started_wall_s": float(started), "model": None, "engine": None}  # fmt: skip
        (folder / "build.json").write_text(json.dumps(record))
        os.utime(folder, (started, started))
    assert fleet.ids() == ["bbbbbbbbbbbb", "aaaaaaaaaaaa"]


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


def fleet_command(
    shared: Path, action: str, *arguments: str, ray: str = "http://head:8265"
) -> FleetCommand:
    command = command_of(
        parse_command_line(["fleet", action, "--ray", ray, "--shared-dir", str(shared), *arguments])
    )
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


class RecordingRay(StandInRay):
    """Ray's job client taking every job, and keeping what each submission and stop asked."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.submitted: list[dict[str, Any]] = []
        self.stopped: list[str] = []

    def submit_job(self, **job: Any) -> str:
        self.submitted.append(job)
        return str(job["submission_id"])

    def stop_job(self, submission_id: str) -> bool:
        self.stopped.append(submission_id)
        return True


def test_fleet_submit_reserves_the_gpus_and_cpus_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ray = RecordingRay("PENDING")
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=ray)
    command = fleet_command(tmp_path, "submit", "--demo", "--num-gpus", "1", "--num-cpus", "8")
    assert _act(fleet, command) == 0
    [job] = ray.submitted
    assert (job["entrypoint_num_gpus"], job["entrypoint_num_cpus"]) == (1.0, 8.0)
    assert capsys.readouterr().out.startswith("submitted ")


def test_a_ray_builds_history_is_the_shared_journals_unless_its_request_names_one(
    tmp_path: Path,
) -> None:
    """Every build's journal is in the shared folder's ``journals``: a build reads its forecast
    from there, unless its request names another history (which is then its only one)."""
    ray = RecordingRay("PENDING")
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=ray)
    own = tmp_path / "history"
    own.mkdir()
    fleet.start(BuildRequest(kind="demo"))
    fleet.start(BuildRequest(kind="demo", options=("--history", str(own))))

    def histories(job: dict[str, Any]) -> list[str]:
        argv = shlex.split(job["entrypoint"])
        return [argv[i + 1] for i, word in enumerate(argv) if word == "--history"]

    shared, given = ray.submitted
    assert histories(shared) == [str(tmp_path.resolve() / "journals")]
    assert histories(given) == [str(own)], "the request's own, alone"


def test_fleet_list_shows_an_ended_builds_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal_of(ray_build(tmp_path, "0123456789bb"), phases=1)
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=StandInRay("SUCCEEDED"))
    assert _act(fleet, fleet_command(tmp_path, "list")) == 0
    header, row, *_ = capsys.readouterr().out.splitlines()
    assert header.split() == ["ID", "STATE", "PROGRESS", "RAY", "MODEL"]
    assert row.split() == ["0123456789bb", "success", "100%", "SUCCEEDED", "-"]


def test_a_pending_build_cancelled_is_stopped_by_its_scheduler_without_a_cancel_file(
    tmp_path: Path,
) -> None:
    """Not building yet, a build's cancel is its job's stop; a cancel file would cancel it the
    moment it began, had the stop missed it."""
    ray = RecordingRay("PENDING")
    ray_build(tmp_path, "0123456789aa")
    answer = RayFleet("http://127.0.0.1:1", tmp_path, client=ray).cancel("0123456789aa", "no")
    assert answer.note == "the build had not started: its Ray job was stopped"
    assert ray.stopped == [PREFIX + "0123456789aa"]
    assert not (tmp_path / "builds" / "0123456789aa" / "cancel").exists()


def running_ray_build(tmp_path: Path, ray: RecordingRay) -> RayFleet:
    """A build ``0123456789aa`` whose journal began (a phase open, no cancel recorded), its
    Ray job running: its fleet, 30 s of grace and 15 s of slack."""
    journal = ray_build(tmp_path, "0123456789aa")
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(journal))
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    monitor.close()
    return RayFleet("http://127.0.0.1:1", tmp_path, client=ray, stop_slack_s=15.0)


def test_a_build_whose_cancel_file_is_written_is_cancelling_before_its_journal_says_so(
    tmp_path: Path,
) -> None:
    fleet = running_ray_build(tmp_path, RecordingRay("RUNNING"))
    assert fleet.status("0123456789aa").state == "running"
    fleet.cancel("0123456789aa", "over budget")
    status = fleet.status("0123456789aa")
    assert (status.state, status.cancel_requested, status.cancel) == ("cancelling", True, None)


def test_a_cancelled_builds_job_is_stopped_only_once_its_grace_and_the_slack_have_passed(
    tmp_path: Path,
) -> None:
    ray = RecordingRay("RUNNING")
    fleet = running_ray_build(tmp_path, ray)
    answer = fleet.cancel("0123456789aa", "over budget")
    assert "stopped if it still runs 45s from now" in answer.note
    assert fleet.status("0123456789aa").job_stop_requested is None
    cancel_file = tmp_path / "builds" / "0123456789aa" / "cancel"
    for ago, stopped in ((40, None), (50, True)):  # within the grace and slack; past both
        asked = time.time() - ago
        os.utime(cancel_file, (asked, asked))  # as if asked that long ago
        assert fleet.status("0123456789aa").job_stop_requested is stopped, ago
    assert ray.stopped == [PREFIX + "0123456789aa"]


def test_an_https_address_is_rays_job_api_too(tmp_path: Path) -> None:
    assert fleet_command(tmp_path, "list", ray="https://head:8265").address == "https://head:8265"


def test_fleet_submits_build_options_are_those_after_the_double_dash(tmp_path: Path) -> None:
    """The ``--`` before the build options is none of them: where argparse drops it
    (``MODEL -- OPTIONS``), and where it leaves one at their head (it drops only the first of
    ``MODEL -- -- OPTIONS``)."""
    for dashes in (["--"], ["--", "--"]):
        command = fleet_command(tmp_path, "submit", "model.onnx", *dashes, "--no-gpu", "--fp16")
        assert (command.model, command.options) == ("model.onnx", ("--no-gpu", "--fp16")), dashes


def test_fleet_submit_takes_its_output_either_side_of_the_model_and_a_demo_no_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``MODEL -o ENGINE -- OPTIONS``, as the usage line shows it: the output is the fleet's,
    the options after ``--`` the build's; a demo's options are not its model."""
    for arguments in (["model.onnx", "-o", "m.engine"], ["-o", "m.engine", "model.onnx"]):
        command = fleet_command(tmp_path, "submit", *arguments, "--", "--fp16", "-o", "x")
        assert (command.model, command.output) == ("model.onnx", "m.engine"), arguments
        assert command.options == ("--fp16", "-o", "x"), "the build's, refused by the fleet"
    demo = fleet_command(tmp_path, "submit", "--demo", "--", "--speed", "0")
    assert (demo.kind, demo.model, demo.options) == ("demo", None, ("--speed", "0"))
    with pytest.raises(SystemExit):  # a build option without its "--": refused, not taken
        fleet_command(tmp_path, "submit", "model.onnx", "--fp16")
    said = capsys.readouterr().err
    assert "unrecognized arguments: --fp16 (the build's options go after --" in said


def test_fleet_wait_gives_up_after_its_timeout(tmp_path: Path) -> None:
    assert fleet_command(tmp_path, "wait", "0123456789ab", "--timeout", "10m").timeout_s == 600.0
    assert fleet_command(tmp_path, "wait", "0123456789ab").timeout_s == 24 * 3600.0


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


def test_slurm_is_refused_a_part_of_a_gpu_or_a_cpu_before_it_is_asked(tmp_path: Path) -> None:
    """SLURM allocates whole GPUs and CPUs: the fleet (the MCP server's) refuses a part of
    either before it looks for SLURM's commands."""
    for gpus, cpus in ((0.5, 1.0), (1.0, 2.5)):
        with pytest.raises(FleetError, match="SLURM allocates whole GPUs and CPUs"):
            scheduled_fleet("slurm", None, tmp_path, num_gpus=gpus, num_cpus=cpus)


def test_a_slurm_build_is_refused_without_a_cpu(tmp_path: Path) -> None:
    environment = stand_in_slurm(tmp_path / "bin", sacct_says="")
    fleet = SlurmFleet(tmp_path, environment=environment)
    with pytest.raises(FleetError, match="num_cpus 1 to 256"):
        fleet.start(BuildRequest(kind="demo"), num_cpus=0)


def test_a_slurm_time_limit_of_the_least_allowed_is_taken(tmp_path: Path) -> None:
    """3 minutes (SLURM's warning 120 s before the limit, and a minute more) is allowed."""
    environment = stand_in_slurm(tmp_path / "bin", sacct_says="")
    assert SlurmFleet(tmp_path, time_limit_s=180.0, environment=environment).time_limit_s == 180
    with pytest.raises(FleetError, match="180 s or more"):
        SlurmFleet(tmp_path, time_limit_s=179.0, environment=environment)


def test_a_slurm_time_limit_is_asked_for_in_whole_minutes_rounded_up(tmp_path: Path) -> None:
    """SLURM's ``--time`` is in minutes: 200 s is 4 of them, never 3 (the job would be ended
    before the limit it was given), with SLURM's warning 120 s before it."""
    environment = stand_in_slurm(tmp_path / "bin", sacct_says="")
    fleet = SlurmFleet(tmp_path, time_limit_s=200.0, environment=environment)
    folder = tmp_path / "builds" / "0123456789ab"
    planned = Planned(id="0123456789ab", kind="demo", folder=folder, argv=["demo"], model=None,
                      engine=None, journal=tmp_path / "journals" / "0123456789ab.jsonl",
                      cancel_file=folder / "cancel", grace_s=30.0)  # fmt: skip
    options = fleet._sbatch_options(planned, gpus=0, cpus=1)
    assert [o for o in options if o.startswith(("--time=", "--signal="))] == [
        "--time=4",
        "--signal=B:USR1@120",
    ]
