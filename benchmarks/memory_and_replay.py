"""Memory over a long build, and the speed of replaying a journal of a million events.

Memory: trt-otel in one process with every projection on (journal, console, spans to an
unreachable collector, /metrics, the HTTP view, the ETA) receives a build of a million steps
(phases of 1,000 steps, as tactic timing makes them); the resident set is read after 10
thousand, 100 thousand and a million steps. What the process keeps is bounded by design: the
log and the HTTP view keep the newest 100,000 events each, the rest lives in the journal on disk.
Twice, each in a fresh process: with 50 us of builder work between callbacks (thousands of
callbacks a second, far more than a real build makes), and back to back (a stress: the
followers cannot keep up, and their backlog is what grows).

Replay: that journal (a million events and more) is read back and folded into the build's state
and its spans, as ``trt-otel replay`` does.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import full_monitor

from trt_otel.core.journal import JournalWriter
from trt_otel.core.journal_reader import read_journal
from trt_otel.core.state import BuildState
from trt_otel.views.spans import SpanProjection

STEPS_PER_PHASE = 1_000
CHECKPOINTS = (10_000, 100_000, 1_000_000)


def resident_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def build(directory: Path, pace_s: float, label: str) -> Path:
    """A million steps into trt-otel with every projection on; prints memory at checkpoints.
    ``pace_s`` is the builder's work between two callbacks (0: back to back)."""
    from prometheus_server import free_port

    full = full_monitor(directory, free_port(), label)
    monitor = full.monitor
    monitor.start()
    monitor.phase_start("Building engine", None, CHECKPOINTS[-1] // STEPS_PER_PHASE)
    print(f"  before the build: resident set {resident_mib():.0f} MiB")
    steps = 0
    deepest = 0
    began = time.monotonic()
    for phase in range(CHECKPOINTS[-1] // STEPS_PER_PHASE):
        monitor.phase_start("Measuring tactic time", "Building engine", STEPS_PER_PHASE)
        for step in range(STEPS_PER_PHASE):
            if pace_s:
                time.sleep(pace_s)
            monitor.step_complete("Measuring tactic time", step)
        monitor.phase_finish("Measuring tactic time")
        monitor.step_complete("Building engine", phase)
        steps += STEPS_PER_PHASE + 1
        deepest = max(deepest, *(w.health().queued for w in monitor.log.workers))
        if any(steps - STEPS_PER_PHASE - 1 < c <= steps for c in CHECKPOINTS):
            monitor.log.flush(60)
            gc.collect()
            live = sys.getallocatedblocks() / 1e6
            took = time.monotonic() - began
            print(f"  after {steps:>9,} steps: resident set {resident_mib():6.0f} MiB, "
                  f"live objects {live:5.2f} M, deepest follower queue so far "
                  f"{deepest:,} events ({steps / took:,.0f} steps/s)")  # fmt: skip
    monitor.phase_finish("Building engine")
    full.close()
    return directory / f"{label}.jsonl"


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        # Each set-up in a process of its own, so one's memory does not hide the other's.
        if len(sys.argv) > 1 and sys.argv[1] != "replay":
            pace = float(sys.argv[1])
            build(directory, pace, "million")
            return 0
        if len(sys.argv) == 1:  # "replay" alone skips the memory runs
            for pace, words in ((50e-6, "with 50 us of builder work between callbacks"),
                                (0.0, "back to back")):  # fmt: skip
                print(f"a million steps, {words}:", flush=True)
                subprocess.run([sys.executable, __file__, str(pace)], check=True)
        replay(directory)
    return 0


def replay(directory: Path) -> None:
    """Read a journal of a million steps back and fold it, as ``trt-otel replay`` does; then
    write its events again, as the journal follower does."""
    journal = build_journal(directory)
    size = journal.stat().st_size / 2**20
    began = time.perf_counter()
    events = read_journal(journal).events
    read_s = time.perf_counter() - began
    state, projection = BuildState(), SpanProjection()
    began = time.perf_counter()
    spans = 0
    for event in events:
        state.apply(event)
        spans += len(projection.apply(event))
    fold_s = time.perf_counter() - began
    count = len(events)
    writer = JournalWriter(directory / "again.jsonl")
    began = time.perf_counter()
    for start in range(0, count, 1_000):  # the follower's batches are of this order
        writer.handle(events[start : start + 1_000])
    writer.close()
    write_s = time.perf_counter() - began
    print(
        f"replay of a journal of {count:,} events ({size:.0f} MiB): read {read_s:.1f}s, "
        f"state and {spans:,} spans {fold_s:.1f}s; written again in {write_s:.1f}s "
        f"({count / write_s:,.0f} events/s)"
    )
    print(f"headline: replay throughput = {count / (read_s + fold_s):,.0f} events/s")


def build_journal(directory: Path) -> Path:
    """A journal of a million steps, written by a monitor with only the journal attached."""
    from trt_otel import BuildMonitor

    path = directory / "replay.jsonl"
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(path), capacity=2_000_000)
    monitor.start()
    monitor.phase_start("Building engine", None, CHECKPOINTS[-1] // STEPS_PER_PHASE)
    for phase in range(CHECKPOINTS[-1] // STEPS_PER_PHASE):
        monitor.phase_start("Measuring tactic time", "Building engine", STEPS_PER_PHASE)
        for step in range(STEPS_PER_PHASE):
            monitor.step_complete("Measuring tactic time", step)
        monitor.phase_finish("Measuring tactic time")
        monitor.step_complete("Building engine", phase)
    monitor.phase_finish("Building engine")
    monitor.end()
    monitor.close(120)
    return path


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.exit(main())
