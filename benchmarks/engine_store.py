"""What the engine store saves a nightly pipeline of unchanged models, and what it costs one that
changed: real TensorRT-RTX builds (CPU-only here) of a few models of three families (a conv net,
a deep residual net with its silent window, and a wider residual net), as `trt-otel build` runs
them.

Three nights, each a fresh process per model, timed from start to exit:

1. **without the store**: every model built, as pipelines do today;
2. **the first night with it**: every model built and stored (a miss each: what storing costs);
3. **an unchanged night**: every model served from the store.

Then one model with a changed builder option (a miss, explained). Prints each build, the
totals per night, the ratio of the unchanged night to the night without the store, and what a
pipeline of N such models saves a night. Needs TensorRT-RTX (the dev extra).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trt_otel.builder.onnx_models import (
    CONV_SHAPES,
    RESIDUAL_SHAPES,
    conv_net_bytes,
    residual_net_bytes,
)

CONV, RESIDUAL = CONV_SHAPES, RESIDUAL_SHAPES
MODELS: tuple[tuple[str, Callable[[], bytes], str], ...] = (
    ("conv-8", lambda: conv_net_bytes(8), CONV),
    ("conv-48", lambda: conv_net_bytes(48), CONV),
    ("residual-200", lambda: residual_net_bytes(200), RESIDUAL),
    ("residual-600", lambda: residual_net_bytes(600), RESIDUAL),
)


def build(model: Path, shapes: str, engine: Path, *options: str) -> tuple[float, str]:
    """One `trt-otel build`: its wall time, and its store line."""
    command = [sys.executable, "-m", "trt_otel.app.cli", "build", str(model), "-o", str(engine),
               "--backend", "tensorrt-rtx", "--shapes", shapes, "--no-progress", "--no-gpu",
               *options]  # fmt: skip
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - began
    said = [line for line in done.stderr.splitlines() if line.startswith(("store:", "rebuild"))]
    return wall, said[0] if said else ""


def main() -> int:
    folder = Path(tempfile.mkdtemp())
    store = folder / "store"
    models = []
    for name, make, shapes in MODELS:
        path = folder / f"{name}.onnx"
        path.write_bytes(make())
        models.append((name, path, shapes))
    build(models[0][1], models[0][2], folder / "warm.engine")  # the file cache
    nights: dict[str, float] = {}
    for night, options in (
        ("without the store", ()),
        ("first night with it (built, stored)", ("--engine-store", str(store))),
        ("unchanged night (served)", ("--engine-store", str(store))),
    ):
        total = 0.0
        for name, path, shapes in models:
            wall, said = build(path, shapes, folder / f"{name}.engine", *options)
            total += wall
            print(f"  {night}: {name}: {wall:.2f} s  {said}")
        nights[night] = total
        print(f"{night}: {total:.2f} s for {len(models)} models")
    name, path, shapes = models[-1]
    wall, said = build(path, shapes, folder / "changed.engine", "--engine-store", str(store),
                       "--builder-optimization-level", "1")  # fmt: skip
    print(f"a changed option ({name}): {wall:.2f} s  {said}")
    plain, stored, served = nights.values()
    print(
        f"engine store: an unchanged night takes {served:.2f} s against {plain:.2f} s without "
        f"the store ({served / plain:.3f}x, {served / len(models):.2f} s a model); storing "
        f"costs {stored - plain:+.2f} s on the first night ({stored / plain:.3f}x); a pipeline "
        f"of 100 such models saves {(plain - served) / len(models) * 100 / 60:.1f} min a night "
        f"here (load average {os.getloadavg()[0]:.1f})"
    )
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
