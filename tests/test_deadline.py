"""A deadline stops a build as soon as its projection says it cannot end in time, and no sooner:
the margin rule, the refusal before a build starts, the fall back to a timeout, and the command.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from cli import CLI
from journals import write_journal
from trt_otel import BuildMonitor, ManualClock, read_journal
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.simulator import generate_plan
from trt_otel.control.deadline import DEFAULT_MARGIN, Deadline, would_fit
from trt_otel.control.policies import AnyOf, BuildView, Decision, Timeout
from trt_otel.core.eta import START, History, PastBuild, same_build
from trt_otel.core.events import BuildFinished, BuildStarted, CancelRequested, Event, PhaseStarted
from trt_otel.core.projection import before_start
from trt_otel.core.readmodel import ReadModel
from trt_otel.testing import virtual_build

MODEL = {"model.path": "m.onnx", "model.sha256": "a" * 64}
PLAN = generate_plan(13, num_profiles=1, seed=0)
S = 1_000_000_000


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    folder = tmp_path_factory.mktemp("history")
    for index, pace in enumerate((0.9, 1.0, 1.1, 1.0, 0.95)):
        events = virtual_build(PLAN, pace=pace, seed=index, attributes=MODEL)
        write_journal(folder / f"b{index}.jsonl", events)
    loaded = History.load(folder, attributes=MODEL)
    assert len(loaded.builds) == 5
    return loaded


def duration_s(events: list[Event]) -> float:
    return (events[-1].mono_ns - events[0].mono_ns) / S


def first_decision(deadline: Deadline, model: ReadModel, events: list[Event]) -> Decision | None:
    """Fold ``events`` into ``model``, asking ``deadline`` after each as its runner would."""
    start = events[0].mono_ns
    for event in events:
        model.apply(event)
        if isinstance(event, BuildFinished):
            return None
        decision = deadline.check(BuildView(event.mono_ns, start, None, None))
        if decision is not None:
            return decision
    return None


def test_a_build_slower_than_its_history_is_stopped_long_before_the_deadline(
    history: History,
) -> None:
    totals = history.totals()
    assert totals is not None
    limit_s = totals[2] * 1.5  # its history fits with room to spare...
    slow = virtual_build(PLAN, pace=3.0, seed=11, attributes=MODEL)  # ...this build does not
    assert duration_s(slow) > limit_s * 1.5
    model = ReadModel(history)
    deadline = Deadline(limit_s, project=model.project, at_start=before_start(history))
    assert deadline.before_start() is None
    decision = first_decision(deadline, model, slow)
    assert decision is not None and decision.source == "deadline" and decision.timeout
    stopped_s = float(decision.reason.rsplit("stopped at ", 1)[1].removesuffix("s"))
    assert stopped_s < limit_s / 2, decision.reason
    assert "5 earlier builds: " in decision.reason
    assert "x their time so far" in decision.reason
    assert f"after the {limit_s:.1f}s deadline; stopped at" in decision.reason


def test_builds_as_fast_as_their_history_are_not_cancelled(history: History) -> None:
    """No false cancel: builds in the spread of their history, under a deadline they meet."""
    for seed in range(20, 30):
        build = virtual_build(PLAN, pace=1.0, seed=seed, attributes=MODEL)
        model = ReadModel(history)
        deadline = Deadline(duration_s(build) * 1.02, project=model.project)
        assert first_decision(deadline, model, build) is None, seed


def test_the_margin_is_what_stands_between_a_near_miss_and_a_cancel(history: History) -> None:
    totals = history.totals()
    assert totals is not None
    fastest = totals[0]
    at_start = before_start(history)
    near = fastest / 1.05  # the fastest earlier build was 5% over
    assert Deadline(near, at_start=at_start).before_start() is None  # within 10%
    refused = Deadline(near, margin=0.02, at_start=at_start).before_start()
    assert refused is not None and refused.reason.endswith("; not started")
    assert refused.reason.startswith("expected to end at ")
    assert "(5 earlier builds: " in refused.reason


def test_a_running_builds_earliest_end_is_where_its_fastest_history_would_put_it() -> None:
    """The margin rule weighs the earliest end, not the expected one: a build whose median
    history would miss the deadline, but whose fastest would make it, runs on."""
    totals = (100.0, 120.0, 160.0)
    history = History([PastBuild(f"b{i}.jsonl", s, {START: 0.0}) for i, s in enumerate(totals)])
    model = ReadModel(history)
    start = 7 * S
    model.apply(BuildStarted(0, 0, start, "main", "b", dict(MODEL)))
    now = start + S // 2
    projection = model.project(now)
    assert projection is not None and projection.basis == "history"
    assert (projection.expected_s, projection.earliest_s) == (120.0, 100.0)
    deadline = Deadline(105.0, project=model.project)  # the fastest fits, within the margin
    assert deadline.check(BuildView(now, start, None, None)) is None
    stopped = Deadline(85.0, project=model.project).check(BuildView(now, start, None, None))
    assert stopped is not None and stopped.reason.startswith("expected to end at 2m00s")


def test_a_build_whose_history_cannot_fit_is_refused_and_says_why(history: History) -> None:
    refused = AnyOf(Timeout(3600), Deadline(1.0, at_start=before_start(history))).before_start()
    assert refused is not None and refused.source == "deadline" and refused.timeout
    assert ", after the 1.0s deadline; not started" in refused.reason


def test_without_history_or_trustworthy_progress_it_is_a_timeout() -> None:
    model = ReadModel(None)
    deadline = Deadline(10.0, project=model.project)
    assert deadline.before_start() is None
    events = virtual_build(PLAN, pace=1.0, seed=3, attributes=MODEL)
    start = events[0].mono_ns
    model.apply(events[0])
    assert deadline.check(BuildView(start + 9 * S, start, None, None)) is None
    passed = deadline.check(BuildView(start + 10 * S, start, None, None))
    assert passed is not None and passed.reason == "the build ran past its deadline of 10.0s"


def test_early_progress_does_not_cancel_builds_that_make_it() -> None:
    """TensorRT's early progress ratio says little (later phases' steps are not known yet):
    trusted from the first steps, it would stop builds that end in time."""
    for seed in range(40, 80):
        build = virtual_build(PLAN, pace=1.0, seed=seed, attributes=MODEL)
        model = ReadModel(None)
        deadline = Deadline(duration_s(build) * 1.02, project=model.project)
        assert first_decision(deadline, model, build) is None, seed


def test_progress_projects_only_once_half_the_steps_are_done() -> None:
    """With no history, progress says nothing before half the steps are done; after, a build
    whose progress puts even its earliest end past the deadline and margin is stopped, with
    that evidence in the reason."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    model = ReadModel(None)
    monitor.log.follow(model, min_interval_s=0.0)
    monitor.start()
    monitor.phase_start("Building engine", None, 10)
    deadline = Deadline(104.0, project=model.project)  # 50 s a step: it ends at 200 s
    start = model.state.start_mono_ns if model.state.start_mono_ns is not None else 0
    for step in range(5):
        clock.advance(20.0)
        monitor.step_complete("Building engine", step)
        monitor.log.flush()
        view = BuildView(clock.mono_ns(), start, None, None)
        decision = deadline.check(view)
        if step < 4:  # under half its steps: no projection, no decision
            assert decision is None and model.project(view.now_mono_ns) is None, step
    assert decision is not None
    assert decision.reason == (
        "expected to end at 3m20s (50% of its steps done in 1m40s), after the 1m44s deadline; "
        "stopped at 1m40s"
    )
    monitor.close()


def test_projections_of_builds_that_make_it_stay_inside_the_margin() -> None:
    """What PROGRESS_EARLIEST rests on: across paces and seeds, no earliest end is more than
    the margin past the real end."""
    worst = 0.0
    for pace in (0.5, 1.0, 2.0):
        for seed in range(60, 70):
            build = virtual_build(PLAN, pace=pace, seed=seed, attributes=MODEL)
            model = ReadModel(None)
            for event in build[:-1]:
                model.apply(event)
                projection = model.project(event.mono_ns)
                if projection is not None:
                    worst = max(worst, projection.earliest_s / duration_s(build))
    assert 1.0 < worst < 1 + DEFAULT_MARGIN


def test_history_matches_by_fingerprint_when_both_builds_have_one() -> None:
    this = {"model.sha256": "a" * 64, "fingerprint": "f1"}
    assert same_build({"model.sha256": "a" * 64, "fingerprint": "f1"}, this)
    assert not same_build({"model.sha256": "a" * 64, "fingerprint": "f2"}, this)
    assert same_build({"model.sha256": "a" * 64}, this)  # an older record: by its model
    assert not same_build({"model.sha256": "b" * 64}, this)
    assert same_build({"model.sha256": "b" * 64}, {})  # this build names no model


# -- the command ---------------------------------------------------------------------------------


def demo_history(folder: Path, pace: float) -> Path:
    folder.mkdir()
    demo = {
        "model.path": "trt-otel-demo-mnist.onnx",
        "model.sha256": hashlib.sha256(demo_model_bytes()).hexdigest(),
    }
    for seed in range(3):
        events = virtual_build(PLAN, pace=pace, seed=seed, attributes=demo)
        write_journal(folder / f"earlier{seed}.jsonl", events)
    return folder


@pytest.mark.e2e
def test_the_command_refuses_a_build_its_history_says_cannot_fit(tmp_path: Path) -> None:
    history = demo_history(tmp_path / "history", pace=5.0)
    journal = tmp_path / "refused.jsonl"
    done = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--no-progress", "--no-gpu", "--history", str(history),
         "--deadline", "2s", "--journal", str(journal)],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "(3 earlier builds: " in done.stderr and "deadline; not started" in done.stderr
    events = read_journal(journal).events
    assert not any(isinstance(e, PhaseStarted) for e in events), "nothing was built"
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    assert cancel.source == "deadline" and cancel.reason.endswith(
        "after the 2.0s deadline; not started"
    )
    end = events[-1]
    assert isinstance(end, BuildFinished) and end.outcome.value == "timeout"
    assert isinstance(events[0], BuildStarted)


@pytest.mark.parametrize(
    ("margin", "share"),
    [("5", 0.05), ("5%", 0.05), (" 12.5 % ", 0.125), ("0", 0.0), ("0.5%", 0.005),
     ("1000", 10.0), ("250%", 2.5)],
)  # fmt: skip
def test_the_margin_is_a_percentage_written_as_people_write_one(margin: str, share: float) -> None:
    """``--deadline-margin 5`` is 5%, as ``--fail-if-slower 5`` is: it was 500%."""
    from trt_otel.app.commands import DemoCommand, build_parser, command_of

    args = build_parser().parse_args(["demo", "--deadline", "1m", "--deadline-margin", margin])
    command = command_of(args)
    assert isinstance(command, DemoCommand)
    config = command.session.policy
    assert config.deadline_margin == pytest.approx(share)
    policy = config.policy()
    assert policy is not None and f"margin {share:.0%}" in policy.describe()


@pytest.mark.parametrize(
    ("margin", "said"),
    [("abc", "'abc' is not a percentage (5, 5%)"), ("nan", "'nan' is not a percentage"),
     ("-5%", "'-5%' must be from 0% to 1000%"), ("2000%", "'2000%' must be from 0% to 1000%"),
     ("inf", "'inf' must be from 0% to 1000%"),
     # Once read as a fraction (10%), now it would be a tenth of a percent: said, not guessed.
     ("0.1", "'0.1' is ambiguous: write 10% for a share of 0.1, or 0.1%")],
)  # fmt: skip
@pytest.mark.e2e
def test_a_bad_margin_is_a_usage_error(margin: str, said: str) -> None:
    done = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--deadline", "1m", "--deadline-margin", margin],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"argument --deadline-margin: {said}" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr  # the error, where to look


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["build", "demo", "run"])
def test_the_help_names_the_deadline_and_its_margin(command: str) -> None:
    done = subprocess.run(
        [*CLI, command, "--help"], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--deadline DURATION" in done.stdout and "(default: 10%)" in done.stdout


def test_would_fit_counts_a_build_that_took_the_deadline_exactly_as_within_it() -> None:
    builds = [PastBuild(f"b{i}.jsonl", total_s, {}) for i, total_s in enumerate((50, 60, 70))]
    fit = would_fit(History(builds), 60.0)
    assert (fit.within, fit.builds) == (2, 3)
    assert "2 of 3 ended within 1m00s" in fit.reason
    assert would_fit(History(builds), 70.0).answer == "yes"
    assert would_fit(None, 60.0).answer == "unknown"


def test_would_fit_says_maybe_while_some_earlier_build_ended_past_the_deadline() -> None:
    builds = [PastBuild(f"b{i}.jsonl", total_s, {}) for i, total_s in enumerate((50, 60, 70))]
    fit = would_fit(History(builds), 65.0)
    assert (fit.answer, fit.within, fit.builds) == ("maybe", 2, 3)
    assert would_fit(History(builds), 70.0).answer == "yes", "every one of them ended within"
