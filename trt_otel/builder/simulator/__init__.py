"""A faithful simulator of TensorRT's builder, as far as its progress monitor can tell."""

from trt_otel.builder.simulator.callbacks import Callback, InternedPlan, TraceError, load_trace
from trt_otel.builder.simulator.driver import Driver, DriveResult, NoOpMonitor
from trt_otel.builder.simulator.plan import SHAPES, TimeModel, generate_plan, generate_rtx_plan
from trt_otel.builder.simulator.tensorrt_api import (
    SIMULATED_ENGINE_MAGIC,
    SIMULATOR_VERSION,
    SimulatedTensorRT,
)

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
