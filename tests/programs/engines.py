"""What the build scripts share: parse an ONNX file into a network and a config, as any
TensorRT-RTX build script does (one optimization profile, batch 1 to 4)."""

from __future__ import annotations

import sys
from typing import Any

import tensorrt_rtx as trt

LOGGER = trt.Logger(trt.Logger.ERROR)


def network_and_config(model: str, name: str | None = None) -> tuple[Any, Any, Any]:
    """A builder, the parsed network of ``model`` and a builder config for it."""
    builder = trt.Builder(LOGGER)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, LOGGER)
    with open(model, "rb") as handle:
        if not parser.parse(handle.read()):
            sys.exit(f"cannot parse {model}")
    if name is not None:
        network.name = name
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    tensor = network.get_input(0)
    low = tuple(1 if d < 0 else d for d in tensor.shape)
    high = tuple(4 if d < 0 else d for d in tensor.shape)
    profile.set_shape(tensor.name, low, low, high)
    config.add_optimization_profile(profile)
    return builder, network, config


def build(model: str, name: str | None = None, monitor: Any = None) -> Any:
    """Build ``model``; the serialized engine, or None."""
    builder, network, config = network_and_config(model, name)
    if monitor is not None:
        config.progress_monitor = monitor
    return builder.build_serialized_network(network, config)
