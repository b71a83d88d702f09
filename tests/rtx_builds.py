"""What the tests on TensorRT-RTX's real builder share: the module (or a skip saying why there
is none), generated models, and an independent plain monitor to compare trt-otel's record with.
"""

from __future__ import annotations

import importlib
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trt_otel.builder.onnx_models import conv_net_bytes, residual_net_bytes
from trt_otel.core.events import Event, PhaseFinished, PhaseStarted, StepCompleted

SILENT_BLOCKS = 600
"""Residual blocks of the silent-window tests' model: a few seconds inside one step of
"Determining refit engines" (1,500 blocks give ~20-30 s)."""

SILENT_PHASE = "Determining refit engines"
"""The phase of TensorRT-RTX's silent window: one step of it holds most of a deep model's build,
without a callback."""

Callback = tuple[Any, ...]


def import_rtx() -> Any:
    """``tensorrt_rtx``, or a skip that says why it is missing (the only reason to skip)."""
    try:
        return importlib.import_module("tensorrt_rtx")
    except ImportError as error:
        pytest.skip(
            f"TensorRT-RTX does not import here ({error}); it installs with the dev extra on "
            f"Linux and Windows x86-64 (this is {platform.system()} {platform.machine()})"
        )


def shapes(text: str) -> tuple[tuple[int, ...], ...]:
    """``input:MIN,OPT,MAX`` to the three shapes."""
    return tuple(tuple(int(d) for d in s.split("x")) for s in text.split(":")[1].split(","))


def write_conv(path: Path, layers: int = 8) -> Path:
    path.write_bytes(conv_net_bytes(layers))
    return path


def write_residual(path: Path, blocks: int = SILENT_BLOCKS) -> Path:
    path.write_bytes(residual_net_bytes(blocks))
    return path


@dataclass
class PlainBuild:
    """A build of a model with nothing of trt-otel's in it: TensorRT-RTX's own classes and a
    bare ``IProgressMonitor`` that lists its callbacks."""

    callbacks: list[Callback] = field(default_factory=list)
    engine: bytes | None = None


def configured_build(
    trt: Any, logger: Any, model: bytes, shape_text: str, profiles: int
) -> tuple[Any, Any, Any]:
    """A builder, the parsed network and a config with ``profiles`` optimization profiles of
    ``shape_text``, through the builder library's own API (the real one or the simulator)."""
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    assert trt.OnnxParser(network, logger).parse(model, "model.onnx")
    config = builder.create_builder_config()
    for _ in range(profiles):
        profile = builder.create_optimization_profile()
        profile.set_shape("input", *shapes(shape_text))
        config.add_optimization_profile(profile)
    return builder, network, config


def plain_build(rtx: Any, model: bytes, shape_text: str, profiles: int = 1) -> PlainBuild:
    result = PlainBuild()

    class Plain(rtx.IProgressMonitor):  # type: ignore[misc]
        def __init__(self) -> None:
            rtx.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            result.callbacks.append(("phase_start", phase_name, parent_phase, num_steps))

        def step_complete(self, phase_name: str, step: int) -> bool:
            result.callbacks.append(("step_complete", phase_name, step))
            return True

        def phase_finish(self, phase_name: str) -> None:
            result.callbacks.append(("phase_finish", phase_name))

    builder, network, config = configured_build(
        rtx, rtx.Logger(rtx.Logger.ERROR), model, shape_text, profiles
    )
    monitor = Plain()
    config.progress_monitor = monitor
    engine = builder.build_serialized_network(network, config)
    result.engine = None if engine is None else memoryview(engine).tobytes()
    return result


def callbacks_of(events: list[Event]) -> list[Callback]:
    """The callbacks a trt-otel record holds, in the plain monitor's form."""
    calls: list[Callback] = []
    for event in events:
        if isinstance(event, PhaseStarted):
            calls.append(("phase_start", event.name, event.parent, event.num_steps))
        elif isinstance(event, StepCompleted):
            calls.append(("step_complete", event.name, event.step))
        elif isinstance(event, PhaseFinished):
            calls.append(("phase_finish", event.name))
    return calls
