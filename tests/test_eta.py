"""Estimates of the time left: honest about what they do not know, and better with history."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from trt_otel.eta import BoundaryTracker, EtaProjection, History, estimate, format_eta
from trt_otel.events import Event, PhaseFinished, StepCompleted
from trt_otel.journal import JournalWriter
from trt_otel.model import demo_model_bytes
from trt_otel.simulator import generate_plan
from trt_otel.state import BuildState
from trt_otel.testing import virtual_build

MODEL = {"model.path": "mnist.onnx", "model.sha256": "a" * 64}
PLAN = generate_plan(13, num_profiles=1, seed=0)


def write(path: Path, events: list[Event]) -> Path:
    writer = JournalWriter(path)
    writer.handle(events)
    writer.close()
    return path


@pytest.fixture(scope="module")
def history_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("history")
    for index, pace in enumerate((0.9, 1.0, 1.15)):
        write(
            folder / f"b{index}.jsonl", virtual_build(PLAN, pace=pace, seed=index, attributes=MODEL)
        )
    other = {**MODEL, "model.sha256": "b" * 64}
    write(folder / "other-model.jsonl", virtual_build(PLAN, seed=7, attributes=other))
    unfinished = virtual_build(PLAN, seed=8, attributes=MODEL)[:-1]
    write(folder / "killed.jsonl", unfinished)
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


def test_the_gauge_is_absent_while_unknown_and_present_once_known(history_dir: Path) -> None:
    from prometheus_client import generate_latest

    from trt_otel import BuildMonitor
    from trt_otel.sinks.prometheus import MetricsServer

    monitor = BuildMonitor()
    projection = EtaProjection(History.load(history_dir, MODEL["model.sha256"]))
    known: list[float | None] = [None]
    server = MetricsServer(monitor, 0, eta=lambda: known[0])
    try:
        assert "trt_build_eta_seconds" not in generate_latest(server.registry).decode()
        events = virtual_build(PLAN, seed=5, attributes=MODEL)
        projection.handle(events[: len(events) // 2])
        known[0] = projection.current(events[len(events) // 2].mono_ns).build.seconds
        assert known[0] is not None
        assert f"trt_build_eta_seconds {known[0]}" in generate_latest(server.registry).decode()
    finally:
        server.close()


def test_the_command_reads_a_history_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import hashlib

    from trt_otel.cli import main

    demo = {"model.path": "trt-otel-demo-mnist.onnx",
            "model.sha256": hashlib.sha256(demo_model_bytes()).hexdigest()}  # fmt: skip
    write(tmp_path / "earlier.jsonl", virtual_build(PLAN, seed=1, attributes=demo))
    assert main(["demo", "--speed", "0", "--no-progress", "--history", str(tmp_path)]) == 0
    assert "history: 1 earlier builds of this model" in capsys.readouterr().err
    assert main(["demo", "--history", str(tmp_path / "none")]) == 2
    assert "is not a directory" in capsys.readouterr().err
