"""Estimates of the time left: honest about what they do not know, and better with history."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from journals import write_journal
from trt_otel import BuildMonitor, ManualClock
from trt_otel.app.components import metric_sources
from trt_otel.app.config import MetricsConfig
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core.eta import (
    MIN_ELAPSED_S,
    MIN_PROGRESS,
    BoundaryTracker,
    Estimate,
    History,
    PastBuild,
    estimate,
    format_eta,
)
from trt_otel.core.events import PhaseFinished, StepCompleted
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState
from trt_otel.testing import virtual_build
from trt_otel.views.prometheus import metrics_registry

MODEL = {"model.path": "mnist.onnx", "model.sha256": "a" * 64}
PLAN = generate_plan(13, num_profiles=1, seed=0)


@pytest.fixture(scope="module")
def history_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("history")
    for index, pace in enumerate((0.9, 1.0, 1.15)):
        write_journal(
            folder / f"b{index}.jsonl", virtual_build(PLAN, pace=pace, seed=index, attributes=MODEL)
        )
    other = {**MODEL, "model.sha256": "b" * 64}
    write_journal(folder / "other-model.jsonl", virtual_build(PLAN, seed=7, attributes=other))
    unfinished = virtual_build(PLAN, seed=8, attributes=MODEL)[:-1]
    write_journal(folder / "killed.jsonl", unfinished)
    (folder / "garbage.jsonl").write_text("not a journal\n")
    return folder


def test_history_keeps_only_finished_builds_of_the_same_model(history_dir: Path) -> None:
    history = History.load(history_dir, MODEL["model.sha256"])
    assert len(history.builds) == 3
    reasons = sorted(history.skipped)
    assert [r.split(":")[0] for r in reasons] == [
        "garbage.jsonl",
        "killed.jsonl",
        "other-model.jsonl",
    ]
    assert "another model" in reasons[2] and "not a finished" in reasons[1]


def test_history_keeps_other_models_finished_builds_for_forecasts_of_new_ones(
    history_dir: Path,
) -> None:
    """A build never made before is forecast from other models' builds, scaled by size: those
    in the history folder are kept aside for it (only finished, successful ones)."""
    history = History.load(history_dir, MODEL["model.sha256"])
    assert [build.source for build in history.others] == ["other-model.jsonl"]
    assert history.others[0].model_name == "mnist.onnx" and history.others[0].total_s > 0
    new_model = History.load(history_dir, "c" * 64)
    assert not new_model.builds
    assert sorted(build.source for build in new_model.others) == [
        "b0.jsonl",
        "b1.jsonl",
        "b2.jsonl",
        "other-model.jsonl",
    ]


def test_history_estimates_beat_progress_on_a_slower_machine(history_dir: Path) -> None:
    history = History.load(history_dir, MODEL["model.sha256"])
    events = virtual_build(PLAN, pace=1.3, seed=42, attributes=MODEL)
    end = events[-1].mono_ns
    state, tracker = BuildState(), BoundaryTracker()
    errors: dict[str, list[float]] = {"history": [], "progress": []}
    for event in events[:-1]:
        state.apply(event)
        tracker.apply(event, state)
        if isinstance(event, PhaseFinished):
            truth = (end - event.mono_ns) / 1e9
            guess = estimate(state, tracker, event.mono_ns, history)
            for name, value in (("history", guess.history), ("progress", guess.progress)):
                if value.seconds is not None:
                    errors[name].append(abs(value.seconds - truth))
            assert guess.build == (
                guess.history if guess.history.seconds is not None else guess.progress
            )
    assert errors["history"] and errors["progress"]
    assert statistics.fmean(errors["history"]) < statistics.fmean(errors["progress"]) / 2


def test_estimates_say_when_they_do_not_know() -> None:
    events = virtual_build(PLAN, seed=3, attributes=MODEL)
    state, tracker = BuildState(), BoundaryTracker()
    first_step = next(i for i, e in enumerate(events) if isinstance(e, StepCompleted))
    for event in events[:first_step]:
        state.apply(event)
        tracker.apply(event, state)
    now = events[first_step - 1].mono_ns
    guess = estimate(state, tracker, now, None)
    assert guess.build.seconds is None and guess.build.unknown == "too little done to extrapolate"
    assert guess.history.unknown == "no history given (--history DIR)"
    assert all(p.unknown == "no step yet" for p in guess.phases.values())
    assert format_eta(guess.build) == "ETA unknown (too little done to extrapolate)"
    empty = estimate(state, tracker, now, History([]))
    assert empty.history.unknown == "no earlier build of this model"
    # Once a phase has steps, it has an estimate of its own.
    for event in events[first_step : first_step + 3]:
        state.apply(event)
        tracker.apply(event, state)
    later = estimate(state, tracker, events[first_step + 2].mono_ns, None)
    assert any(p.seconds is not None for p in later.phases.values())
    finished = BuildState()
    for event in events:
        finished.apply(event)
    assert estimate(finished, tracker, events[-1].mono_ns, None).build.seconds == 0.0


def test_a_phase_is_estimated_from_its_time_per_step_times_the_steps_left() -> None:
    """A phase's own estimate counts the steps TensorRT reported done (its first step is step
    0): two steps in 6 s are 3 s each, and two of its four steps are left."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    try:
        monitor.start()
        monitor.phase_start("Building engine", None, 4)
        phase_id = monitor.state.open_by_name["Building engine"]
        clock.advance(3.0)
        monitor.step_complete("Building engine", 0)
        first = estimate(monitor.state, BoundaryTracker(), clock.mono_ns(), None)
        assert first.phases[phase_id] == Estimate(9.0, "steps"), "one step done: 3 left"
        clock.advance(3.0)
        monitor.step_complete("Building engine", 1)
        second = estimate(monitor.state, BoundaryTracker(), clock.mono_ns(), None)
        assert second.phases[phase_id] == Estimate(6.0, "steps")
    finally:
        monitor.close()


def test_history_scales_by_this_builds_pace_only_from_a_quarter_to_four_times_theirs() -> None:
    """Earlier builds reached the boundary at 40 s and took 60 s more: a build there at 20 s
    runs at half their time, but one there at 2 s or at 400 s is held to a quarter or to four
    times (an early boundary's pace says little)."""
    key = (("Building engine",), 0)
    history = History([PastBuild("earlier.jsonl", 100.0, {key: 40.0})])

    def left(elapsed_s: float) -> tuple[float, float]:
        spread = history.remaining_spread(key, elapsed_s)
        assert spread is not None
        return spread.scale, spread.median_s

    assert left(20.0) == (0.5, 30.0)
    assert left(2.0) == (0.25, 15.0)
    assert left(400.0) == (4.0, 240.0)


def eta_gauge(registry: CollectorRegistry) -> float | None:
    """``trt_build_eta_seconds`` as a scrape reads it, from the exposition text."""
    text = generate_latest(registry).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "trt_build_eta_seconds":
                return float(sample.value)
    return None


def test_the_eta_gauge_is_the_estimate_of_the_live_build_wired_as_the_session_wires_it() -> None:
    """The gauge reads the session's read model at scrape time; with no history it is the
    progress estimate: elapsed * (1 - p) / p, the time *left*."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock, attributes=MODEL)
    model = ReadModel()
    monitor.log.follow(model, capacity=1_000_000)
    sources = metric_sources(monitor, MetricsConfig(), spans=None, runner=None, model=model)
    registry = metrics_registry(sources)
    try:
        assert eta_gauge(registry) is None, "absent while unknown"
        monitor.start()
        half = len(PLAN) // 2
        Driver(speed=1.0, sleep=clock.advance).run(monitor, PLAN[:half])
        clock.advance(1.5)  # scraped a while after the last callback
        assert monitor.log.flush()
        state = monitor.state
        assert state.start_mono_ns is not None
        ratio = state.progress_ratio()
        elapsed_s = (clock.mono_ns() - state.start_mono_ns) / 1e9
        assert MIN_PROGRESS < ratio < 1 and elapsed_s > MIN_ELAPSED_S
        assert eta_gauge(registry) == pytest.approx(elapsed_s * (1 - ratio) / ratio)
        clock.advance(10.0)
        later = (clock.mono_ns() - state.start_mono_ns) / 1e9
        assert eta_gauge(registry) == pytest.approx(later * (1 - ratio) / ratio), (
            "read at scrape time, not at the last event"
        )
    finally:
        monitor.close()


@pytest.mark.e2e
def test_the_command_reads_a_history_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import hashlib

    from trt_otel.app.cli import main

    demo = {"model.path": "trt-otel-demo-mnist.onnx",
            "model.sha256": hashlib.sha256(demo_model_bytes()).hexdigest()}  # fmt: skip
    write_journal(tmp_path / "earlier.jsonl", virtual_build(PLAN, seed=1, attributes=demo))
    assert main(["demo", "--speed", "0", "--no-progress", "--history", str(tmp_path)]) == 0
    assert "history: 1 earlier builds of this model" in capsys.readouterr().err
    assert main(["demo", "--history", str(tmp_path / "none")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_boundary_is_the_path_of_names_to_the_finished_phase_and_its_occurrence() -> None:
    """The key a live build and a past one are matched by: root to phase, then how many
    times that path finished before (repeated children of one parent count up)."""
    monitor = BuildMonitor(clock=ManualClock())
    model = ReadModel()
    monitor.log.follow(model, min_interval_s=0.0)
    seen = []
    monitor.phase_start("Build", None, 1)
    monitor.phase_start("Optimize", "Build", 1)
    for _ in range(3):
        monitor.phase_start("Time", "Optimize", 1)
        monitor.phase_finish("Time")
        monitor.log.flush()
        seen.append(model.boundaries.last)
    monitor.phase_finish("Optimize")
    monitor.phase_start("Time", "Build", 1)  # the same name under another parent
    monitor.phase_finish("Time")
    monitor.phase_finish("Build")
    monitor.log.flush()
    seen.append(model.boundaries.last)
    monitor.close()
    nested = ("Build", "Optimize", "Time")
    assert seen == [(nested, 0), (nested, 1), (nested, 2), (("Build",), 0)]
    assert model.boundaries.counts == {
        nested: 3,
        ("Build", "Optimize"): 1,
        ("Build", "Time"): 1,
        ("Build",): 1,
    }


def test_a_boundary_of_a_phase_nested_past_the_limit_is_its_innermost_names() -> None:
    """A journal may nest phases as deep as it likes (100,000): a boundary's path is at most
    MAX_PATH_DEPTH names (the innermost, after an ellipsis), so paths and the time to make them
    stay linear in the depth, and the same phase gets the same path however it is reached."""
    from trt_otel.core.eta import DEEPER, MAX_PATH_DEPTH

    depth = 3 * MAX_PATH_DEPTH
    monitor = BuildMonitor(clock=ManualClock())
    model = ReadModel()
    monitor.log.follow(model, min_interval_s=0.0)
    parent = None
    for level in range(depth):
        monitor.phase_start(f"p{level}", parent, 1)
        parent = f"p{level}"
    seen = []
    for level in reversed(range(depth)):
        monitor.phase_finish(f"p{level}")
        monitor.log.flush()
        seen.append(model.boundaries.last[0])
    monitor.close()
    assert max(map(len, model.boundaries.counts)) == MAX_PATH_DEPTH
    innermost = seen[0]
    assert innermost[0] == DEEPER
    assert innermost[1:] == tuple(f"p{level}" for level in range(depth - MAX_PATH_DEPTH + 1, depth))
    assert seen[-1] == ("p0",)
    assert seen[-MAX_PATH_DEPTH] == tuple(f"p{level}" for level in range(MAX_PATH_DEPTH))
    assert seen[-MAX_PATH_DEPTH - 1][0] == DEEPER
