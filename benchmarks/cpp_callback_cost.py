"""Cost of a callback into the C++ monitor (cpp/include/trt_otel/progress_monitor.h), against a
minimal C++ mutex-and-map monitor, in one run.

Compiles ``benchmarks/cpp_callback_cost.cpp`` with ``g++ -O2`` against NVIDIA's TensorRT headers
(``../shared/third_party``) and CUDA's (the dev extra's wheels), and gives it the callbacks of a
generated build (13 layers, two profiles, 40 times over: ``callback_cost.py``'s plan, four
times, so that a run lasts milliseconds rather than scheduler ticks), from
one builder thread and then from four at once, back to back. Each monitor is called through
``nvinfer1::IProgressMonitor``; trt-otel's writes its journal to a file on a thread of its own
during the run. The figure is the median over runs of the mean time per callback; "own cost"
subtracts the no-op monitor's (the driver's own cost).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from trt_otel.builder.simulator import generate_plan

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 11
TARGET = 3.0
MONITORS = ("no-op", "mutex-and-map", "trt-otel")


def write_plan(path: Path) -> int:
    plan = generate_plan(13, num_profiles=2) * 40
    with open(path, "w", encoding="utf-8") as handle:
        for callback in plan:
            record: dict[str, object] = {"cb": callback.kind, "phase_name": callback.name}
            if callback.kind == "phase_start":
                record.update(parent_phase=callback.parent, num_steps=callback.num_steps)
            elif callback.kind == "step_complete":
                record["step"] = callback.step
            handle.write(json.dumps(record) + "\n")
    return len(plan)


def measure(binary: Path, plan: Path, directory: Path, threads: int) -> dict[str, list[float]]:
    done = subprocess.run(
        [str(binary), str(plan), str(directory), str(REPEATS), str(threads)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    results: dict[str, list[float]] = {name: [] for name in MONITORS}
    for line in done.stdout.splitlines():
        name, _, value = line.rpartition(" ")
        results[name].append(float(value))
    return results


def report(results: dict[str, list[float]], threads: int) -> float:
    medians = {name: statistics.median(values) for name, values in results.items()}
    base = medians["no-op"]
    minimal = medians["mutex-and-map"] - base
    print(f"  {threads} thread(s) {'per callback':>13s} {'own cost':>9s} {'ratio':>7s}")
    for name, value in medians.items():
        own = value - base
        ratio = f"{own / minimal:6.1f}x" if name != "no-op" else ""
        print(f"  {name:14s} {value:10.1f} ns {own:6.1f} ns {ratio:>7s}")
    spread = ", ".join(f"{n} {min(v):.0f}..{max(v):.0f}" for n, v in results.items())
    print(f"  spread (min..max ns): {spread}")
    return (medians["trt-otel"] - base) / minimal


def main() -> int:
    from cpp_toolchain import TENSORRT_INCLUDE, cuda_include

    include = cuda_include()
    if shutil.which("g++") is None or include is None or not TENSORRT_INCLUDE.is_dir():
        print("C++ callback cost: skipped (needs g++, ../shared/third_party and the dev extra)")
        return 0
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        binary = directory / "cpp_callback_cost"
        subprocess.run(
            [
                "g++",
                "-std=c++17",
                "-O2",
                "-DNDEBUG",
                "-isystem",
                str(TENSORRT_INCLUDE),
                "-isystem",
                str(include),
                f"-I{ROOT / 'cpp' / 'include'}",
                str(ROOT / "benchmarks" / "cpp_callback_cost.cpp"),
                "-o",
                str(binary),
                "-pthread",
            ],
            check=True,
            timeout=600,
        )
        plan = directory / "plan.jsonl"
        count = write_plan(plan)
        print(
            f"C++ monitor: {count:,} callbacks per thread and run, back to back, {REPEATS} runs; "
            "median time per callback"
        )
        ratios = {
            threads: report(measure(binary, plan, directory, threads), threads)
            for threads in (1, 4)
        }
    print(
        f"C++ headline: trt-otel C++ monitor / mutex-and-map monitor = {ratios[1]:.1f}x "
        f"(1 thread), {ratios[4]:.1f}x (4 threads); target within {TARGET:.0f}x"
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    sys.exit(main())
