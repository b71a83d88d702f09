"""What a stop signal means: a SLURM job being requeued (preempted) is told from one cancelled
by what the controller says of the job when the signal arrives (control/preemption.py). Here
on the controller's own words, as ``scontrol show job --oneliner`` prints them; the real
preemption and requeue are in tests/test_slurm.py."""

from __future__ import annotations

import threading

from trt_otel.control.preemption import MAX_ANSWER_CHARS, SignalCauses, slurm_requeue
from trt_otel.core.events import CancelSource

JOB = {"SLURM_JOB_ID": "17"}


def answer(restarts: int) -> str:
    """What SLURM 22.05 said of a job being requeued, at its SIGTERM (fields cut short)."""
    return (
        f"JobId=17 JobName=build.sbatch UserId=root(0) JobState=COMPLETING Reason=None "
        f"Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode=0:0\n"
    )


class Controller:
    """A controller that says ``said``, and counts what it was asked."""

    def __init__(self, said: str | None) -> None:
        self.said = said
        self.asked: list[str] = []

    def __call__(self, job: str) -> str | None:
        self.asked.append(job)
        return self.said


def test_a_job_whose_restarts_count_the_run_to_come_is_being_requeued() -> None:
    controller = Controller(answer(restarts=1))
    reason = slurm_requeue(JOB, controller)
    assert reason == "preempted: SLURM requeued job 17 (SIGTERM; it runs again as restart 1)"
    assert controller.asked == ["17"]


def test_a_job_cancelled_or_out_of_time_keeps_its_restarts() -> None:
    assert slurm_requeue(JOB, Controller(answer(restarts=0))) is None
    # A run that is itself a restart: the count it started with is not a requeue.
    again = {**JOB, "SLURM_RESTART_COUNT": "2"}
    assert slurm_requeue(again, Controller(answer(restarts=2))) is None
    assert slurm_requeue(again, Controller(answer(restarts=3))) is not None


def test_no_answer_or_no_slurm_job_is_no_preemption() -> None:
    assert slurm_requeue(JOB, Controller(None)) is None
    assert slurm_requeue(JOB, Controller("JobId=17 JobState=COMPLETING\n")) is None
    assert slurm_requeue(JOB, Controller("Restarts=1" + " " * MAX_ANSWER_CHARS)) is None
    assert slurm_requeue(JOB, Controller("JobId=17 OldRestarts=5\n")) is None
    for environ in ({}, {"SLURM_JOB_ID": "17; rm -rf /"}, {"SLURM_JOB_ID": ""}):
        controller = Controller(answer(restarts=1))
        assert slurm_requeue(environ, controller) is None
        assert controller.asked == [], "a job id that is not a number is never passed on"


def test_a_restart_count_that_is_not_a_number_counts_as_the_first_run() -> None:
    junk = {**JOB, "SLURM_RESTART_COUNT": "x"}
    assert slurm_requeue(junk, Controller(answer(restarts=1))) is not None


def test_each_signal_is_asked_about_once_and_only_sigterm() -> None:
    controller = Controller(answer(restarts=1))
    causes = SignalCauses(JOB, controller)
    results: list[tuple[str, CancelSource]] = []
    threads = [
        threading.Thread(target=lambda: results.append(causes.of("SIGTERM"))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1]
    reason, source = results[0]
    assert source is CancelSource.PREEMPTION and reason.startswith("preempted: SLURM requeued")
    assert controller.asked == ["17"], "asked once, the second caller given the same answer"
    assert causes.of("SIGHUP") == ("received SIGHUP", CancelSource.SIGNAL)
    assert controller.asked == ["17"]


def test_a_sigterm_outside_a_requeue_is_received_as_before() -> None:
    causes = SignalCauses(JOB, Controller(answer(restarts=0)))
    assert causes.of("SIGTERM") == ("received SIGTERM", CancelSource.SIGNAL)
    assert SignalCauses({}, Controller(None)).of("SIGTERM") == (
        "received SIGTERM",
        CancelSource.SIGNAL,
    )
