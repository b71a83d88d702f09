"""A stand-in for NVML's Python module (``pynvml``), as one GPU answers it: there is no GPU
here, and NVML's units and its "not supported" answers are what the readers must get right."""

from __future__ import annotations

import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import NoReturn

GIB = 2**30


def fake_nvml(unsupported: frozenset[str] = frozenset()) -> types.ModuleType:
    """NVML's Python module (``pynvml``) as one GPU answers it, in NVML's own units: bytes,
    percent, MHz, milliwatts, degrees. A call named in ``unsupported`` raises, as
    ``NVMLError_NotSupported`` does."""

    def not_supported(*args: object) -> NoReturn:
        raise RuntimeError("Not Supported")

    clocks_mhz = {1: 1980, 2: 2619}
    calls: dict[str, Callable[..., object]] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda index: f"handle {index}",
        "nvmlDeviceGetIndex": lambda handle: 0,
        "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(used=5 * GIB, total=80 * GIB),
        "nvmlDeviceGetUtilizationRates": lambda handle: SimpleNamespace(gpu=75, memory=20),
        "nvmlDeviceGetClockInfo": lambda handle, clock: clocks_mhz[clock],
        "nvmlDeviceGetPowerUsage": lambda handle: 350_500,
        "nvmlDeviceGetTemperature": lambda handle, sensor: 61,
        "nvmlDeviceGetName": lambda handle: b"NVIDIA H200",
        "nvmlDeviceGetCudaComputeCapability": lambda handle: (9, 0),
    }
    module = types.ModuleType("pynvml")
    module.__dict__.update(NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0)
    module.__dict__.update(
        {name: not_supported if name in unsupported else call for name, call in calls.items()}
    )
    return module
