"""What `trt-otel build` adds to a real build's wall time: start-up, the worker's spawn and
imports, and the end, measured against a bare script that builds the same model with the same
library and a plain IProgressMonitor.

Paired runs in alternating order (a bare build, then `trt-otel build`, then the other way round),
each a fresh process, timed from its start to its exit. Prints each pair, the medians, the
median of the pairs' differences (the fixed cost every build pays) and the ratio. Needs
TensorRT-RTX (the dev extra); a small model, so the difference is not lost in the build's own
time.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trt_otel.builder.onnx_models import conv_net_bytes

SHAPES = "input:1x8x16x16,2x8x16x16,4x8x16x16"
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


def timed(command: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main(pairs: int = 5) -> int:
    folder = Path(tempfile.mkdtemp())
    model = folder / "conv.onnx"
    model.write_bytes(conv_net_bytes(8))
    bare = [sys.executable, "-c", BARE, str(model), str(folder / "bare.engine")]
    observed = [sys.executable, "-m", "trt_otel.app.cli", "build", str(model), "-o",
                str(folder / "observed.engine"), "--backend", "tensorrt-rtx", "--shapes", SHAPES,
                "--no-progress", "--no-gpu"]  # fmt: skip
    timed(bare), timed(observed)  # warm the file cache
    rows: list[tuple[float, float]] = []
    for pair in range(pairs):
        if pair % 2:
            observed_s, bare_s = timed(observed), timed(bare)
        else:
            bare_s, observed_s = timed(bare), timed(observed)
        rows.append((bare_s, observed_s))
        print(f"pair {pair + 1}: bare {bare_s:.2f} s, trt-otel build {observed_s:.2f} s")
    bare_median = statistics.median(b for b, _ in rows)
    observed_median = statistics.median(o for _, o in rows)
    extra = statistics.median(o - b for b, o in rows)
    print(f"medians: bare {bare_median:.2f} s, trt-otel build {observed_median:.2f} s")
    print(
        f"startup cost: trt-otel build adds {extra:.2f} s a build (median of {pairs} pairs), "
        f"{observed_median / bare_median:.2f}x the bare script's wall time"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
