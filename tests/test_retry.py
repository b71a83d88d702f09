"""Retry ladders on the simulator: an attempt that ran out of time is built again with the next
rung's options, every attempt in one journal and each span linked to the previous attempt's;
what another attempt cannot mend (a user's cancel, a failed build) is not retried; bad rungs are
refused before anything starts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cli import CLI, run_demo
from otlp_receiver import otlp_receiver
from trt_otel import read_journal
from trt_otel.app.commands import build_parser
from trt_otel.app.config import SessionConfig, UsageError
from trt_otel.app.ladder import retry_reason
from trt_otel.app.retries import MAX_RUNGS, retry_rungs
from trt_otel.app.session import Ended
from trt_otel.builder.simulator import TimeModel, generate_plan
from trt_otel.core.attempts import attempt_of
from trt_otel.core.durations import parse_duration
from trt_otel.core.events import BuildFinished, BuildStarted, Outcome
from trt_otel.views.trace_ids import build_span_context
from waiting import wait_for_text

# Level 5 times 2.5 times the tactics of level 3, level 0 a twentieth: at --speed 4 the first
# takes ~10 s of simulated work, the second ~4 s.
SLOW_THEN_FAST = ("--speed", "4", "--builder-optimization-level", "5", "--timeout", "5s",
                  "--retry", "--builder-optimization-level 0 --timeout 2m")  # fmt: skip


def starts(journal: Path) -> list[BuildStarted]:
    return [e for e in read_journal(journal).events if isinstance(e, BuildStarted)]


@pytest.mark.e2e
def test_a_ladders_second_rung_builds_after_the_first_timed_out_linked_in_one_trace(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "ladder.jsonl"
    with otlp_receiver() as receiver:
        done = run_demo("--no-gpu", *SLOW_THEN_FAST, "--journal", str(journal),
                        "-o", str(tmp_path / "e.engine"),
                        "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}",
                        "--otlp-protocol", "grpc", timeout=240)  # fmt: skip
        assert done.returncode == 0, done.stderr
        builds = [s for s in receiver.wait_for(2, timeout_s=30) if s.name.startswith("BUILD ")]
    assert "built by attempt 2 of 2 (--builder-optimization-level 0 --timeout 2m)" in done.stderr
    first, second = starts(journal)
    ends = [e for e in read_journal(journal).events if isinstance(e, BuildFinished)]
    assert [e.outcome for e in ends] == [Outcome.TIMEOUT, Outcome.SUCCESS]
    assert first.attributes["trt.options.optimization_level"] == 5
    assert second.attributes["trt.options.optimization_level"] == 0
    attempt = attempt_of(second.attributes)
    assert attempt is not None and (attempt.number, attempt.of) == (2, 2)
    assert attempt.previous_build_id == first.build_id
    assert attempt.retry_reason is not None and attempt.retry_reason.startswith("timeout (timeout)")
    assert first.build_id != second.build_id

    by_id = {s.attributes["trt.build.id"]: s for s in builds}
    assert set(by_id) == {first.build_id, second.build_id}
    earlier, later = by_id[first.build_id], by_id[second.build_id]
    trace_id, span_id = build_span_context(first.build_id)
    assert (earlier.trace_id, earlier.span_id) == (f"{trace_id:032x}", f"{span_id:016x}")
    assert later.links == ((earlier.trace_id, earlier.span_id),)
    assert later.attributes["trt.attempt"] == 2 and earlier.attributes["trt.attempt"] == 1
    assert earlier.links == ()

    replayed = subprocess.run(
        [*CLI, "replay", str(journal)], check=False, capture_output=True, text=True, timeout=60
    )
    assert replayed.returncode == 0, replayed.stderr  # the ladder's: the last attempt's
    assert "attempt 2 of 2, after timeout (timeout)" in replayed.stdout


@pytest.mark.e2e
def test_a_users_cancel_is_not_retried(tmp_path: Path) -> None:
    journal, stop = tmp_path / "j.jsonl", tmp_path / "stop"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "1", "--journal", str(journal),
         "--cancel-file", str(stop), "--retry", "--builder-optimization-level 0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_text(journal, b'"phase_start"')
    stop.write_text("not today\n")
    _, err = process.communicate(timeout=120)
    assert process.returncode == 3, err
    assert len(starts(journal)) == 1 and "retrying" not in err


@pytest.mark.e2e
def test_the_deadline_covers_the_whole_ladder(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    done = run_demo("--no-gpu", "--speed", "4", "--builder-optimization-level", "5",
                    "--deadline", "4s", "--retry", "--builder-optimization-level 0",
                    "--journal", str(journal), timeout=240)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "attempt 2 not started: the 4.0s deadline has passed" in done.stderr
    assert len(starts(journal)) == 1


@pytest.mark.e2e
def test_each_attempt_is_given_only_what_is_left_of_the_deadline(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    done = run_demo("--no-gpu", "--speed", "4", "--builder-optimization-level", "5",
                    "--deadline", "1h", "--timeout", "1s", "--retry", "--timeout 1s",
                    "--journal", str(journal), timeout=120)  # fmt: skip
    assert len(starts(journal)) == 2, done.stderr
    said = re.findall(r"deadline\((\S+), margin", done.stderr)
    first, second = (parse_duration(limit) for limit in said)
    # The first attempt ran for its 1 s timeout at least: the second has that less.
    assert first <= 3600 and second <= first - 1, done.stderr


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("rung", "said"),
    [
        ("--journal x.jsonl", "unrecognized arguments: --journal"),
        ("--builder-optimization-level fast", "--builder-optimization-level"),
        ('"unclosed', "No closing quotation"),
        ("", "--retry needs options"),
        ("--timeout -5s", "--timeout"),
    ],
)
def test_a_bad_rung_is_refused_before_anything_starts(tmp_path: Path, rung: str, said: str) -> None:
    journal = tmp_path / "j.jsonl"
    done = run_demo(
        "--no-gpu", "--speed", "0", "--journal", str(journal), "--retry", rung, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "--retry" in done.stderr
    assert "Traceback" not in done.stderr and not journal.exists()


def ended(outcome: Outcome | None, source: str | None = None, error: str | None = None) -> Ended:
    return Ended(3, "b", outcome, source, error, "why")


def test_what_is_retried_and_what_is_not() -> None:
    for source in ("timeout", "deadline", "stall", "memory"):
        kind = Outcome.TIMEOUT if source in ("timeout", "deadline") else Outcome.CANCELLATION
        assert retry_reason(ended(kind, source)) == f"{kind.value} ({source}): why"
    assert retry_reason(ended(Outcome.FAILURE, None, "WorkerDied")) is not None
    assert retry_reason(ended(Outcome.FAILURE, None, "SIGKILL")) is not None
    for source in ("file", "http", "signal", "user"):
        assert retry_reason(ended(Outcome.CANCELLATION, source)) is None
    assert retry_reason(ended(Outcome.FAILURE, None, "BuildFailed")) is None  # the parser's
    assert retry_reason(ended(None)) is None  # Ctrl-C
    assert retry_reason(ended(Outcome.SUCCESS)) is None


def test_the_simulators_build_time_answers_to_the_optimization_level() -> None:
    totals = [TimeModel().total_s(generate_plan(13, optimization_level=n)) for n in range(6)]
    assert totals == sorted(totals) and totals[0] < totals[3] / 1.5 < totals[5] / 2
    assert generate_plan(13) == generate_plan(13, optimization_level=3)


def test_attempt_attributes_from_a_file_are_read_only_when_they_hold_together() -> None:
    assert attempt_of({"trt.attempt": 2, "trt.attempts": 3}) is not None
    for number, of in ((True, 3), ("2", 3), (2.0, 3), (4, 3), (0, 3), (2, None)):
        assert attempt_of({"trt.attempt": number, "trt.attempts": of}) is None, (number, of)
    first = attempt_of({"trt.attempt": 1, "trt.attempts": 2, "trt.retry.previous_build_id": "x"})
    assert first is not None and first.previous_build_id is None  # a first attempt has none


@pytest.mark.e2e
def test_watch_follows_a_ladder_to_its_last_attempt(tmp_path: Path) -> None:
    journal = tmp_path / "ladder.jsonl"
    build = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", *SLOW_THEN_FAST, "--journal", str(journal)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_text(journal, b'"build_start"')
    watched = subprocess.run(
        [*CLI, "watch", str(journal), "--no-progress"],
        check=False, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert build.wait(timeout=60) == 0
    assert watched.returncode == 0, watched.stderr  # the second attempt's end, not the first's
    assert "attempt 1 of 2" in watched.stderr and "attempt 2 of 2" in watched.stderr
    assert "build timeout" in watched.stderr and "build success" in watched.stderr


@pytest.mark.e2e
def test_watch_ends_with_a_ladder_that_stops_retrying(tmp_path: Path) -> None:
    journal, stop = tmp_path / "ladder.jsonl", tmp_path / "stop"
    build = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "1", "--journal", str(journal),
         "--cancel-file", str(stop), "--retry", "--builder-optimization-level 0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_text(journal, b'"build_start"')
    watcher = subprocess.Popen(
        [*CLI, "watch", str(journal), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_text(journal, b'"phase_start"')
    stop.write_text("enough\n")
    _, err = watcher.communicate(timeout=120)
    assert build.wait(timeout=60) == 3
    assert watcher.returncode == 3, err  # a user's cancel is not retried: that is the end
    assert "lost" not in err


def test_a_rungs_limits_are_laid_over_the_commands_each_in_its_place() -> None:
    args = build_parser().parse_args(
        ["demo", "--timeout", "1h", "--stall-timeout", "2m",
         "--retry", "--timeout 5m --stall-timeout 30s",
         "--retry", "--builder-optimization-level 1"]
    )  # fmt: skip
    first, second = retry_rungs(args)
    assert (first.timeout_s, first.stall_timeout_s) == (300, 30)
    assert (second.timeout_s, second.stall_timeout_s) == (3600, 120), "the command's own"
    assert second.builder.optimization_level == 1 and first.builder.optimization_level is None
    policy = first.session(SessionConfig()).policy
    assert (policy.timeout_s, policy.stall_timeout_s) == (300, 30)


def test_a_ladder_has_at_most_its_bound_of_rungs() -> None:
    def ladder(rungs: int) -> list[str]:
        return ["demo", *["--retry", "--builder-optimization-level 1"] * rungs]

    assert len(retry_rungs(build_parser().parse_args(ladder(MAX_RUNGS)))) == MAX_RUNGS
    with pytest.raises(UsageError, match=f"at most {MAX_RUNGS} rungs, not {MAX_RUNGS + 1}"):
        retry_rungs(build_parser().parse_args(ladder(MAX_RUNGS + 1)))
