"""Cost of TensorRT's callbacks into trt-otel, against simpler monitors, in one run.

Each monitor receives the same callback plan (a generated build, repeated) from one thread, back
to back (no builder work in between: the worst case for contention with background threads); the
figure is the median over runs of the mean time per callback, minus the no-op monitor's (the
driver's own cost). The monitors:

- no-op; the lock-and-dict state update of NVIDIA's sample; NVIDIA's sample as it ships,
  redrawing its progress bars on every step;
- trt-otel as ``trt-otel build`` runs it: the monitor in the build's worker process, its events
  piped to the supervising process, where every projection runs (journal, console, spans to an
  unreachable collector, /metrics, the HTTP view, the ETA);
- trt-otel in one process with every projection on (a library user attaching everything):
  while the callbacks run, and until every follower has handled them ("drained": the whole
  work of every projection per callback, whichever thread did it);
- the followers' work alone: CPU time of every follower's ``handle`` on the recorded events, in
  one thread (the steadiest of these figures on a loaded machine).

``--in-process`` measures only the baselines and the in-process figures.

The last line is the headline: trt-otel as the command runs it, against the minimal monitor.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import LockAndDictMonitor, RenderingSampleMonitor, full_monitor

from trt_otel import BuildMonitor
from trt_otel.builder.simulator import Callback, Driver, NoOpMonitor, generate_plan
from trt_otel.capture.supervisor import run_isolated

REPEATS = 5
PLAN = generate_plan(13, num_profiles=2) * 40


def time_per_callback_ns(monitor: object, plan: list[Callback]) -> float:
    driver = Driver(speed=0)
    began = time.perf_counter_ns()
    driver.run(monitor, plan)  # type: ignore[arg-type]
    return (time.perf_counter_ns() - began) / len(plan)


def in_worker(monitor: BuildMonitor) -> float:
    """Runs in the build's worker process, as a build does."""
    return time_per_callback_ns(monitor, PLAN)


def as_the_command_runs_it(directory: Path, dead_port: int, index: int) -> float:
    full = full_monitor(directory, dead_port, f"worker-{index}", supervising=True)
    full.monitor.start()
    result = run_isolated(in_worker, monitor=full.monitor)
    full.close()
    assert result.returned, result
    return float(result.value)


def in_one_process(directory: Path, dead_port: int, index: int) -> tuple[float, float]:
    """Per callback: while the callbacks run, and until every follower has handled them too
    (the whole work of every projection, whatever thread did it)."""
    full = full_monitor(directory, dead_port, f"inproc-{index}")
    full.monitor.start()
    began = time.perf_counter_ns()
    figure = time_per_callback_ns(full.monitor, PLAN)
    assert full.monitor.log.flush(60.0)
    drained = (time.perf_counter_ns() - began) / len(PLAN)
    full.close()
    return figure, drained


def followers_work(directory: Path, dead_port: int, index: int) -> float:
    """CPU time per callback of every follower's ``handle`` (journal, projections, HTTP feed),
    called on the recorded events in this thread: the projections' whole work, free of the
    thread switches and the load of other processes that blur the figures above."""
    recorder = BuildMonitor(attributes={"model.path": "bench.onnx"})
    recorder.start()
    Driver(speed=0).run(recorder, PLAN)
    recorder.end()
    events = recorder.log.recent()
    full = full_monitor(directory, dead_port, f"work-{index}")
    followers = [worker.follower for worker in full.monitor.log.workers]
    began = time.process_time_ns()
    for follower in followers:
        follower.handle(events)
    work = (time.process_time_ns() - began) / len(PLAN)
    full.close()
    return work


def main(in_process_only: bool = False) -> int:
    from prometheus_server import free_port

    dead_port = free_port()
    names = (
        "no-op",
        "lock-and-dict",
        "NVIDIA sample",
        "trt-otel (command)",
        "trt-otel (1 proc)",
        "trt-otel (1 proc, drained)",
        "followers' work (CPU)",
    )
    results: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        for index in range(REPEATS):
            results["no-op"].append(time_per_callback_ns(NoOpMonitor(), PLAN))
            results["lock-and-dict"].append(time_per_callback_ns(LockAndDictMonitor(), PLAN))
            if not in_process_only:
                sample = RenderingSampleMonitor()
                results["NVIDIA sample"].append(time_per_callback_ns(sample, PLAN))
                sample.close()
                results["trt-otel (command)"].append(
                    as_the_command_runs_it(directory, dead_port, index)
                )
            results["followers' work (CPU)"].append(followers_work(directory, dead_port, index))
            during, drained = in_one_process(directory, dead_port, index)
            results["trt-otel (1 proc)"].append(during)
            results["trt-otel (1 proc, drained)"].append(drained)
    print(
        f"{len(PLAN):,} callbacks per run, back to back, {REPEATS} runs; median time per callback"
    )
    results = {name: values for name, values in results.items() if values}
    medians = {name: statistics.median(values) for name, values in results.items()}
    base = medians["no-op"]
    minimal = medians["lock-and-dict"] - base
    print(f"  {'monitor':26s} {'per callback':>12s} {'own cost':>9s} {'ratio':>7s}")
    for name, value in medians.items():
        own = value if name == "followers' work (CPU)" else value - base
        ratio = f"{own / minimal:6.1f}x" if name != "no-op" else ""
        print(f"  {name:26s} {value / 1000:9.2f} us {own / 1000:6.2f} us {ratio:>7s}")
    spread = {n: (min(v) / 1000, max(v) / 1000) for n, v in results.items()}
    print(
        "  spread (min..max us): "
        + ", ".join(f"{n} {a:.2f}..{b:.2f}" for n, (a, b) in spread.items())
    )
    if in_process_only:
        return 0
    headline = (medians["trt-otel (command)"] - base) / minimal
    print(f"headline: trt-otel as the command runs it / lock-and-dict monitor = {headline:.1f}x")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.exit(main(in_process_only="--in-process" in sys.argv[1:]))
