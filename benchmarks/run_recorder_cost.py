"""Cost of a callback inside a program observed by ``trt-otel run``, against ``trt-otel build``'s
worker.

Both record and nothing more: a tuple appended to a deque (the projections run in the trt-otel
process). The recorder of ``run`` also derives from the library's ``IProgressMonitor`` and
checks for the program's own monitor; it is measured with the real ``tensorrt_rtx`` base class
(where installed) and with a plain one, against ``RecordingMonitor``, the worker's monitor. Each
gets the same callback plan back to back from one thread (the simulator's driver); the figure is
the median over runs of the mean time per callback, minus the no-op monitor's.

The last line is the headline: the run's recorder against the build's worker.
"""

from __future__ import annotations

import functools
import statistics
import types
from collections.abc import Callable
from typing import Any

from trt_otel.builder.simulator import Driver, NoOpMonitor, generate_plan
from trt_otel.capture.bootstrap import _trt_otel_recorder as recorder
from trt_otel.capture.worker import RecordingMonitor

REPEATS = 7
PLAN = generate_plan(13, num_profiles=2) * 10


class _Flag:
    value = 0


class _PlainBase:
    def __init__(self) -> None:
        pass


def per_callback_ns(monitor: object) -> float:
    import time

    began = time.perf_counter_ns()
    Driver(speed=0).run(monitor, PLAN)  # type: ignore[arg-type]
    return (time.perf_counter_ns() - began) / len(PLAN)


def run_recorder(library: Any) -> object:
    sink = recorder.RemoteSink(lambda: None, "nowhere")  # type: ignore[arg-type,return-value]
    build = recorder.ForwardedBuild(sink, 1)
    return recorder.recorder_class(library)(build, None)


def main() -> None:
    libraries: dict[str, Any] = {"plain base": types.SimpleNamespace(IProgressMonitor=_PlainBase)}
    try:
        import tensorrt_rtx

        libraries["tensorrt_rtx base"] = tensorrt_rtx
    except ImportError:
        pass
    makers: dict[str, Callable[[], object]] = {
        "no-op": NoOpMonitor,
        "build's worker": lambda: RecordingMonitor(_Flag(), _Flag()),
    }
    for name, library in libraries.items():
        makers[f"run's recorder ({name})"] = functools.partial(run_recorder, library)
    results: dict[str, list[float]] = {name: [] for name in makers}
    for _ in range(REPEATS):
        for name, make in makers.items():
            results[name].append(per_callback_ns(make()))
    base = statistics.median(results["no-op"])
    print(f"{len(PLAN):,} callbacks per run, back to back, {REPEATS} runs; median per callback")
    own = {name: statistics.median(values) - base for name, values in results.items()}
    for name, values in results.items():
        print(f"  {name:32s} {statistics.median(values):7.0f} ns  own {own[name]:6.0f} ns")
    worker = own["build's worker"]
    ours = max(v for n, v in own.items() if n.startswith("run's"))
    print(
        f"headline: the run's recorder costs {ours / worker:.2f}x the build's worker per callback"
    )


if __name__ == "__main__":
    main()
