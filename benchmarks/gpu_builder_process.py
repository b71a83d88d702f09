"""The builder's process on a real GPU: its own GPU memory (NVML's process lists) and the verdict
while it holds memory idle, then computes.

Needs a GPU, NVIDIA's driver, nvidia-ml-py, psutil and PyTorch (not CI: run it where they are).
A PyTorch process stands in for a builder: it takes 2 GiB of GPU memory and sleeps (a builder
hung in a driver wait looks like this), then runs matrix products for a while. The samplers watch
it as a build's would, and each second's samples are printed: the process's own GPU memory, the
card's utilization, the process's CPU, and the verdict.
"""

from __future__ import annotations

import subprocess
import sys
import time

from trt_otel.capture.gpu import GpuSampler, open_reader
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.process import ProcessSampler

STAND_IN = """
import sys, time, torch
held = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(float(sys.argv[1]))
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[2])
print("computing", flush=True)
while time.monotonic() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def main(idle_s: float = 8.0, busy_s: float = 8.0) -> int:
    reader, said = open_reader()
    print(said)
    if reader is None:
        return 1
    stand_in = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(idle_s), str(busy_s)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert stand_in.stdout is not None
    print(f"stand-in: {stand_in.stdout.readline().strip()} (pid {stand_in.pid})")
    monitor = BuildMonitor()
    monitor.start()
    gpu = GpuSampler(monitor, reader)
    gpu.watch(stand_in.pid)
    process = ProcessSampler(monitor, pid=stand_in.pid)
    print("  t(s)  process GPU MiB  card GPU %  process CPU %  verdict")
    began = time.monotonic()
    while stand_in.poll() is None:
        gpu_sample = gpu.sample_once()
        process.sample_once()
        activity = monitor.state.activity
        held = gpu_sample.process_memory_used_bytes if gpu_sample is not None else None
        busy = gpu_sample.utilization if gpu_sample is not None else None
        cpu = activity.last_sample.cpu_percent if activity.last_sample is not None else None
        print(
            f"{time.monotonic() - began:6.1f}  {'-' if held is None else held >> 20:>15}"
            f"  {'-' if busy is None else f'{busy:.0%}':>10}  {'-' if cpu is None else cpu:>13}"
            f"  {activity.describe()}",
            flush=True,
        )
        time.sleep(1.0)
    reader.close()
    return stand_in.wait()


if __name__ == "__main__":
    sys.exit(main())
