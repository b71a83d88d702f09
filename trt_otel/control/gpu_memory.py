"""``--max-gpu-memory``: stop the build when its builder's process holds too much GPU memory.

It reads the GPU samples (:mod:`trt_otel.capture.gpu`): the memory NVML says the builder's own
process holds on the build's GPU (``process_memory_used_bytes``), not the GPU's memory in use,
which other processes share. A sample that does not say (the process holds none yet, or NVML does
not list it) decides nothing. The samples come on a thread of their own, so the guard decides
inside a silent window too (the grace period and a kill then stop the build from outside).
"""

from __future__ import annotations

from trt_otel.control.policies import BuildView, Decision, Policy
from trt_otel.control.registry import GpuMemoryConfig, PolicyContext, required
from trt_otel.core.events import CancelSource
from trt_otel.core.sizes import format_bytes


class GpuMemoryGuard(Policy):
    """Stop the build once its builder's process holds more than ``max_bytes`` of GPU memory."""

    source = CancelSource.MEMORY

    def __init__(self, max_bytes: int) -> None:
        if not max_bytes > 0:
            raise ValueError("a GPU memory limit must be more than 0 bytes")
        self.max_bytes = max_bytes

    def describe(self) -> str:
        return f"gpu-memory(max {format_bytes(self.max_bytes)})"

    def check(self, view: BuildView) -> Decision | None:
        sample = view.gpu
        held = sample.process_memory_used_bytes if sample is not None else None
        if sample is None or held is None or held <= self.max_bytes:
            return None
        return Decision(
            f"the builder's GPU memory {format_bytes(held)} (GPU {sample.index}) exceeds "
            f"--max-gpu-memory {format_bytes(self.max_bytes)}",
            self.source,
        )


def make_gpu_memory_guard(config: GpuMemoryConfig, context: PolicyContext) -> Policy:
    return GpuMemoryGuard(required(config.max_gpu_memory_bytes))
