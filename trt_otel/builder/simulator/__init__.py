"""A faithful simulator of TensorRT's builder, as far as its progress monitor can tell.

Each name is imported from its module when first asked for: the command line names the
simulator's shapes in its options, and a real build should not pay for the rest of it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trt_otel.builder.simulator.callbacks import (
        Callback,
        InternedPlan,
        TraceError,
        load_trace,
    )
    from trt_otel.builder.simulator.driver import Driver, DriveResult, NoOpMonitor
    from trt_otel.builder.simulator.plan import (
        SHAPES,
        TimeModel,
        generate_plan,
        generate_rtx_plan,
    )
    from trt_otel.builder.simulator.tensorrt_api import (
        SIMULATED_ENGINE_MAGIC,
        SIMULATOR_VERSION,
        SimulatedTensorRT,
    )

_FACE = {
    **dict.fromkeys(("Callback", "InternedPlan", "TraceError", "load_trace"), "callbacks"),
    **dict.fromkeys(("Driver", "DriveResult", "NoOpMonitor"), "driver"),
    **dict.fromkeys(("SHAPES", "TimeModel", "generate_plan", "generate_rtx_plan"), "plan"),
    **dict.fromkeys(
        ("SIMULATED_ENGINE_MAGIC", "SIMULATOR_VERSION", "SimulatedTensorRT"), "tensorrt_api"
    ),
}

__all__ = [
    "SHAPES",
    "SIMULATED_ENGINE_MAGIC",
    "SIMULATOR_VERSION",
    "Callback",
    "DriveResult",
    "Driver",
    "InternedPlan",
    "NoOpMonitor",
    "SimulatedTensorRT",
    "TimeModel",
    "TraceError",
    "generate_plan",
    "generate_rtx_plan",
    "load_trace",
]


def __getattr__(name: str) -> Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE})
