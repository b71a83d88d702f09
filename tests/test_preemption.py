"""What a stop signal means: a SLURM job being requeued (preempted) is told from one its time
limit ended and one ``scancel`` cancelled by what the controller says of the job when the signal
arrives (control/preemption.py). Here on the controller's own words, as ``scontrol show job
--oneliner`` printed them on a real SLURM 22.05; the real preemption, requeue, time limit and
``scancel`` are in tests/test_slurm.py."""

from __future__ import annotations

import threading

from trt_otel.control.preemption import MAX_ANSWER_CHARS, SignalCauses, StopCause, slurm_cause
from trt_otel.control.signals import TIME_LIMIT_REASON
from trt_otel.core.events import CancelSource

JOB = {"SLURM_JOB_ID": "17"}


def answer(restarts: int, reason: str = "None") -> str:
    """What SLURM 22.05 said of a job at its SIGTERM (fields cut short): ``restarts`` above the
    run's own count, a requeue; ``reason`` ``TimeLimit``, its time limit; neither, ``scancel``."""
    return (
        f"JobId=17 JobName=build.sbatch UserId=root(0) JobState=COMPLETING Reason={reason} "
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


def requeued(environ: dict[str, str], controller: Controller) -> bool:
    cause = slurm_cause(environ, controller)
    return cause is not None and cause.source is CancelSource.PREEMPTION


def test_a_job_whose_restarts_count_the_run_to_come_is_being_requeued() -> None:
    controller = Controller(answer(restarts=1))
    assert slurm_cause(JOB, controller) == StopCause(
        "preempted: SLURM requeued job 17 (SIGTERM; it runs again as restart 1)",
        CancelSource.PREEMPTION,
    )
    assert controller.asked == ["17"]


def test_a_job_cancelled_or_out_of_time_keeps_its_restarts() -> None:
    assert not requeued(JOB, Controller(answer(restarts=0)))
    # A run that is itself a restart: the count it started with is not a requeue.
    again = {**JOB, "SLURM_RESTART_COUNT": "2"}
    assert not requeued(again, Controller(answer(restarts=2)))
    assert requeued(again, Controller(answer(restarts=3)))


def test_a_job_its_time_limit_ends_is_a_timeout_and_one_scancel_ends_names_slurm() -> None:
    assert slurm_cause(JOB, Controller(answer(restarts=0, reason="TimeLimit"))) == StopCause(
        "SLURM's time limit ended job 17 (SIGTERM)", CancelSource.SIGNAL, timeout=True
    )
    assert slurm_cause(JOB, Controller(answer(restarts=0))) == StopCause(
        "SLURM cancelled job 17 (SIGTERM)", CancelSource.SIGNAL
    )
    # A requeue is a requeue whatever else it says.
    assert requeued(JOB, Controller(answer(restarts=1, reason="TimeLimit")))
    running = "JobId=17 JobState=RUNNING Reason=None Restarts=0\n"
    assert slurm_cause(JOB, Controller(running)) is None, "a job SLURM is not ending"


def test_no_answer_or_no_slurm_job_is_no_cause() -> None:
    assert slurm_cause(JOB, Controller(None)) is None
    assert slurm_cause(JOB, Controller("Restarts=1" + " " * MAX_ANSWER_CHARS)) is None
    assert slurm_cause(JOB, Controller("JobId=17 OldRestarts=5 OldReason=TimeLimit\n")) is None
    for environ in ({}, {"SLURM_JOB_ID": "17; rm -rf /"}, {"SLURM_JOB_ID": ""}):
        controller = Controller(answer(restarts=1))
        assert slurm_cause(environ, controller) is None
        assert controller.asked == [], "a job id that is not a number is never passed on"


def test_a_restart_count_that_is_not_a_number_counts_as_the_first_run() -> None:
    junk = {**JOB, "SLURM_RESTART_COUNT": "x"}
    assert requeued(junk, Controller(answer(restarts=1)))


def test_each_signal_is_asked_about_once_and_only_sigterm() -> None:
    controller = Controller(answer(restarts=1))
    causes = SignalCauses(JOB, controller)
    results: list[StopCause] = []
    threads = [
        threading.Thread(target=lambda: results.append(causes.of("SIGTERM"))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2 and results[0] == results[1]
    cause = results[0]
    assert cause.source is CancelSource.PREEMPTION
    assert cause.reason.startswith("preempted: SLURM requeued")
    assert controller.asked == ["17"], "asked once, the second caller given the same answer"
    assert causes.of("SIGHUP") == StopCause("received SIGHUP", CancelSource.SIGNAL)
    assert controller.asked == ["17"]


def test_a_sigterm_outside_a_slurm_job_is_received_as_before() -> None:
    running = "JobId=17 JobState=RUNNING Reason=None Restarts=0\n"
    assert SignalCauses(JOB, Controller(running)).of("SIGTERM") == StopCause(
        "received SIGTERM", CancelSource.SIGNAL
    )
    assert SignalCauses({}, Controller(None)).of("SIGTERM") == StopCause(
        "received SIGTERM", CancelSource.SIGNAL
    )


def test_the_time_limit_warning_is_a_timeout_without_asking_the_controller() -> None:
    controller = Controller(answer(restarts=1))
    cause = SignalCauses(JOB, controller).of("SIGUSR1")
    assert cause == StopCause(TIME_LIMIT_REASON, CancelSource.SIGNAL, timeout=True)
    assert controller.asked == [], "the warning says what it is"
