"""Every recorded TensorRT trace, replayed through the simulator into a BuildMonitor, yields a
BuildState whose phase tree is the trace's."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path

import pytest

from conftest import ReferencePhase, reference_tree, trace_params
from trt_otel import BuildMonitor, Outcome, PhaseStatus
from trt_otel.builder.simulator import Callback, Driver, generate_plan, load_trace
from trt_otel.core.state import BuildState, Phase


def state_shape(state: BuildState, phase: Phase, steps: dict[int, list[int]]) -> tuple[object, ...]:
    return (
        phase.name,
        phase.num_steps,
        tuple(steps[phase.id]),
        tuple(state_shape(state, state.phases[c], steps) for c in phase.children),
    )


def count(roots: list[ReferencePhase]) -> collections.Counter[str]:
    counter: collections.Counter[str] = collections.Counter()
    stack = list(roots)
    while stack:
        phase = stack.pop()
        counter[phase.name] += 1
        stack.extend(phase.children)
    return counter


@pytest.mark.parametrize("trace", trace_params())
def test_replayed_trace_gives_the_traces_phase_tree(trace: Path) -> None:
    monitor = BuildMonitor()
    result = Driver(speed=0).run(monitor, load_trace(trace))
    monitor.end_with_result(b"engine" if result.completed else None)
    state = monitor.state

    expected = reference_tree(trace)
    # Steps per phase instance, read back from the log (the state keeps counts, not lists).
    steps: dict[int, list[int]] = collections.defaultdict(list)
    open_ids: dict[str, int] = {}
    for event in monitor.log.recent():
        if event.type == "phase_start":
            open_ids[event.name] = event.seq  # type: ignore[attr-defined]
        elif event.type == "step":
            steps[open_ids[event.name]].append(event.step)  # type: ignore[attr-defined]

    assert result.completed
    assert state.outcome is Outcome.SUCCESS
    assert not state.anomalies, "real traces follow the protocol: nothing to flag"
    assert [state_shape(state, state.phases[r], steps) for r in state.roots] == [
        root.shape() for root in expected
    ]
    assert collections.Counter(p.name for p in state.phases.values()) == count(expected)
    assert all(p.status is PhaseStatus.FINISHED for p in state.phases.values())
    for phase in state.phases.values():
        assert phase.steps_completed == len(steps[phase.id])
        if phase.parent_id is not None:
            parent = state.phases[phase.parent_id]
            assert parent.depth + 1 == phase.depth
            assert phase.start_mono_ns >= parent.start_mono_ns
            assert phase.finish_mono_ns is not None and parent.finish_mono_ns is not None
            assert phase.finish_mono_ns <= parent.finish_mono_ns


def behaviours(callbacks: Sequence[Callback]) -> dict[str, object]:
    """What a build's callbacks show of TensorRT's ways, as the monitor folds them."""
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, callbacks)
    state = monitor.state
    phases = list(state.phases.values())
    parents: dict[str, set[str | None]] = collections.defaultdict(set)
    for phase in phases:
        parents[phase.name].add(
            state.phases[phase.parent_id].name if phase.parent_id is not None else None
        )
    root = state.phases[state.roots[0]]
    names = collections.Counter(p.name for p in phases)
    return {
        "phase names and their parents' names": dict(parents),
        "deepest phase": max(p.depth for p in phases),
        "the root and the step it finishes after": (root.name, root.last_step, root.num_steps),
        "steps skipped": any(p.skipped_steps for p in phases),
        "phases finished early": any(p.last_step + 1 < p.num_steps for p in phases),
        "phase names started over 100 times": sorted(n for n, c in names.items() if c > 100),
        "protocol anomalies": dict(state.anomalies),
    }


@pytest.mark.parametrize("trace", trace_params())
def test_the_simulator_reproduces_the_behaviours_of_the_traces(trace: Path) -> None:
    """The simulator's generated build, against NVIDIA's captured ones: the same phases under
    the same parents, as deep, the root finished a step early, steps skipped, phases finished
    early, the same names repeated hundreds of times, and nothing off the protocol."""
    recorded = behaviours(load_trace(trace))
    assert recorded["steps skipped"] and recorded["phases finished early"]
    assert behaviours(generate_plan(13)) == recorded
