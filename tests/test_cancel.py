"""Cancelling through step_complete: the simulator unwinds as TensorRT does and the state
records the outcome."""

from __future__ import annotations

import io
import random

import pytest

from trt_otel import BuildMonitor, Outcome, PhaseStatus
from trt_otel.events import CancelRequested, PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.simulator import Callback, Driver, SimulatedTensorRT, generate_plan

PLAN = generate_plan(num_layers=13, num_profiles=2, seed=7)
STEP_INDEXES = [i for i, c in enumerate(PLAN) if c.kind == "step_complete"]


class CancelAtStep(BuildMonitor):
    """Cancels from inside the build when the n-th step arrives."""

    def __init__(self, at_step: int) -> None:
        super().__init__()
        self.at_step = at_step
        self.steps_seen = 0

    def step_complete(self, phase_name: str, step: int) -> bool:
        self.steps_seen += 1
        if self.steps_seen == self.at_step:
            self.cancel(f"test cancel at step {self.at_step}", source="test")
        return super().step_complete(phase_name, step)


@pytest.mark.parametrize("at_step", random.Random(2024).sample(range(1, len(STEP_INDEXES)), 12))
def test_cancel_at_a_random_step_unwinds_innermost_first(at_step: int) -> None:
    monitor = CancelAtStep(at_step)
    result = Driver(speed=0).run(monitor, PLAN)
    outcome = monitor.end_with_result(None if not result.completed else b"engine")

    assert not result.completed
    assert result.cancelled_at == STEP_INDEXES[at_step - 1]
    assert outcome is Outcome.CANCELLATION
    events = monitor.log.recent()
    cancel_at = next(i for i, e in enumerate(events) if isinstance(e, CancelRequested))
    after = events[cancel_at + 1 :]
    # The refused step is recorded, then only phase_finish calls, innermost first, then the end.
    assert isinstance(after[0], StepCompleted)
    finishes = [e.name for e in after[1:-1] if isinstance(e, PhaseFinished)]
    assert len(finishes) == len(after) - 2
    open_before: list[str] = []
    for event in events[: cancel_at + 1]:
        if isinstance(event, PhaseStarted):
            open_before.append(event.name)
        elif isinstance(event, PhaseFinished):
            open_before.remove(event.name)
    assert finishes == list(reversed(open_before))
    state = monitor.state
    assert state.open_by_name == {}
    assert all(p.status is PhaseStatus.FINISHED for p in state.phases.values())
    assert state.cancel is not None and state.cancel.reason == f"test cancel at step {at_step}"
    assert state.outcome_detail == state.cancel.reason


def test_the_simulated_builder_returns_none_when_cancelled() -> None:
    trt = SimulatedTensorRT(speed=0)
    builder = trt.Builder(trt.Logger())
    network = builder.create_network(0)
    network.layer_names = ["conv", "relu"]
    config = builder.create_builder_config()
    monitor = CancelAtStep(5)
    config.progress_monitor = monitor
    assert builder.build_serialized_network(network, config) is None
    assert monitor.end_with_result(None) is Outcome.CANCELLATION


@pytest.mark.parametrize("answer", [None, 1, "yes"], ids=repr)
def test_a_non_bool_answer_cancels_as_the_tensorrt_binding_does(answer: object) -> None:
    class Sloppy:
        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            pass

        def step_complete(self, phase_name: str, step: int) -> object:
            return answer

        def phase_finish(self, phase_name: str) -> None:
            pass

    stderr = io.StringIO()
    plan = [Callback("phase_start", "A", None, 2), Callback("step_complete", "A", step=0)]
    result = Driver(speed=0, stderr=stderr).run(Sloppy(), plan)  # type: ignore[arg-type]
    assert not result.completed
    assert "[ERROR] Exception caught in step_complete()" in stderr.getvalue()


def test_cancel_is_recorded_once_and_answers_false_from_then_on() -> None:
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 10)
    assert monitor.step_complete("A", 0) is True
    assert monitor.cancel("first", source="timeout", timeout=True) is True
    assert monitor.cancel("second") is False
    assert monitor.step_complete("A", 1) is False
    assert monitor.end() is Outcome.TIMEOUT
    assert monitor.state.error_type == "timeout"
    cancels = [e for e in monitor.log.recent() if isinstance(e, CancelRequested)]
    assert [(c.reason, c.source) for c in cancels] == [("first", "timeout")]
