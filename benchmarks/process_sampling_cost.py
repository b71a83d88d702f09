"""What sampling the builder's process costs, in CPU.

Two measurements in one run:

- the sampler's own CPU per sample: ``ProcessReader.read`` alone, and
  ``ProcessSampler.sample_once`` (the reading, the host's available memory, the ``process``
  event appended to an event log), each timed with ``time.thread_time`` over a few hundred samples
  of a real child process that keeps one thread busy and holds 15 more, as a builder's pool does;
- the whole ``trt-otel demo --speed 0 --silence 20s --no-gpu --no-progress`` command's CPU (user
  + system of its whole process tree, ``getrusage(RUSAGE_CHILDREN)`` before and after
  ``subprocess.run``), sampling every 1 s (the default) against every hour (one sample only), in
  pairs whose order alternates; the extra CPU is given as a percentage of one core over the run's
  wall time. The goal: under 1% of one core at 1 s.

``python benchmarks/process_sampling_cost.py [quick]``: quick runs one pair and fewer samples.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.process import ProcessReader, ProcessSampler

QUICK = "quick" in sys.argv[1:]
SAMPLES = 100 if QUICK else 400
PAIRS = 1 if QUICK else 4
SILENCE = "20s"
INTERVALS = ("1s", "1h")
GOAL_PERCENT = 1.0

# One thread spinning, fifteen waiting: the sampler reads every thread's times each sample.
BUSY_CHILD = """
import threading, time
stop = threading.Event()
for _ in range(15):
    threading.Thread(target=stop.wait, daemon=True).start()
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    sum(range(1000))
"""


def per_sample_cpu_ms(samples: int) -> tuple[float, float, float, int]:
    """CPU ms per ``ProcessReader.read`` and per ``ProcessSampler.sample_once``, wall ms per
    ``sample_once``, and the child's thread count as sampled."""
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])
    try:
        time.sleep(0.5)  # its threads started
        reader = ProcessReader(child.pid)
        reader.read(time.monotonic())  # the first reading sets the CPU baseline
        started = time.thread_time()
        for _ in range(samples):
            reader.read(time.monotonic())
        read_ms = (time.thread_time() - started) / samples * 1e3

        sampler = ProcessSampler(BuildMonitor(), interval_s=1.0, pid=child.pid)
        sampler.sample_once()
        started, wall = time.thread_time(), time.perf_counter()
        threads = 0
        for _ in range(samples):
            event = sampler.sample_once()
            assert event is not None and event.status != "gone", event
            threads = event.threads or 0
        once_ms = (time.thread_time() - started) / samples * 1e3
        wall_ms = (time.perf_counter() - wall) / samples * 1e3
        assert sampler.errors == 0
        return read_ms, once_ms, wall_ms, threads
    finally:
        child.kill()
        child.wait()


@dataclass
class Run:
    interval: str
    cpu_s: float
    wall_s: float


def demo_run(interval: str) -> Run:
    command = [
        sys.executable, "-m", "trt_otel.app.cli", "demo",
        "--speed", "0", "--silence", SILENCE, "--no-gpu", "--no-progress",
        "--sample-interval", interval,
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall_s = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(interval, cpu_s, wall_s)


def main() -> None:
    read_ms, once_ms, wall_ms, threads = per_sample_cpu_ms(SAMPLES)
    print(f"per sample, {SAMPLES} samples of a busy child with {threads} threads:")
    print(f"  ProcessReader.read            {read_ms:.3f} ms CPU")
    print(f"  ProcessSampler.sample_once    {once_ms:.3f} ms CPU ({wall_ms:.3f} ms wall)")
    print(f"  at one sample a second: {once_ms / 1e3 * 100:.3f}% of one core")
    print()
    print(f"trt-otel demo --speed 0 --silence {SILENCE} --no-gpu --no-progress (whole tree):")
    extras: list[float] = []
    for pair in range(PAIRS):
        order = INTERVALS if pair % 2 == 0 else INTERVALS[::-1]
        runs = {interval: demo_run(interval) for interval in order}
        every_second, once = runs["1s"], runs["1h"]
        extra_s = every_second.cpu_s - once.cpu_s
        extra_percent = extra_s / every_second.wall_s * 100
        extras.append(extra_percent)
        samples = max(1, int(every_second.wall_s) - 1)  # the 1h run takes one
        print(
            f"  pair {pair + 1}: --sample-interval 1s {every_second.cpu_s:.3f} s CPU "
            f"in {every_second.wall_s:.1f} s; 1h {once.cpu_s:.3f} s CPU in {once.wall_s:.1f} s; "
            f"extra {extra_s * 1e3:+.0f} ms (about {extra_s / samples * 1e3:+.1f} ms for each of "
            f"{samples} more samples) = {extra_percent:+.2f}% of one core"
        )
    median = statistics.median(extras)
    # The command's CPU varies by more than the sampling costs under a loaded machine: the
    # pairs' spread says how far the whole-tree figure can be read.
    verdict = "under" if median < GOAL_PERCENT else "OVER"
    print(
        f"sampling every 1s: {once_ms:.2f} ms CPU a sample = {once_ms / 10:.3f}% of one core "
        f"({verdict} the {GOAL_PERCENT:.0f}% goal: {median:+.2f}% median over {PAIRS} pairs "
        f"of the whole demo, pairs {min(extras):+.2f}% to {max(extras):+.2f}%)"
    )


if __name__ == "__main__":
    main()
