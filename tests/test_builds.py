"""A log of several builds (``trt-otel run``, a retry ladder's attempts), cut into builds the
same way wherever it is folded: one state per build, never one state reset in place."""

from __future__ import annotations

import msgspec
import pytest

from trt_otel import BuildMonitor, ManualClock, Outcome
from trt_otel.core.builds import PerBuild, builds_of
from trt_otel.core.eta import past_build
from trt_otel.core.events import BuildStarted, Event, LogMessage
from trt_otel.core.readmodel import ReadModel, SiblingGroup
from trt_otel.core.state import AnotherBuildError, BuildState


def build(build_id: str, repeats: int, *, outcome: Outcome = Outcome.SUCCESS) -> list[Event]:
    """The events of one build, a second apart: a root and ``repeats`` finished children of
    one name."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock, build_id=build_id)
    monitor.start()
    monitor.phase_start("Building engine", None, repeats)
    for _ in range(repeats):
        clock.advance(1.0)
        monitor.phase_start("Timing", "Building engine", 1)
        clock.advance(1.0)
        monitor.phase_finish("Timing")
    clock.advance(1.0)
    monitor.phase_finish("Building engine")
    monitor.end(outcome)
    return monitor.log.recent()


def log_of(*builds: list[Event]) -> list[Event]:
    """Builds one after another in one log, renumbered as one log numbers them."""
    events = [event for events in builds for event in events]
    return [msgspec.structs.replace(event, seq=seq) for seq, event in enumerate(events)]


def test_a_log_is_cut_before_each_build_start_but_the_first() -> None:
    line = LogMessage(seq=0, wall_ns=0, mono_ns=0, thread="t", severity="info", message="hi")
    first, second = build("b1", 2), build("b2", 3)
    events = log_of([line], first, second)
    cut = builds_of(events)
    assert [len(events) for events in cut] == [1 + len(first), len(second)]
    assert [type(events[1]) for events in cut[:1]] == [BuildStarted], "a line before goes first"
    assert builds_of([]) == []


def test_a_state_folds_one_build_and_refuses_a_second() -> None:
    state = BuildState()
    events = log_of(build("b1", 1), build("b2", 1))
    with pytest.raises(AnotherBuildError, match=r"'b2'.*'b1'"):
        for event in events:
            state.apply(event)
    assert state.build_id == "b1" and state.outcome is Outcome.SUCCESS


def test_per_build_makes_a_fold_for_each_build_and_passes_on_the_one_that_ended() -> None:
    ended: list[BuildState] = []
    builds = PerBuild(BuildState, on_next=ended.append)
    for event in log_of(build("b1", 1), build("b2", 1), build("b3", 1)):
        builds.fold_for(event).apply(event)
    assert builds.number == 3 and builds.current.build_id == "b3"
    assert [state.build_id for state in ended] == ["b1", "b2"]


def test_the_read_model_shows_the_latest_build_with_its_own_summaries() -> None:
    """Each build's repeated phases are its own: the second build's tree shows its three
    ``Timing`` phases, not the first build's two besides."""
    model = ReadModel()
    model.handle(log_of(build("b1", 2), build("b2", 3, outcome=Outcome.FAILURE)))
    assert model.build_number == 2
    assert model.state.build_id == "b2" and model.state.outcome is Outcome.FAILURE
    (root,) = model.tree()
    (group,) = model.tree(root.id)  # type: ignore[union-attr]
    assert isinstance(group, SiblingGroup) and group.count == 3
    assert model.state.steps_completed_total == 0 and model.state.phases_started_total == 4


def test_a_history_journal_of_several_builds_counts_its_last_build() -> None:
    """A retry ladder's journal, used as history: its last attempt, when it succeeded."""
    failed, succeeded = build("b1", 5, outcome=Outcome.FAILURE), build("b2", 2)
    past = past_build(log_of(failed, succeeded), "ladder.jsonl")
    assert past is not None
    assert past.total_s == pytest.approx(5.0)  # 2 x (1 + 1) + 1 s: the second build's
    assert past_build(log_of(succeeded, failed), "ladder.jsonl") is None
