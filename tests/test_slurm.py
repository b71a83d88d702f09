"""trt-otel's stops on a real SLURM: jobs submitted with ``sbatch`` to a one-node cluster of the
test's own (tests/slurm_cluster.py), stopped with ``scancel`` and with the warning before a
job's time limit, and what the journal and SLURM then say. The shipped templates,
deploy/slurm/build.sbatch and matrix.sbatch, are submitted as they are, on real TensorRT-RTX
builds; the rest runs the demo's simulated builder, whose silent window is as long as asked.

Skipped where SLURM is not installed or the tests are not root (a node's daemons run as root),
and the real builds where ``tensorrt_rtx`` does not import, each with the reason.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from otlp_receiver import OtlpReceiver, final_spans
from rtx_builds import import_rtx, write_conv, write_residual
from slurm_cluster import FINAL_STATES, Job, SlurmCluster, trt_otel_on_path
from trt_otel import Outcome, read_journal
from trt_otel.builder.onnx_models import CONV_SHAPES, RESIDUAL_SHAPES
from trt_otel.control.signals import TIME_LIMIT_REASON
from trt_otel.core.events import BuildFinished, CancelRequested, Event
from waiting import DEMO_SILENT_AT, callbacks_in, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("slurm")]

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = REPO_ROOT / "deploy" / "slurm"
SILENT_PHASE = b"Determining refit engines"
"""The residual net's real silent window: one step of this phase takes seconds."""
FOR_THE_TEST_NODE = ("--gres=none", "--cpus-per-task=1")
"""Over the templates' ``--gres=gpu:1`` and ``--cpus-per-task=4``: the test node has no GPU
(TensorRT-RTX builds without one) and may have fewer CPUs."""


@dataclass(frozen=True)
class Slurm:
    """The cluster, and what a job's environment needs for ``trt-otel`` to be this checkout's:
    a ``trt-otel`` command on PATH, as an installed one would be (the templates call it by
    name)."""

    cluster: SlurmCluster
    environment: Mapping[str, str]

    def submit_demo(
        self, folder: Path, *options: str, sbatch: tuple[str, ...] = (), launcher: str = "exec"
    ) -> Submitted:
        """A batch job whose script runs the demo's build with ``launcher`` in front of it:
        ``exec`` (trt-otel is the batch shell itself), ``exec srun`` (trt-otel is a job step's
        task) or nothing (a shell waits for it)."""
        journal, output = folder / "demo.jsonl", folder / "demo.out"
        script = folder / "demo.sbatch"
        demo = ["trt-otel", "demo", "--no-progress", "--no-gpu", "--speed", "0", "--journal",
                str(journal), *options]  # fmt: skip
        script.write_text(f"#!/bin/bash\n{launcher} {' '.join(demo)}\n".replace("\n ", "\n"))
        job_id = self.cluster.sbatch(script, f"--output={output}", f"--chdir={folder}", *sbatch,
                                     env=self.environment)  # fmt: skip
        return Submitted(self.cluster, job_id, journal, output)

    def submit_template(
        self, name: str, folder: Path, variables: Mapping[str, str], *sbatch: str
    ) -> int:
        """``sbatch deploy/slurm/NAME`` from ``folder``, with ``variables`` set where it is
        submitted, as its comments say."""
        return self.cluster.sbatch(
            TEMPLATES / name, f"--chdir={folder}", *FOR_THE_TEST_NODE, *sbatch,
            env={**self.environment, **variables},
        )  # fmt: skip


@pytest.fixture(scope="module")
def slurm(one_node_slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Slurm:
    return Slurm(one_node_slurm, trt_otel_on_path(tmp_path_factory.mktemp("bin")))


@dataclass(frozen=True)
class Submitted:
    cluster: SlurmCluster
    job_id: int
    journal: Path
    output: Path

    def wait_for(self, reached: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """Until ``reached()`` is true; fails at once, with the job's output, if the job ends
        first."""

        def condition() -> bool:
            if reached():
                return True
            state = self.cluster.job(self.job_id).state
            assert state not in FINAL_STATES, (
                f"the job ended ({state}) before {what}: {self.said()}\n"
                f"SLURM's logs of it:\n{self.cluster.logged_of(self.job_id)}"
            )
            return False

        wait_until(condition, what, timeout_s)

    def wait_for_silence(self) -> None:
        self.wait_for(
            lambda: callbacks_in(self.journal) >= DEMO_SILENT_AT, "the demo's silent window"
        )

    def wait_for_text(self, text: bytes) -> None:
        self.wait_for(
            lambda: self.journal.exists() and text in self.journal.read_bytes(),
            f"{text.decode()} in the journal",
        )

    def scancel(self, *options: str) -> None:
        self.cluster.client("scancel", *options, str(self.job_id))

    def ended(self, timeout_s: float = 60) -> Job:
        return self.cluster.wait_for_end(self.job_id, timeout_s)

    def said(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else "(no output)"

    def events(self) -> list[Event]:
        return list(read_journal(self.journal).events)


def cancel_of(events: list[Event]) -> CancelRequested:
    cancels = [event for event in events if isinstance(event, CancelRequested)]
    assert cancels, "the journal records no cancel"
    return cancels[0]


def end_of(events: list[Event]) -> BuildFinished:
    end = events[-1]
    assert isinstance(end, BuildFinished), f"the journal ends with {end}, not the build's end"
    return end


def assert_stopped_by_slurm(events: list[Event], reason: str, *, timeout: bool = False) -> None:
    """SIGTERM to every process of the job: a stop whose reason names what the controller says
    it is doing to the job (``timeout``: its time limit), never a failure."""
    cancel = cancel_of(events)
    assert (cancel.source, cancel.reason, cancel.timeout) == ("signal", reason, timeout)
    end = end_of(events)
    assert end.outcome is (Outcome.TIMEOUT if timeout else Outcome.CANCELLATION), end
    assert "the whole job was signalled" in end.detail, end
    assert end.error_type == ("timeout" if timeout else None), end


def assert_cancelled_by_slurm(events: list[Event], job_id: int) -> None:
    """``scancel``'s SIGTERM to every process of the job: a cancel whose reason names SLURM."""
    assert_stopped_by_slurm(events, f"SLURM cancelled job {job_id} (SIGTERM)")


def assert_stopped_by_the_time_limit_warning(events: list[Event]) -> BuildFinished:
    cancel = cancel_of(events)
    assert (cancel.source, cancel.reason, cancel.timeout) == ("signal", TIME_LIMIT_REASON, True)
    end = end_of(events)
    assert end.outcome is Outcome.TIMEOUT, end
    assert "died" not in end.detail, end
    return end


# -- scancel ---------------------------------------------------------------------------------


def test_scancel_in_a_silent_window_is_a_cancel_and_the_job_exits_3(
    slurm: Slurm, tmp_path: Path
) -> None:
    """``scancel`` sends SIGTERM to every process of the job, trt-otel and its builder's worker
    (which dies of it at once) alike; the batch script ``exec``s trt-otel, so the job's exit
    status is trt-otel's own."""
    job = slurm.submit_demo(tmp_path, "--silence", "10m", "--grace", "10m")
    job.wait_for_silence()
    job.scancel()
    record = job.ended()
    assert (record.state, record.exit_code) == ("CANCELLED", (3, 0)), job.said()
    assert_cancelled_by_slurm(job.events(), job.job_id)
    assert "CANCELLED AT" in job.said()  # SLURM's own line in the job's output


def test_scancel_of_a_job_step_is_a_cancel_too(slurm: Slurm, tmp_path: Path) -> None:
    """trt-otel run by ``srun``, a job step's task: the step's processes get the SIGTERM; srun
    exits with its task's status."""
    job = slurm.submit_demo(tmp_path, "--silence", "10m", "--grace", "10m", launcher="exec srun")
    job.wait_for_silence()
    job.scancel()
    record = job.ended()
    assert (record.state, record.exit_code) == ("CANCELLED", (3, 0)), job.said()
    assert_cancelled_by_slurm(job.events(), job.job_id)


# -- the warning before the time limit ---------------------------------------------------------


@pytest.mark.parametrize(
    ("scancel", "launcher"),
    [
        pytest.param(("--batch",), "exec", id="batch-shell"),  # what --signal=B:USR1@N sends
        pytest.param(("--full",), "exec", id="batch-shell-and-children"),  # the worker too
        pytest.param((), "exec srun", id="job-step"),  # what --signal=USR1@N sends
    ],
)
def test_usr1_stops_the_build_gracefully_as_a_timeout_and_the_job_exits_3(
    slurm: Slurm, tmp_path: Path, scancel: tuple[str, ...], launcher: str
) -> None:
    """``scancel --signal=USR1`` sends at once what ``--signal=[B:]USR1@N`` sends ``N`` seconds
    before the time limit. Sent in the silent window, the build stops at TensorRT's next step
    (the worker, signalled too with --full or in a step, ignores it): a timeout, exit 3, which
    SLURM records as the job's failure."""
    job = slurm.submit_demo(tmp_path, "--silence", "3s", launcher=launcher)
    job.wait_for_text(b"Computing profile costs")  # where the silent window begins
    job.scancel("--signal=USR1", *scancel)
    record = job.ended()
    assert (record.state, record.exit_code) == ("FAILED", (3, 0)), job.said()
    assert_stopped_by_the_time_limit_warning(job.events())


def test_usr1_to_the_job_steps_never_reaches_a_build_that_is_the_batch_shell(
    slurm: Slurm, tmp_path: Path
) -> None:
    """Why the templates ask for ``B:USR1``: without ``B:`` SLURM signals only ``srun``'s job
    steps, and a build that is the batch shell is none; it goes on, and succeeds."""
    job = slurm.submit_demo(tmp_path, "--silence", "3s")
    job.wait_for_text(b"Computing profile costs")
    job.scancel("--signal=USR1")
    record = job.ended()
    assert (record.state, record.exit_code) == ("COMPLETED", (0, 0)), job.said()
    events = job.events()
    assert not any(isinstance(event, CancelRequested) for event in events)
    assert end_of(events).outcome is Outcome.SUCCESS


def test_usr1_to_a_shell_in_front_of_the_build_kills_the_job_unrecorded(
    slurm: Slurm, tmp_path: Path
) -> None:
    """Why the templates ``exec`` trt-otel: a shell that waits for it is the one the warning
    reaches, and dies of it; SLURM records the job as failed, and the build has no end in its
    journal. (Its process outlives the shell: this cluster tracks a job's processes by their
    parentage, and an orphan has none. The test stops it.)"""
    job = slurm.submit_demo(tmp_path, "--silence", "10m", "--grace", "5s", launcher="")
    try:
        job.wait_for_silence()
        job.scancel("--signal=USR1", "--batch")
        record = job.ended()
        assert (record.state, record.exit_code) == ("FAILED", (0, signal.SIGUSR1)), job.said()
        assert not isinstance(job.events()[-1], BuildFinished)
    finally:
        stop_processes_naming(tmp_path)


def stop_processes_naming(folder: Path) -> None:
    """Kill, by pid, the processes whose command line names ``folder`` (what a test's job
    started there), with their children, and wait until they are gone."""
    found = [
        process
        for process in psutil.process_iter(["cmdline"])
        if any(str(folder) in part for part in process.info["cmdline"] or ())
    ]
    family = {p for process in found for p in (process, *_children_of(process))}
    for process in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    _gone, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, f"still running: {alive}"


def _children_of(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@dataclass(frozen=True)
class TimeLimitJobs:
    """Two jobs that run into their time limit, one warned before it and one not, submitted
    together (SLURM's timer counts the time limits of both at once: a minute each, not two)."""

    warned: Submitted
    unwarned: Submitted


@pytest.fixture(scope="module")
def time_limits(slurm: Slurm, tmp_path_factory: pytest.TempPathFactory) -> TimeLimitJobs:
    """``--time=2 --signal=B:USR1@50``: SLURM sends the warning some 50 s before the limit (its
    timer runs every 30 s, so up to a minute earlier: with ``--time=1`` it comes at once), while
    the build is in a silent window longer than the job, so trt-otel waits ``--grace`` for
    TensorRT's next step, then stops the builder's process and ends the journal, long before the
    limit. And ``--time=1`` with no ``--signal``: the limit itself."""
    warned = slurm.submit_demo(
        tmp_path_factory.mktemp("warned"), "--silence", "10m", "--grace", "5s",
        "--stop-budget", "40s",  # under the 50 s
        sbatch=("--time=2", "--signal=B:USR1@50"),
    )  # fmt: skip
    unwarned = slurm.submit_demo(
        tmp_path_factory.mktemp("unwarned"), "--silence", "10m", "--grace", "10m",
        sbatch=("--time=1",),
    )  # fmt: skip
    return TimeLimitJobs(warned, unwarned)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_time_limit_warning_stops_a_build_in_a_silent_window_before_slurm_kills_it(
    time_limits: TimeLimitJobs,
) -> None:
    """The real thing: the warning reaches a build inside its silent window (see
    :func:`time_limits`), which ends as a timeout, the job's exit 3, before the limit."""
    job = time_limits.warned
    job.wait_for_silence()
    record = job.ended(timeout_s=200)
    assert (record.state, record.exit_code) == ("FAILED", (3, 0)), job.said()
    end = assert_stopped_by_the_time_limit_warning(job.events())
    assert "TensorRT had not stopped 5.0s later" in end.detail, end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_time_limit_without_a_warning_is_recorded_as_a_timeout(
    time_limits: TimeLimitJobs,
) -> None:
    """With no ``--signal``, the time limit itself: SIGTERM to every process of the job, which
    the controller then says is its time limit: a timeout with SLURM's reason, exit 3, and SLURM
    records the job as TIMEOUT."""
    job = time_limits.unwarned
    job.wait_for_silence()
    record = job.ended(timeout_s=200)
    assert (record.state, record.exit_code) == ("TIMEOUT", (3, 0)), job.said()
    reason = f"SLURM's time limit ended job {job.job_id} (SIGTERM)"
    assert_stopped_by_slurm(job.events(), reason, timeout=True)
    assert "DUE TO TIME LIMIT" in job.said()


# -- preemption -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_preempted_job_is_recorded_as_preempted_and_builds_again(
    slurm: Slurm, tmp_path: Path
) -> None:
    """A job of the cluster's low partition, in its silent window, preempted by one of the
    urgent partition (``PreemptMode=REQUEUE``): SIGTERM to every process of the job, as
    ``scancel`` sends, but the journal records a preemption (source ``preemption``, exit 3), not
    a person's cancel and not a failure; the job goes back to the queue and runs again, its
    second run writing a journal of its own."""
    journal = "demo.restart${SLURM_RESTART_COUNT:-0}.jsonl"  # expanded by the job's shell
    job = slurm.submit_demo(
        tmp_path, "--silence", "10m", "--grace", "10m", "--journal", str(tmp_path / journal),
        sbatch=("--requeue", "--exclusive"),
    )  # fmt: skip
    first = replace(job, journal=tmp_path / "demo.restart0.jsonl")
    first.wait_for_silence()
    urgent = tmp_path / "urgent.sbatch"
    urgent.write_text("#!/bin/bash\ntrue\n")
    slurm.cluster.sbatch(urgent, "--partition=urgent", "--exclusive", f"--chdir={tmp_path}")
    wait_until(
        lambda: isinstance(list(read_journal(first.journal).events)[-1], BuildFinished),
        "the preempted run's end in its journal",
        60,
    )
    events = first.events()
    cancel = cancel_of(events)
    assert cancel.source == "preemption", cancel
    assert cancel.reason == (
        f"preempted: SLURM requeued job {job.job_id} (SIGTERM; it runs again as restart 1)"
    )
    end = end_of(events)
    assert end.outcome is Outcome.CANCELLATION, end
    assert end.error_type is None, end
    assert "the whole job was signalled" in end.detail, end
    # SLURM holds a requeued job back for a while (Reason=BeginTime, some 2 minutes here): let
    # it start now, once the node is idle: the first run's processes gone and the urgent job
    # done. (Released while the first run still ended, the job once ended FAILED, its second
    # run never started.)
    slurm.cluster.wait_for_state(job.job_id, frozenset({"PENDING"}))
    wait_until(lambda: slurm.cluster.node_state() == "idle", "the node idle", 60)
    slurm.cluster.client("scontrol", "update", f"JobId={job.job_id}", "StartTime=now")
    second = replace(job, journal=tmp_path / "demo.restart1.jsonl")
    second.wait_for_silence()  # requeued, and building again
    assert slurm.cluster.job(job.job_id).fields["Restarts"] == "1"
    second.scancel()
    record = second.ended()
    assert (record.state, record.exit_code) == ("CANCELLED", (3, 0)), second.said()
    assert_cancelled_by_slurm(second.events(), second.job_id)


# -- the shipped templates, on real TensorRT-RTX builds ----------------------------------------


@pytest.fixture(scope="module")
def residual(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import_rtx()
    return write_residual(tmp_path_factory.mktemp("models") / "residual.onnx")


@pytest.mark.slow
@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(((), "CANCELLED", Outcome.CANCELLATION), id="scancel"),
        pytest.param((("--signal=USR1", "--batch"), "FAILED", Outcome.TIMEOUT), id="usr1-warning"),
    ],
)
def test_build_sbatch_stops_a_real_build_in_its_silent_window(
    slurm: Slurm,
    receiver: OtlpReceiver,
    residual: Path,
    tmp_path: Path,
    stop: tuple[tuple[str, ...], str, Outcome],
) -> None:
    """deploy/slurm/build.sbatch, a real TensorRT-RTX build of a deep residual net, stopped
    inside TensorRT's own silent step: by ``scancel``, or by the warning its ``B:USR1`` asks
    for. The job exits with trt-otel's 3, no engine is left, and the build's span, sent where
    the submitter's OTEL_EXPORTER_OTLP_ENDPOINT says, carries the job's id and the cancel."""
    scancel, state, outcome = stop
    engine = tmp_path / "engines" / "residual.engine"
    variables = {
        "MODEL": str(residual), "ENGINE": str(engine), "JOURNAL_DIR": str(tmp_path / "journals"),
        "GRACE": "10m", "TRT_OTEL_OPTIONS": f"--shapes {RESIDUAL_SHAPES} --no-gpu",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.http_port}",
    }  # fmt: skip
    output = tmp_path / "build.out"
    job_id = slurm.submit_template("build.sbatch", tmp_path, variables, f"--output={output}")
    job = Submitted(slurm.cluster, job_id, tmp_path / "journals" / f"{job_id}.jsonl", output)
    job.wait_for_text(SILENT_PHASE)
    job.scancel(*scancel)
    record = job.ended(timeout_s=120)
    assert (record.state, record.exit_code) == (state, (3, 0)), job.said()
    events = job.events()
    if outcome is Outcome.CANCELLATION:
        assert_cancelled_by_slurm(events, job_id)
    else:
        assert_stopped_by_the_time_limit_warning(events)
    assert not engine.exists()
    started = sum(1 for event in events if event.type == "phase_start")
    wait_until(lambda: len(final_spans(receiver.spans)) >= started + 1, "every final span", 30)
    spans = final_spans(receiver.spans)  # the live snapshots (on by default) left out
    assert len(spans) == started + 1, f"one span per phase and one for the build: {spans}"
    build = next(span for span in spans if not span.parent_span_id)
    assert build.resource["slurm.job.id"] == str(job_id)
    assert build.resource["slurm.cluster.name"] == "trtotel"
    assert build.attributes["trt.cancel.reason"] == cancel_of(events).reason


@pytest.mark.slow
def test_matrix_sbatch_builds_one_line_per_array_task(slurm: Slurm, tmp_path: Path) -> None:
    """deploy/slurm/matrix.sbatch over a builds file of two real TensorRT-RTX builds: each
    array task builds its line, with a journal named after the task; an index past the file's
    last line exits 2, building nothing."""
    import_rtx()
    models = tmp_path / "models"
    models.mkdir()
    builds = tmp_path / "builds.txt"
    builds.write_text(
        "# MODEL ENGINE OPTIONS...\n\n"
        + "".join(
            f"{write_conv(models / f'conv{layers}.onnx', layers)} engines/conv{layers}.engine "
            f"--shapes {CONV_SHAPES} --no-gpu\n"
            for layers in (4, 8)
        )
    )
    journals = tmp_path / "journals"
    array_id = slurm.submit_template(
        "matrix.sbatch", tmp_path, {"BUILDS": str(builds), "JOURNAL_DIR": str(journals)},
        "--array=0-2", f"--output={tmp_path}/matrix-%A_%a.out",
    )  # fmt: skip
    records = [slurm.cluster.wait_for_end(f"{array_id}_{task}", timeout_s=180) for task in range(3)]
    said = [
        (tmp_path / f"matrix-{array_id}_{task}.out").read_text(errors="replace")
        for task in range(3)
    ]
    for task, layers in enumerate((4, 8)):
        record = records[task]
        assert (record.state, record.exit_code) == ("COMPLETED", (0, 0)), said[task]
        end = end_of(list(read_journal(journals / f"{array_id}_{task}.jsonl").events))
        assert end.outcome is Outcome.SUCCESS, end
        assert (tmp_path / "engines" / f"conv{layers}.engine").stat().st_size > 0
    record = records[2]
    assert (record.state, record.exit_code) == ("FAILED", (2, 0)), said[2]
    assert "has no line 2" in said[2]
    assert not (journals / f"{array_id}_2.jsonl").exists()
