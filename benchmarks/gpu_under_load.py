"""A simulated build sampled on a real GPU while a real GPU workload runs beside it.

Needs a GPU, NVIDIA's driver, nvidia-ml-py and PyTorch (not CI: run it where they are). It starts
``trt-otel demo`` with GPU sampling and a journal, starts a PyTorch workload a few seconds later
(bf16 matrix products, taking more memory every second), then reads the journal back: the GPU
samples over time, and each top phase's span attributes (peak memory, mean utilization) as the
span projection computes them.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trt_otel.core.events import GpuSample
from trt_otel.core.journal_reader import read_journal
from trt_otel.views.spans import SpanProjection

WORKLOAD = """
import time, torch
blocks, a = [], torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + {seconds}
next_grow = 0.0
while time.monotonic() < end:
    if time.monotonic() >= next_grow:
        blocks.append(torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda"))  # +4 GiB
        next_grow = time.monotonic() + 1.0
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
print(f"workload: {{len(blocks) * 4}} GiB held at the end", flush=True)
"""


def main() -> int:
    folder = Path(tempfile.mkdtemp())
    journal = folder / "build.jsonl"
    build = subprocess.Popen(
        [sys.executable, "-m", "trt_otel.app.cli", "demo", "--no-progress",
         "--journal", str(journal), "--gpu-interval", "0.5s"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(4.0)
    workload = subprocess.run(
        [sys.executable, "-c", WORKLOAD.format(seconds=12)], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    print(workload.stdout.strip() or workload.stderr.strip()[-500:])
    _, build_err = build.communicate(timeout=300)
    print("\n".join(line for line in build_err.splitlines() if not line.startswith("[")))
    print(f"build exit code {build.returncode}")
    events = read_journal(journal).events
    start = events[0].mono_ns
    samples = [e for e in events if isinstance(e, GpuSample)]
    print(f"\n{len(samples)} GPU samples (t s, memory used GiB, utilization, SM MHz, W, C):")
    for sample in samples:
        print(
            f"  {(sample.mono_ns - start) / 1e9:5.1f}  "
            f"{(sample.memory_used_bytes or 0) / 2**30:6.1f}  "
            f"{sample.utilization if sample.utilization is not None else float('nan'):4.0%}  "
            f"{(sample.sm_clock_hz or 0) / 1e6:5.0f}  {sample.power_w or 0:5.0f}  "
            f"{sample.temperature_c or 0:3.0f}"
        )
    projection = SpanProjection()
    spans = [span for event in events for span in projection.apply(event)]
    print("\nspans with GPU samples (depth <= 2): name, duration s, samples, peak GiB, mean util")
    for span in sorted(spans, key=lambda s: s.start_ns):
        attributes = span.attributes
        depth = attributes.get("trt.phase.depth", -1)
        if "gpu.samples" not in attributes or depth > 2:
            continue
        print(
            f"  {'  ' * (depth + 1)}{span.name}: {(span.end_ns - span.start_ns) / 1e9:.1f}s, "
            f"{attributes['gpu.samples']} samples, "
            f"peak {attributes.get('gpu.memory.peak_bytes', 0) / 2**30:.1f} GiB, "
            f"mean {attributes.get('gpu.utilization.mean', float('nan')):.0%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
