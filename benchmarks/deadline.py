"""Builder time wasted on builds that miss their deadline: ``--timeout`` against ``--deadline``.

A platform team runs many builds a night under a time budget. A build that misses it produces no
engine in time, so the builder time it used is wasted. ``--timeout D`` spends D on each of them;
``--deadline D`` stops them as soon as the projection says they cannot make it, and refuses those
whose history already says so. What it must not do is stop a build that would have made it (a
false cancel: all its time is thrown away, and the engine is lost).

Five families of builds, each with five earlier builds as its history (``--history``) and forty
builds to decide on, replayed in virtual time through the same read model and the same policy
the command uses, checked every 0.25 s of build time:

- two recorded TensorRT-RTX journals (``tests/data``): each build is the recording with its time
  stretched by the build's pace, and each gap by its own jitter;
- the recorded TensorRT 10.16 MNIST callback trace (``../shared/traces``, when present) and two
  generated plans, with the simulator's time model scaled by the build's pace and jittered per
  callback (:func:`trt_otel.testing.virtual_build`).

Paces: history and three builds in four on machines like the history's (log-normal, 10%); one in
four slow (a regression, a contended host: 1.6 times, log-normal 25%). The deadline is 1.25 times
the history's median. ``--timeout`` never stops a build that would make it; ``--deadline`` is
run with no margin and with its default margin, side by side.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from trt_otel import read_journal
from trt_otel.builder.simulator import generate_plan
from trt_otel.builder.simulator.callbacks import load_trace
from trt_otel.control.deadline import DEFAULT_MARGIN, Deadline
from trt_otel.control.policies import BuildView
from trt_otel.core.eta import History, past_build
from trt_otel.core.events import Event
from trt_otel.core.projection import before_start
from trt_otel.core.readmodel import ReadModel
from trt_otel.testing import virtual_build

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
HISTORY_BUILDS = 5
BUILDS = 40
DEADLINE_OVER_MEDIAN = 1.25
CHECK_NS = 250_000_000
MARGINS = (0.0, DEFAULT_MARGIN, 0.25)
MODEL = {"model.path": "m.onnx", "model.sha256": "0" * 64}

Make = Callable[[float, int], list[Event]]
"""A build of a family at a pace, from a seed."""


def stretched(recorded: Sequence[Event]) -> Make:
    """Builds of a recorded journal: its gaps scaled by the pace, each with its own jitter."""

    def make(pace: float, seed: int) -> list[Event]:
        rng = random.Random(seed)
        out, at, previous = [], recorded[0].mono_ns, recorded[0].mono_ns
        for event in recorded:
            at += round((event.mono_ns - previous) * pace * rng.lognormvariate(0.0, 0.3))
            previous = event.mono_ns
            out.append(msgspec.structs.replace(event, mono_ns=at))
        return out

    return make


def simulated(plan: Sequence[object]) -> Make:
    def make(pace: float, seed: int) -> list[Event]:
        return virtual_build(plan, pace=pace, seed=seed, attributes=MODEL)  # type: ignore[arg-type]

    return make


def families() -> list[tuple[str, Make]]:
    found: list[tuple[str, Make]] = []
    for name in ("rtx-conv8-success", "rtx-residual400-success"):
        events = read_journal(ROOT / "tests" / "data" / f"{name}.jsonl").events
        found.append((f"TensorRT-RTX {name.split('-')[1]} (recorded journal)", stretched(events)))
    trace = TRACES / "trt-10.16.0-mnist.jsonl"
    if trace.is_file():
        found.append(("TensorRT 10.16 MNIST (recorded trace)", simulated(load_trace(trace))))
    else:
        print(f"(no {trace}: the recorded TensorRT trace is left out)")
    found.append(("generated, 13 layers", simulated(generate_plan(13, seed=0))))
    found.append(("generated, 60 layers, 2 profiles", simulated(generate_plan(60, 2, seed=1))))
    return found


def duration_s(events: Sequence[Event]) -> float:
    return (events[-1].mono_ns - events[0].mono_ns) / 1e9


def under_deadline(
    events: Sequence[Event], history: History, limit_s: float, margin: float
) -> tuple[float, bool]:
    """(builder seconds spent, stopped before the deadline) of one build under ``--deadline``,
    checked as the policy runner checks it."""
    model = ReadModel(history)
    deadline = Deadline(
        limit_s, margin=margin, project=model.project, at_start=before_start(history)
    )
    if deadline.before_start() is not None:
        return 0.0, True
    start = events[0].mono_ns
    check = start + CHECK_NS
    for event in events:
        while check < event.mono_ns:
            decision = deadline.check(BuildView(check, start, None, None))
            if decision is not None:  # the runner checks every 0.1 s: at the limit, not past
                at_s = (check - start) / 1e9
                return min(at_s, limit_s), at_s < limit_s
            check += CHECK_NS
        model.apply(event)
    return min(duration_s(events), limit_s), False


@dataclass
class Tally:
    """Builder seconds on builds that missed the deadline, and false cancels."""

    wasted_s: float = 0.0
    missed: int = 0
    false_cancels: int = 0
    false_cancel_s: float = 0.0
    stopped_early: int = 0
    spent_s: list[float] = field(default_factory=list)

    @property
    def lost_s(self) -> float:
        """All the builder time that produced no engine in time."""
        return self.wasted_s + self.false_cancel_s


# Long: one table, the builds of every family under each way of stopping them.
def main() -> int:
    rng = random.Random(26)
    timeout, deadlines = Tally(), {margin: Tally() for margin in MARGINS}
    print(f"{'family':<44} {'builds':>6} {'missed':>6} {'deadline':>9}  timeout: wasted  "
          + "  ".join(f"deadline {m:.0%}: wasted, false" for m in MARGINS))  # fmt: skip
    builds = 0
    for name, make in families():
        earlier = [
            make(rng.lognormvariate(0.0, 0.1), rng.randrange(1 << 30))
            for _ in range(HISTORY_BUILDS)
        ]
        history = History([b for i, e in enumerate(earlier) if (b := past_build(e, f"h{i}"))])
        totals = history.totals()
        assert totals is not None and len(history.builds) == HISTORY_BUILDS
        limit_s = DEADLINE_OVER_MEDIAN * totals[1]
        family_timeout, family = Tally(), {margin: Tally() for margin in MARGINS}
        for index in range(BUILDS):
            builds += 1
            slow = index % 4 == 3
            pace = rng.lognormvariate(math.log(1.6), 0.25) if slow else rng.lognormvariate(0.0, 0.1)
            events = make(pace, rng.randrange(1 << 30))
            took_s = duration_s(events)
            missed = took_s > limit_s
            for tally in (timeout, family_timeout):
                if missed:
                    tally.missed += 1
                    tally.wasted_s += limit_s
            for margin in MARGINS:
                spent_s, early = under_deadline(events, history, limit_s, margin)
                for tally in (deadlines[margin], family[margin]):
                    tally.stopped_early += early
                    if missed:
                        tally.missed += 1
                        tally.wasted_s += spent_s
                    elif early:
                        tally.false_cancels += 1
                        tally.false_cancel_s += spent_s
        print(f"{name:<44} {BUILDS:>6} {family_timeout.missed:>6} {limit_s:>8.1f}s  "
              f"{family_timeout.wasted_s:>13.1f}s  "
              + "  ".join(f"{family[m].wasted_s:>15.1f}s, {family[m].false_cancels:>5}"
                          for m in MARGINS))  # fmt: skip
    print()
    for margin in MARGINS:
        tally = deadlines[margin]
        saved = 1 - tally.lost_s / timeout.wasted_s
        print(
            f"--deadline, margin {margin:.0%}: {tally.wasted_s:.1f}s on {tally.missed} builds that "
            f"missed (timeout: {timeout.wasted_s:.1f}s), {tally.false_cancels} false cancels "
            f"({tally.false_cancel_s:.1f}s thrown away); {saved:.0%} of the wasted builder "
            "time saved"
        )
    chosen = deadlines[DEFAULT_MARGIN]
    saved = 1 - chosen.lost_s / timeout.wasted_s
    print(
        f"headline: --deadline (default {DEFAULT_MARGIN:.0%} margin) saved {saved:.0%} of the "
        f"builder time --timeout wasted on builds that missed their deadline, with "
        f"{chosen.false_cancels} false cancels in {builds} builds"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
