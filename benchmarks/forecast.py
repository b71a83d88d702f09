"""How good the forecast before a build is: real TensorRT-RTX builds (CPU-only here) of three
families of models (a conv net, a deep residual net, a wider residual net), each at five sizes
built smallest first, then two of them again, as `trt-otel build --history DIR` runs them, all
sharing one history folder.

Each family's model keeps its file name across sizes (an edited model), so a size never built
is forecast from the family's earlier builds scaled by size, and a repeat from its own earlier
build. For every build with a forecast it prints the forecast, what the build took and the
error; then the median absolute error of the forecasts made after three earlier builds of the
family (goal: under 25%), by basis, and how often the memory forecast would have refused a
build that then fit (a host with 10% more memory free than the build's real peak, refused
where the forecast peak is above that). Needs TensorRT-RTX (the dev extra).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from trt_otel import read_journal
from trt_otel.builder.onnx_models import CONV_SHAPES, conv_net_bytes, residual_net_bytes
from trt_otel.core.eta import past_build
from trt_otel.core.events import BuildStarted
from trt_otel.core.forecast import Forecast

GOAL = 0.25
"""The median absolute error after three earlier builds of a family."""
HEADROOM = 1.10
"""The host of the memory check: this much of the build's real peak free."""


def wide(channels: int) -> str:
    """The residual nets' shapes at ``channels`` channels."""
    return "input:" + ",".join(f"{n}x{channels}x32x32" for n in (1, 4, 8))


FAMILIES: tuple[tuple[str, Callable[[int], bytes], str, tuple[int, ...]], ...] = (
    ("conv", conv_net_bytes, CONV_SHAPES, (8, 16, 32, 48, 64)),
    ("residual", residual_net_bytes, wide(8), (50, 100, 200, 300, 400)),
    ("wide", partial(residual_net_bytes, channels=16), wide(16), (20, 40, 80, 120, 160)),
)
SAMPLE_INTERVAL_S = 0.05
REPEATS = (2, 4)
"""The sizes (by index) built a second time: forecast from their own first build."""


@dataclass(frozen=True)
class Result:
    family: str
    size: int
    earlier: int
    """Earlier builds of the family when this one started."""
    forecast: Forecast | None
    took_s: float
    peak_bytes: int | None


def build(folder: Path, history: Path, family: str, *, model: bytes, shapes: str, n: int) -> Path:
    path = folder / f"{family}.onnx"  # one name for the family's every size
    path.write_bytes(model)
    journal = history / f"{family}-{n}-{len(list(history.iterdir()))}.jsonl"
    command = [sys.executable, "-m", "trt_otel.app.cli", "build", str(path),
               "-o", str(folder / "engine"), "--backend", "tensorrt-rtx", "--shapes", shapes,
               "--no-progress", "--no-gpu", "--history", str(history),
               # Sampled often enough that a build of a second has its real peak.
               "--sample-interval", f"{SAMPLE_INTERVAL_S}s",
               "--journal", str(journal)]  # fmt: skip
    subprocess.run(command, capture_output=True, text=True, check=True)
    return journal


def result_of(journal: Path, family: str, size: int, earlier: int) -> Result:
    events = read_journal(journal).events
    (start,) = [e for e in events if isinstance(e, BuildStarted)]
    done = past_build(events, journal.name)
    assert done is not None, f"{journal} did not succeed"
    return Result(
        family, size, earlier, Forecast.of(start.attributes), done.total_s, done.peak_rss_bytes
    )


def main() -> int:
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="trt-otel-forecast-") as scratch:
        folder = Path(scratch)
        history = folder / "history"
        history.mkdir()
        for family, make, shapes, sizes in FAMILIES:
            order = [*range(len(sizes)), *REPEATS]
            for earlier, index in enumerate(order):
                size = sizes[index]
                journal = build(folder, history, family, model=make(size), shapes=shapes, n=size)
                result = result_of(journal, family, size, earlier)
                results.append(result)
                print(describe(result), flush=True)
    judged = [r for r in results if r.forecast is not None and r.earlier >= 3]
    print()
    for basis in ("scaled", "history"):
        errors = [abs(r.forecast.error(r.took_s)) for r in judged if r.forecast.basis == basis]  # type: ignore[union-attr]
        if errors:
            print(f"after 3 earlier builds, {basis}: median absolute error "
                  f"{statistics.median(errors):.0%} over {len(errors)} builds")  # fmt: skip
    errors = [abs(r.forecast.error(r.took_s)) for r in judged]  # type: ignore[union-attr]
    median = statistics.median(errors)
    verdict = "met" if median < GOAL else "over its goal"
    print(f"after 3 earlier builds, all: median absolute error {median:.0%} "
          f"(goal < {GOAL:.0%}: {verdict})")  # fmt: skip
    peaks = [r for r in results if r.forecast is not None and r.forecast.peak_rss_bytes]
    refused = [
        r
        for r in peaks
        if r.peak_bytes is not None
        and r.forecast is not None
        and (r.forecast.peak_rss_bytes or 0) > r.peak_bytes * HEADROOM
    ]
    print(f"memory: {len(refused)} of {len(peaks)} forecasts would have refused a build that fit "
          f"(a host with {HEADROOM - 1:.0%} more free than its real peak)")  # fmt: skip
    return 0


def describe(result: Result) -> str:
    head = f"{result.family}-{result.size}: took {result.took_s:.2f} s"
    ahead = result.forecast
    if ahead is None:
        return f"{head}, no forecast ({result.earlier} earlier builds of the family)"
    peak = (
        f"; peak {ahead.peak_rss_bytes / 2**20:.0f} MiB forecast, "
        f"{(result.peak_bytes or 0) / 2**20:.0f} MiB real"
        if ahead.peak_rss_bytes
        else ""
    )
    return (
        f"{head}, forecast {ahead.expected_s:.2f} s ({ahead.basis}, {ahead.builds} builds): "
        f"{ahead.error(result.took_s):+.0%}{peak}"
    )


if __name__ == "__main__":
    sys.exit(main())
