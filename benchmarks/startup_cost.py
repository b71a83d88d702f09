"""What `trt-otel build` adds to a real build's wall time: start-up, the worker's spawn and
imports, and the end, measured against a bare script that builds the same model with the same
library and a plain IProgressMonitor.

Paired runs in alternating order (a bare build, then `trt-otel build`, then the other way round),
each a fresh process, timed from its start to its exit, with the CPU time it and its children
(the worker) used. Prints each pair, the medians, the median of the pairs' differences in wall
and CPU time (the fixed cost every build pays; on a shared machine the CPU time is the steadier
of the two), the ratio and the load average. Needs
TensorRT-RTX (the dev extra); a small model, so the difference is not lost in the build's own
time.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trt_otel.builder.onnx_models import CONV_SHAPES, conv_net_bytes

SHAPES = CONV_SHAPES
BARE = """
import sys, tensorrt_rtx as trt
class Monitor(trt.IProgressMonitor):
    def __init__(self):
        trt.IProgressMonitor.__init__(self)
    def phase_start(self, name, parent, steps): pass
    def step_complete(self, name, step): return True
    def phase_finish(self, name): pass
logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
network = builder.create_network(0)
assert trt.OnnxParser(network, logger).parse(open(sys.argv[1], "rb").read(), sys.argv[1])
config = builder.create_builder_config()
profile = builder.create_optimization_profile()
profile.set_shape("input", (1, 8, 16, 16), (2, 8, 16, 16), (4, 8, 16, 16))
config.add_optimization_profile(profile)
config.progress_monitor = Monitor()
engine = builder.build_serialized_network(network, config)
open(sys.argv[2], "wb").write(memoryview(engine))
"""


def timed(command: list[str]) -> tuple[float, float]:
    """The command's wall time and the CPU time (user and system) of it and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu


def main(pairs: int = 5) -> int:
    folder = Path(tempfile.mkdtemp())
    model = folder / "conv.onnx"
    model.write_bytes(conv_net_bytes(8))
    bare = [sys.executable, "-c", BARE, str(model), str(folder / "bare.engine")]
    observed = [sys.executable, "-m", "trt_otel.app.cli", "build", str(model), "-o",
                str(folder / "observed.engine"), "--backend", "tensorrt-rtx", "--shapes", SHAPES,
                "--no-progress", "--no-gpu"]  # fmt: skip
    timed(bare), timed(observed)  # warm the file cache
    rows: list[tuple[tuple[float, float], tuple[float, float]]] = []
    load = os.getloadavg()[0]
    for pair in range(pairs):
        if pair % 2:
            observed_s, bare_s = timed(observed), timed(bare)
        else:
            bare_s, observed_s = timed(bare), timed(observed)
        rows.append((bare_s, observed_s))
        print(
            f"pair {pair + 1}: bare {bare_s[0]:.2f} s ({bare_s[1]:.2f} s CPU), "
            f"trt-otel build {observed_s[0]:.2f} s ({observed_s[1]:.2f} s CPU)"
        )
    load = max(load, os.getloadavg()[0])
    medians = [[statistics.median(row[side][kind] for row in rows) for kind in (0, 1)]
               for side in (0, 1)]  # fmt: skip
    wall, cpu = (statistics.median(o[kind] - b[kind] for b, o in rows) for kind in (0, 1))
    print(
        f"medians: bare {medians[0][0]:.2f} s ({medians[0][1]:.2f} s CPU), "
        f"trt-otel build {medians[1][0]:.2f} s ({medians[1][1]:.2f} s CPU)"
    )
    print(
        f"startup cost: trt-otel build adds {wall:.2f} s wall and {cpu:.2f} s CPU a build "
        f"(medians of the differences of {pairs} pairs; load average up to {load:.1f}), "
        f"{medians[1][0] / medians[0][0]:.2f}x the bare script's wall time"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
