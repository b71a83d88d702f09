"""The simulator's TensorRT-RTX shape is the real builder's: for generated models, a simulated
build (``--simulate tensorrt-rtx``) makes exactly the callbacks TensorRT-RTX 1.7 makes for the
same model, and its silent window sits in the same step.

Skipped only where ``tensorrt_rtx`` does not import, with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from rtx_builds import callbacks_of, configured_build, plain_build
from trt_otel import BuildMonitor
from trt_otel.builder.onnx_models import (
    CONV_SHAPES,
    RESIDUAL_SHAPES,
    conv_net_bytes,
    demo_model_bytes,
    residual_net_bytes,
)
from trt_otel.builder.simulator import SimulatedTensorRT, generate_rtx_plan
from trt_otel.builder.simulator.plan import SILENT_PHASE_RTX


def simulated_callbacks(model: bytes, shape_text: str, profiles: int) -> list[tuple[Any, ...]]:
    """A simulated build of ``model``, made the way ``plain_build`` makes the real one."""
    trt = SimulatedTensorRT(speed=0, shape="tensorrt-rtx")
    logger = trt.Logger(trt.Logger.Severity.ERROR)
    builder, network, config = configured_build(trt, logger, model, shape_text, profiles)
    monitor = BuildMonitor()
    config.progress_monitor = monitor
    assert builder.build_serialized_network(network, config) is not None
    return callbacks_of(monitor.log.recent())


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("model", "shape_text", "profiles"),
    [
        pytest.param(conv_net_bytes(1), CONV_SHAPES, 1, id="conv1"),
        pytest.param(conv_net_bytes(12), CONV_SHAPES, 1, id="conv12"),
        pytest.param(residual_net_bytes(40), RESIDUAL_SHAPES, 1, id="residual40"),
        pytest.param(conv_net_bytes(4), CONV_SHAPES, 2, id="conv4-two-profiles"),
        pytest.param(residual_net_bytes(3), RESIDUAL_SHAPES, 3, id="residual3-three-profiles"),
    ],
)
def test_the_simulated_phase_tree_is_the_real_builders(
    rtx: Any, model: bytes, shape_text: str, profiles: int
) -> None:
    real = plain_build(rtx, model, shape_text, profiles=profiles).callbacks
    assert simulated_callbacks(model, shape_text, profiles) == real


@pytest.mark.e2e
def test_the_demo_model_differs_only_in_the_layers_the_parser_adds(rtx: Any) -> None:
    """The simulator counts ONNX nodes; TensorRT's parser adds layers of its own for some of
    them (constants of a MatMul's weights, broadcast shuffles), so only the number of steps of
    "Cloning network graph" can differ."""
    shape_text = "input:1x1x28x28,4x1x28x28,8x1x28x28"
    real = plain_build(rtx, demo_model_bytes(), shape_text).callbacks
    simulated = simulated_callbacks(demo_model_bytes(), shape_text, 1)
    cloning = "Cloning network graph"
    assert [c for c in simulated if c[1] != cloning] == [c for c in real if c[1] != cloning]


def test_the_silent_window_is_in_the_refit_step_and_grows_with_the_network() -> None:
    small, large = generate_rtx_plan(100), generate_rtx_plan(4_501)
    longest = max(large, key=lambda c: c.delay_s or 0.0)
    assert (longest.kind, longest.name) == ("step_complete", SILENT_PHASE_RTX)
    assert longest.delay_s is not None and 15.0 < longest.delay_s < 25.0  # measured 18.4 s
    assert sum(c.delay_s or 0.0 for c in small) < 0.1
