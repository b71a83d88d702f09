"""How far each ETA was from the truth at each phase boundary of a build, with and without a
history of earlier builds of the same model.

Four builds of one model are simulated in virtual time: three earlier ones on machines of
slightly different speed, with per-callback jitter, written as journals into a history folder;
then the build under test, on a slower machine. The estimates are replayed from the build's
events at every boundary (they are pure functions of the events, so this is what the live build
showed) and compared with the time the build really had left.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from trt_otel.builder.simulator import generate_plan
from trt_otel.core.eta import BoundaryTracker, History, estimate
from trt_otel.core.events import BuildStarted, Event, PhaseFinished
from trt_otel.core.journal import JournalWriter
from trt_otel.core.state import BuildState
from trt_otel.testing import virtual_build

MODEL = {"model.path": "mnist.onnx", "model.sha256": "0" * 64}
EARLIER = ((0.9, 11), (1.0, 12), (1.15, 13))
"""(pace, seed) of the earlier builds."""
CURRENT = (1.3, 99)


def write_journal(path: Path, events: list[Event]) -> None:
    writer = JournalWriter(path)
    writer.handle(events)
    writer.close()


def main() -> int:
    plan = generate_plan(13, num_profiles=1, seed=0)
    with tempfile.TemporaryDirectory() as folder:
        history_dir = Path(folder)
        for index, (pace, seed) in enumerate(EARLIER):
            events = virtual_build(plan, pace=pace, seed=seed, attributes=MODEL)
            write_journal(history_dir / f"earlier-{index}.jsonl", events)
        history = History.load(history_dir, MODEL["model.sha256"])
    pace, seed = CURRENT
    events = virtual_build(plan, pace=pace, seed=seed, attributes=MODEL)
    start = next(e.mono_ns for e in events if isinstance(e, BuildStarted))
    end = events[-1].mono_ns
    print(
        f"history: {len(history.builds)} earlier builds; this build took {(end - start) / 1e9:.1f}s"
    )
    print(f"{'at (s)':>7} {'truth':>7} {'progress':>9} {'history':>8}  boundary")
    state, tracker = BuildState(), BoundaryTracker()
    progress_errors: list[float] = []
    history_errors: list[float] = []
    closer = 0
    for event in events:
        state.apply(event)
        tracker.apply(event, state)
        if not isinstance(event, PhaseFinished) or state.outcome is not None:
            continue
        path, occurrence = tracker.last
        if len(path) > 3:
            continue  # the top of the tree is enough to read; deeper boundaries add noise
        truth = (end - event.mono_ns) / 1e9
        guess = estimate(state, tracker, event.mono_ns, history)
        shown = []
        for value, errors in (
            (guess.progress.seconds, progress_errors),
            (guess.history.seconds, history_errors),
        ):
            if value is None:
                shown.append("unknown")
            else:
                errors.append(abs(value - truth))
                shown.append(f"{value:.1f}")
        if guess.progress.seconds is not None and guess.history.seconds is not None:
            closer += abs(guess.history.seconds - truth) < abs(guess.progress.seconds - truth)
        at = (event.mono_ns - start) / 1e9
        print(
            f"{at:7.1f} {truth:7.1f} {shown[0]:>9} {shown[1]:>8}  {' > '.join(path)} #{occurrence}"
        )
    progress_mae = statistics.fmean(progress_errors) if progress_errors else float("nan")
    history_mae = statistics.fmean(history_errors) if history_errors else float("nan")
    both = min(len(progress_errors), len(history_errors))
    print(
        f"mean absolute error: history {history_mae:.1f}s ({len(history_errors)} estimates), "
        f"progress {progress_mae:.1f}s ({len(progress_errors)} estimates); "
        f"history closer at {closer} of {both} boundaries where both knew"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
