"""Wall time of a real C++ engine build with trt-otel's C++ monitor attached, against the same
application without it (not in ``make bench``: a minute of real builds).

Builds ``cpp/examples/build_engine`` with CMake (``-O2``) against the TensorRT-RTX wheel in this
environment and NVIDIA's headers beside the project, then builds real engines on the CPU from
two generated models: the real-builder tests' conv net (8 layers, ~100 callbacks in a build of a
fraction of a second: the monitor's share at its largest) and a 300-block residual net (a few
seconds, ~1,000 callbacks, most of the time one silent step). Each pair runs the application
once with the monitor (a journal on disk, a cancel file it polls for, the default 100 ms poll)
and once with ``--no-monitor``, in alternating order; the figure is the median of the pairs'
ratios, beside the medians of both and the fastest run of each. Wall time is the whole
process, start to exit; the CPU time (user and system, every thread of the process) is printed
too: it moves less than the wall time when other work shares the machine. ``--binary`` and
``--models`` time a build_engine and models made elsewhere (a machine with neither CMake nor
onnx: only this file, ``LD_LIBRARY_PATH`` to the libraries, and Python's standard library).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trt_otel.builder.onnx_models import CONV_SHAPES, RESIDUAL_SHAPES

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"conv": CONV_SHAPES, "residual": RESIDUAL_SHAPES}


def build_example(directory: Path, include: Path) -> Path:
    build = directory / "build"
    for step in (
        ["cmake", "-S", str(ROOT / "cpp" / "examples"), "-B", str(build),
         "-DCMAKE_BUILD_TYPE=Release", f"-DTensorRT_PYTHON={sys.executable}",
         f"-DTensorRT_INCLUDE_DIR={include}"],
        ["cmake", "--build", str(build)],
    ):  # fmt: skip
        subprocess.run(step, check=True, capture_output=True, timeout=600)
    return build / "build_engine"


def timed(command: list[str]) -> tuple[float, float]:
    """The command's wall time and its CPU time (user and system, all its threads), seconds."""
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - began
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command)
    return wall, usage.ru_utime + usage.ru_stime


def summary(label: str, values: list[float], unit: str = "s") -> str:
    listed = ", ".join(f"{v:.3f}" for v in values)
    return f"    {label:22s} median {statistics.median(values):6.3f} {unit}  ({listed})"


def measure(binary: Path, model: Path, shapes: str, directory: Path, pairs: int) -> float:
    plain_command = [str(binary), str(model), "--shapes", shapes, "--no-monitor"]
    monitored_command = [str(binary), str(model), "--shapes", shapes,
                         "--journal", str(directory / "build.jsonl"),
                         "--cancel-file", str(directory / "stop")]  # fmt: skip
    timed(plain_command)  # warm the page cache: the libraries are 220 MB
    plain: list[tuple[float, float]] = []
    monitored: list[tuple[float, float]] = []
    for index in range(pairs):
        if index % 2 == 0:
            monitored.append(timed(monitored_command))
            plain.append(timed(plain_command))
        else:
            plain.append(timed(plain_command))
            monitored.append(timed(monitored_command))
    ratios = [m[0] / p[0] for m, p in zip(monitored, plain, strict=True)]
    cpu_ratios = [m[1] / p[1] for m, p in zip(monitored, plain, strict=True)]
    events = len((directory / "build.jsonl").read_bytes().splitlines()) - 1
    print(f"  {model.stem}: {events:,} events per build, {pairs} pairs")
    print(summary("wall, without monitor", [p[0] for p in plain]))
    print(summary("wall, with monitor", [m[0] for m in monitored]))
    print(summary("wall ratio (per pair)", ratios, "x"))
    print(summary("CPU, without monitor", [p[1] for p in plain]))
    print(summary("CPU, with monitor", [m[1] for m in monitored]))
    print(summary("CPU ratio (per pair)", cpu_ratios, "x"))
    fastest = (min(p[0] for p in plain), min(m[0] for m in monitored))
    print(f"    fastest run: {fastest[0]:.3f} s without, {fastest[1]:.3f} s with the monitor "
          f"({fastest[1] / fastest[0]:.3f}x)")  # fmt: skip
    return statistics.median(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="paired runs per model (5)")
    parser.add_argument("--binary", type=Path, help="a build_engine built already (no CMake)")
    parser.add_argument(
        "--models", type=Path, help="a folder holding conv.onnx and residual.onnx (not generated)"
    )
    arguments = parser.parse_args()
    if arguments.pairs < 1:
        parser.error("--pairs must be 1 or more")
    if arguments.binary is not None and not os.access(arguments.binary, os.X_OK):
        parser.error(f"--binary {arguments.binary} is not an executable file")
    if arguments.models is not None and not all(
        (arguments.models / f"{name}.onnx").is_file() for name in SHAPES
    ):
        parser.error(f"--models {arguments.models} needs conv.onnx and residual.onnx")

    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        binary = arguments.binary
        if binary is None:
            from cpp_toolchain import TENSORRT_INCLUDE, cuda_include, rtx_library_dir

            if shutil.which("cmake") is None or shutil.which("g++") is None:
                print("C++ build wall time: skipped (needs cmake and g++)")
                return 0
            if cuda_include() is None or not TENSORRT_INCLUDE.is_dir() or rtx_library_dir() is None:
                print("C++ build wall time: skipped (needs NVIDIA's headers and the dev extra)")
                return 0
            binary = build_example(directory, TENSORRT_INCLUDE)
        if arguments.models is None:
            from trt_otel.builder.onnx_models import conv_net_bytes, residual_net_bytes

            (directory / "conv.onnx").write_bytes(conv_net_bytes(8))
            (directory / "residual.onnx").write_bytes(residual_net_bytes(300))
        models = arguments.models or directory
        print(
            "A real TensorRT-RTX build by cpp/examples/build_engine, with and without the "
            f"monitor; whole-process wall time, {arguments.pairs} pairs, alternating order "
            f"({os.cpu_count()} CPUs)"
        )
        ratios = {
            name: measure(binary, models / f"{name}.onnx", shapes, directory, arguments.pairs)
            for name, shapes in SHAPES.items()
        }
    print(
        f"C++ build headline: with the monitor / without = {ratios['conv']:.3f}x (conv, "
        f"~0.1 s builds), {ratios['residual']:.3f}x (300-block residual, seconds)"
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    sys.exit(main())
