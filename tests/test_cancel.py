"""Cancelling through step_complete: the simulator unwinds as TensorRT does and the state
records the outcome."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

from trt_otel import BuildMonitor, Outcome, PhaseStatus
from trt_otel.builder.simulator import Callback, Driver, SimulatedTensorRT, generate_plan
from trt_otel.core.events import CancelRequested, PhaseFinished, PhaseStarted, StepCompleted

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


class Answering:
    """A progress monitor of the given base whose step_complete answers ``answer``."""

    @staticmethod
    def of(base: type, answer: object) -> Any:
        class Monitor(base):  # type: ignore[misc]
            def __init__(self) -> None:
                base.__init__(self)  # type: ignore[misc]
                self.steps = 0

            def phase_start(self, name: str, parent: str | None, num_steps: int) -> None:
                pass

            def step_complete(self, name: str, step: int) -> object:
                self.steps += 1
                if answer is RuntimeError:
                    raise RuntimeError("a bug in the monitor")
                return answer

            def phase_finish(self, name: str) -> None:
                pass

        return Monitor()


ANSWERS = [None, "yes", "", RuntimeError, False, 0, True, 1, 2.5]


@pytest.mark.e2e
@pytest.mark.parametrize("answer", ANSWERS, ids=repr)
def test_the_real_binding_and_the_simulator_take_any_answer_alike(answer: object) -> None:
    """What TensorRT-RTX's own binding does with each answer of step_complete (a build of one
    ReLU on this machine's CPU), and the simulator the same: None, a string or an exception
    cancel the build; a number counts by its truth."""
    trt = pytest.importorskip("tensorrt_rtx")
    logger = trt.Logger(trt.Logger.INTERNAL_ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    relu = network.add_activation(
        network.add_input("x", trt.float32, (1, 4)), trt.ActivationType.RELU
    )
    network.mark_output(relu.get_output(0))
    config = builder.create_builder_config()
    real = Answering.of(trt.IProgressMonitor, answer)
    config.progress_monitor = real
    real_cancelled = builder.build_serialized_network(network, config) is None
    assert real.steps > 0

    simulated = Answering.of(object, answer)
    stderr = io.StringIO()
    plan = [Callback("phase_start", "A", None, 2), Callback("step_complete", "A", step=0),
            Callback("step_complete", "A", step=1), Callback("phase_finish", "A")]  # fmt: skip
    simulated_cancelled = not Driver(speed=0, stderr=stderr).run(simulated, plan).completed
    assert simulated_cancelled == real_cancelled
    assert real_cancelled == (answer in (None, "yes", "", RuntimeError, False, 0))


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
