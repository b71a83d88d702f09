"""A realistic build plan, generated from the size of a network, and the time model.

The shape follows the recorded TensorRT 10.16 builds (``../shared/traces``): a root "Building
engine" phase that finishes early (step 4 of 0..5); "Optimizing graph" finishing at step 28 of
0..32; per optimization profile a "Timing tactics" phase whose "Timing graph nodes" and "Timing
tensor reformats" children report their own steps in pairs around their children; "Evaluating
tactic times" under two different parents; "Measuring tactic time" reused hundreds of times,
alternating 4-step and 2-step instances; skipped steps (0,1,2,3,6,7,8 of 9); and a parent
("Computing profile costs") that reports steps while its child ("Determining refit engines") is
still open.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from trt_otel.builder.simulator.callbacks import Callback

# Seconds of builder work per step at speed 1, by phase; calibrated so that a build the size of
# the recorded MNIST traces lasts a few tens of seconds: long enough to watch, short for a demo.
DEFAULT_STEP_COST_S: dict[str, float] = {
    "Building engine": 0.4,
    "Cloning network graph": 0.02,
    "Preparing graph for optimization": 0.15,
    "Building engine from subgraph": 0.3,
    "Optimizing graph": 0.12,
    "Computing profile costs": 0.05,
    "Timing tactics": 0.05,
    "Timing graph nodes": 0.02,
    "Timing tensor reformats": 0.02,
    "Computing reformatting costs": 0.01,
    "Evaluating tactic times": 0.01,
    "Measuring tactic time": 0.012,
    "Determining refit engines": 0.05,
}
DEFAULT_STEP_COST = 0.01
PHASE_START_COST_S = 0.0005


@dataclass(frozen=True, slots=True)
class TimeModel:
    """Seconds of simulated builder work before each callback."""

    step_cost_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STEP_COST_S))

    def delay_s(self, callback: Callback) -> float:
        if callback.delay_s is not None:
            return callback.delay_s
        if callback.kind == "step_complete":
            return self.step_cost_s.get(callback.name, DEFAULT_STEP_COST)
        if callback.kind == "phase_start":
            return PHASE_START_COST_S
        return 0.0

    def total_s(self, plan: Sequence[Callback]) -> float:
        return sum(self.delay_s(c) for c in plan)


# Tactic counts seen per node in the recorded builds.
_TACTIC_COUNTS = (28, 33, 32, 153, 18, 5, 15, 1, 34, 29, 4)
TACTIC_SHARE_BY_LEVEL = {0: 0.05, 1: 0.15, 2: 0.4, 3: 1.0, 4: 1.6, 5: 2.5}
"""The share of a node's tactics timed at each builder optimization level, against the default
3: TensorRT's lower levels time fewer tactics (and so build faster; a build taking 1.5 h at
level 5 took minutes at 3), its higher ones more. Level 3 is the recorded builds' own."""
_REFORMAT_STEPS = (3, 6, 9, 6, 2, 1, 1)


class _PlanWriter:
    def __init__(self) -> None:
        self.calls: list[Callback] = []

    def start(self, name: str, parent: str | None, num_steps: int) -> None:
        self.calls.append(Callback("phase_start", name, parent=parent, num_steps=num_steps))

    def step(self, name: str, step: int) -> None:
        self.calls.append(Callback("step_complete", name, step=step))

    def finish(self, name: str) -> None:
        self.calls.append(Callback("phase_finish", name))

    def steps(self, name: str, steps: range) -> None:
        for step in steps:
            self.step(name, step)

    def evaluate_tactics(self, parent: str, tactics: int) -> None:
        name = "Evaluating tactic times"
        self.start(name, parent, tactics)
        for tactic in range(tactics):
            if tactic:
                self._measure(name, 2)
            self._measure(name, 4)
            self.step(name, tactic)
        self.finish(name)

    def _measure(self, parent: str, steps: int) -> None:
        name = "Measuring tactic time"
        self.start(name, parent, steps)
        self.steps(name, range(steps))
        self.finish(name)


def _begin_build(plan: _PlanWriter, cloning_steps: int) -> str:
    """The start TensorRT's and TensorRT-RTX's builds share: the root phase of 6 steps, the
    network cloned (``cloning_steps``), then prepared, the root stepping twice after each.
    Returns the root's name."""
    root, cloning, preparing = (
        "Building engine",
        "Cloning network graph",
        "Preparing graph for optimization",
    )
    plan.start(root, None, 6)
    plan.start(cloning, root, cloning_steps)
    plan.steps(cloning, range(cloning_steps))
    plan.finish(cloning)
    plan.steps(root, range(2))
    plan.start(preparing, root, 4)
    plan.steps(preparing, range(4))
    plan.finish(preparing)
    plan.steps(root, range(2, 4))
    return root


def _end_build(plan: _PlanWriter, root: str, subgraph: str, costs: str) -> None:
    """The end both builds share: the profile costs, then the subgraph after its one step,
    then the root, which finishes early (step 4 of 0..5)."""
    plan.finish(costs)
    plan.step(subgraph, 0)
    plan.finish(subgraph)
    plan.step(root, 4)
    plan.finish(root)


def generate_plan(
    num_layers: int, num_profiles: int = 1, seed: int = 0, optimization_level: int = 3
) -> list[Callback]:
    """The callbacks of a build of a network with ``num_layers`` layers and ``num_profiles``
    optimization profiles at builder ``optimization_level`` (it decides how many tactics are
    timed), deterministic for a given seed."""
    rng = random.Random(seed)
    share = TACTIC_SHARE_BY_LEVEL.get(optimization_level, 1.0)
    layers = max(1, num_layers)
    profiles = max(1, num_profiles)
    plan = _PlanWriter()
    root = _begin_build(plan, cloning_steps=6 + 2 * layers)

    subgraph = "Building engine from subgraph"
    plan.start(subgraph, root, 1)
    plan.start("Optimizing graph", subgraph, 33)
    plan.steps("Optimizing graph", range(29))  # finishes early, as real builds do
    plan.finish("Optimizing graph")

    costs = "Computing profile costs"
    plan.start(costs, subgraph, 5 * profiles)
    timed_nodes = max(1, (layers + 1) // 2)
    for profile in range(profiles):
        _time_tactics(plan, costs, timed_nodes if profile == 0 else 1, rng, share)
        base = 5 * profile
        plan.steps(costs, range(base, base + 3))
        refit = "Determining refit engines"
        plan.start(refit, costs, 5)
        plan.steps(refit, range(5))
        plan.steps(costs, range(base + 3, base + 5))  # the parent steps while its child is open
        plan.finish(refit)
    _end_build(plan, root, subgraph, costs)
    return plan.calls


def _time_tactics(
    plan: _PlanWriter, parent: str, timed_nodes: int, rng: random.Random, share: float
) -> None:
    tactics = "Timing tactics"
    plan.start(tactics, parent, 3)

    nodes = "Timing graph nodes"
    plan.start(nodes, tactics, 12)
    plan.step(nodes, 0)
    # Spread the timed nodes over steps 1..10 of "Timing graph nodes", reported in pairs.
    groups = [timed_nodes * (g + 1) // 5 - timed_nodes * g // 5 for g in range(5)]
    for group, count in enumerate(groups):
        for _ in range(count):
            plan.evaluate_tactics(nodes, max(1, round(rng.choice(_TACTIC_COUNTS) * share)))
        plan.steps(nodes, range(1 + 2 * group, 3 + 2 * group))
    plan.step(nodes, 11)
    plan.finish(nodes)
    plan.step(tactics, 0)

    reformats = "Timing tensor reformats"
    plan.start(reformats, tactics, 12)
    reformat_costs = "Computing reformatting costs"
    for index, steps in enumerate(_REFORMAT_STEPS):
        plan.start(reformat_costs, reformats, steps)
        # Long reformat phases skip the steps of formats they rule out (0,1,2,3,6,7,8 of 9).
        reported = [s for s in range(steps) if not (steps >= 9 and s in (4, 5))]
        for step in reported:
            plan.step(reformat_costs, step)
            if step < steps - 1 and step % 2 == 0:
                plan.evaluate_tactics(reformat_costs, 3)
        plan.finish(reformat_costs)
        if index < 5:
            plan.steps(reformats, range(2 * index, 2 * index + 2))
        else:
            plan.step(reformats, index + 5)
    plan.finish(reformats)
    plan.step(tactics, 1)  # finishes early: step 1 of 0..2
    plan.finish(tactics)


# -- TensorRT-RTX ------------------------------------------------------------------------------

TENSORRT_10 = "tensorrt-10"
TENSORRT_RTX = "tensorrt-rtx"
SHAPES = (TENSORRT_10, TENSORRT_RTX)
"""The builders whose phase tree the simulator can reproduce."""

SILENT_PHASE_RTX = "Determining refit engines"
# Seconds TensorRT-RTX 1.7's CPU-only builder spends in the one step of "Determining refit
# engines", per squared layer: measured 18.4 s for 4,501 layers (a 1,500-block residual net),
# 2.9 s for 1,501, on one idle x86-64 core. Everything else in its build takes milliseconds.
RTX_REFIT_S_PER_LAYER2 = 9.1e-7
RTX_STEP_S = 2e-5


def generate_rtx_plan(num_layers: int, num_profiles: int = 1) -> list[Callback]:
    """The callbacks TensorRT-RTX 1.7's builder makes for a network of ``num_layers`` layers
    (as its ``INetworkDefinition`` counts them) and ``num_profiles`` optimization profiles.

    Read from its real builds (``tests/test_rtx_simulator.py`` checks it against them): 12
    phases for one profile, a root of 6 steps finished after 5, "Cloning network graph" with a
    step per layer and two more, no tactic measuring on a CPU-only build, and per profile a
    "Determining refit engines" of one step, whose parent reports two steps before the child
    finishes. Its one long step carries the real silent window's length as its delay.
    """
    layers = max(1, num_layers)
    profiles = max(1, num_profiles)
    plan = _PlanWriter()
    root = _begin_build(plan, cloning_steps=layers + 2)
    subgraph, optimizing = "Building engine from subgraph", "Optimizing graph"
    plan.start(subgraph, root, 1)
    plan.start(optimizing, subgraph, 30)
    plan.steps(optimizing, range(30))
    plan.finish(optimizing)
    costs = "Computing profile costs"
    plan.start(costs, subgraph, 5 * profiles)
    for profile in range(profiles):
        _rtx_timing(plan, costs)
        base = 5 * profile
        plan.steps(costs, range(base, base + 3))
        plan.start(SILENT_PHASE_RTX, costs, 1)
        plan.calls.append(
            Callback(
                "step_complete",
                SILENT_PHASE_RTX,
                step=0,
                delay_s=RTX_REFIT_S_PER_LAYER2 * layers * layers,
            )
        )
        plan.steps(costs, range(base + 3, base + 5))  # the parent steps while its child is open
        plan.finish(SILENT_PHASE_RTX)
    _end_build(plan, root, subgraph, costs)
    return [c if c.delay_s is not None else _with_delay(c, RTX_STEP_S) for c in plan.calls]


def _rtx_timing(plan: _PlanWriter, parent: str) -> None:
    tactics, nodes, reformats = "Timing tactics", "Timing graph nodes", "Timing tensor reformats"
    plan.start(tactics, parent, 3)
    plan.start(nodes, tactics, 3)
    plan.steps(nodes, range(3))
    plan.finish(nodes)
    plan.step(tactics, 0)
    plan.start(reformats, tactics, 3)
    reformat_costs = "Computing reformatting costs"
    for steps_after in (range(2), range(2, 3)):
        plan.start(reformat_costs, reformats, 1)
        plan.step(reformat_costs, 0)
        plan.finish(reformat_costs)
        plan.steps(reformats, steps_after)
    plan.finish(reformats)
    plan.step(tactics, 1)  # finishes early: step 1 of 0..2
    plan.finish(tactics)


def _with_delay(callback: Callback, delay_s: float) -> Callback:
    return Callback(
        callback.kind,
        callback.name,
        parent=callback.parent,
        num_steps=callback.num_steps,
        step=callback.step,
        delay_s=delay_s if callback.kind == "step_complete" else 0.0,
    )


def silent_step_index(plan: list[Callback]) -> int | None:
    """Where a TensorRT-RTX plan goes silent: the step of "Determining refit engines"."""
    return next(
        (
            index
            for index, callback in enumerate(plan)
            if callback.kind == "step_complete" and callback.name == SILENT_PHASE_RTX
        ),
        None,
    )
