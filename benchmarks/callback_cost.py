"""Cost of TensorRT's callbacks into trt-otel, against simpler monitors, in one run.

Each monitor receives the same callback plan (a generated build, repeated) from one thread; the
figure is the mean time per callback. The baselines: a no-op monitor, and the minimal
lock-and-dict monitor of NVIDIA's Python sample (its state update, without rendering).
trt-otel runs with a journal, the plain-lines console and a served Prometheus endpoint.
"""

from __future__ import annotations

import io
import statistics
import tempfile
import threading
import time
from pathlib import Path

from trt_otel import BuildMonitor, JournalWriter
from trt_otel.console import PlainLines
from trt_otel.simulator import Callback, Driver, NoOpMonitor, generate_plan
from trt_otel.sinks.prometheus import MetricsServer

REPEATS = 5


class LockAndDictMonitor:
    """The state update of NVIDIA's sample monitor: a lock and a dict of active phases."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, dict[str, object]] = {}

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        with self._lock:
            self._active[phase_name] = {"parent": parent_phase, "steps": num_steps, "step": 0}

    def step_complete(self, phase_name: str, step: int) -> bool:
        with self._lock:
            self._active[phase_name]["step"] = step
        return True

    def phase_finish(self, phase_name: str) -> None:
        with self._lock:
            del self._active[phase_name]


def time_per_callback_ns(monitor: object, plan: list[Callback]) -> float:
    driver = Driver(speed=0)
    began = time.perf_counter_ns()
    driver.run(monitor, plan)  # type: ignore[arg-type]
    return (time.perf_counter_ns() - began) / len(plan)


def trt_otel_monitor(directory: Path, index: int) -> tuple[BuildMonitor, MetricsServer]:
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(directory / f"bench-{index}.jsonl"), capacity=1_000_000)
    monitor.log.follow(PlainLines(io.StringIO()))
    return monitor, MetricsServer(monitor, 0)


def main() -> None:
    plan = generate_plan(13, num_profiles=2) * 10
    results: dict[str, list[float]] = {"no-op": [], "lock-and-dict": [], "trt-otel": []}
    with tempfile.TemporaryDirectory() as directory:
        for index in range(REPEATS):
            results["no-op"].append(time_per_callback_ns(NoOpMonitor(), plan))
            results["lock-and-dict"].append(time_per_callback_ns(LockAndDictMonitor(), plan))
            monitor, server = trt_otel_monitor(Path(directory), index)
            results["trt-otel"].append(time_per_callback_ns(monitor, plan))
            monitor.end()
            monitor.close(30)
            server.close()
    print(f"{len(plan):,} callbacks per run, {REPEATS} runs, median time per callback")
    print("(driver overhead included in every figure)")
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(f"  {name:14s} {value / 1000:8.2f} us")
    added = medians["trt-otel"] - medians["no-op"]
    minimal = medians["lock-and-dict"] - medians["no-op"]
    print(f"  trt-otel's own cost per callback: {added / 1000:.2f} us")
    print(f"headline: trt-otel / lock-and-dict monitor cost ratio = {added / minimal:.2f}x")


if __name__ == "__main__":
    main()
