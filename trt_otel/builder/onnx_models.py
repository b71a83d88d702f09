"""ONNX models generated with ``onnx.helper``: what the demo, the tests and the benchmarks build.

- :func:`demo_model_bytes`: a small MNIST-like network (conv-relu-pool twice, two fully
  connected layers, softmax), the simulator's demo model, shipped in the package as
  :func:`generate_demo_model_bytes` made it;
- :func:`conv_net_bytes`: a plain chain of 3x3 convolutions and ReLUs, ``layers`` deep, that a
  real builder takes a fraction of a second over: the real-builder tests' model;
- :func:`residual_net_bytes`: ``blocks`` residual blocks (conv, relu, add). TensorRT-RTX 1.7
  spends most of its build of a deep one inside a single step of "Determining refit engines",
  with no callback at all: about 28 s for 1,500 blocks on an idle x86-64 core. That is the real
  silent window of ``make demo`` and of the silent-window tests.

Every model has one input, ``input`` (``batch x C x H x W``, the batch dynamic), and one
output, so a build of it needs one optimization profile (``--shapes`` or the builder's default
of batch 1). Weights are seeded: the same arguments give the same bytes (and the same
``model.sha256`` in the build record).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from trt_otel.core.startup import native_import

INPUT_NAME = "input"
DEMO_SHAPES = "input:1x1x28x28,4x1x28x28,8x1x28x28"
"""``--shapes`` for the demo model."""
CONV_SHAPES = "input:1x8x16x16,2x8x16x16,4x8x16x16"
"""``--shapes`` for :func:`conv_net_bytes`' model (its defaults)."""
RESIDUAL_SHAPES = "input:1x8x32x32,4x8x32x32,8x8x32x32"
"""``--shapes`` for :func:`residual_net_bytes`' model (its defaults)."""
SILENT_WINDOW_BLOCKS = 1_700
"""Residual blocks of the quick start's model (``make demo``): a 20-40 s build, most of it the
silent window (about 24 s on an idle x86-64 core)."""


def _onnx() -> Any:
    """onnx, with numpy and the parts used here, first imported with Ctrl-C held: a Ctrl-C
    while their native modules initialise crashes the interpreter (see native_import), or is
    lost in them. ``numpy.random`` too, which numpy imports only when it is first used: a
    Ctrl-C inside its Cython modules' initialisation was swallowed there, and the demo built
    on to its end as if none had come."""
    with native_import():
        import numpy.random  # noqa: F401
        import onnx
        from onnx import helper, numpy_helper  # noqa: F401
    return onnx


def _weights(rng: Any, name: str, *shape: int, scale: float = 0.1) -> Any:
    import numpy as np
    from onnx import numpy_helper

    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * scale, name)


def _finish(
    nodes: list[Any],
    initializers: list[Any],
    *,
    name: str,
    channels: int,
    size: int,
    output: str = "output",
    output_shape: list[Any] | None = None,
) -> bytes:
    onnx = _onnx()
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT,
                                       ["batch", channels, size, size])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT,
                                       output_shape or ["batch", channels, size, size])],
        initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


DEMO_MODEL = "models/demo-mnist.onnx"
"""The demo model as shipped in the package (:func:`generate_demo_model_bytes`' bytes)."""


def demo_model_bytes() -> bytes:
    """The demo model: conv-relu-pool x2, then two fully connected layers and a softmax.

    Read from the package, not generated: generating it imports numpy and onnx, 650 M
    instructions of every ``trt-otel demo``'s start-up (the generation's own numpy stream may
    also change with numpy's version, and the model with it)."""
    return (resources.files("trt_otel.builder") / DEMO_MODEL).read_bytes()


def generate_demo_model_bytes() -> bytes:
    """The demo model, generated: ``python -c "from trt_otel.builder.onnx_models import *;
    (Path('trt_otel/builder') / DEMO_MODEL).write_bytes(generate_demo_model_bytes())"``
    writes the shipped file again."""
    _onnx()  # numpy and onnx first loaded with Ctrl-C held
    import numpy as np
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    initializers = [
        _weights(rng, "conv1_w", 8, 1, 5, 5),
        _weights(rng, "conv1_b", 8),
        _weights(rng, "conv2_w", 16, 8, 5, 5),
        _weights(rng, "conv2_b", 16),
        _weights(rng, "fc1_w", 256, 128),
        _weights(rng, "fc1_b", 128),
        _weights(rng, "fc2_w", 128, 10),
        _weights(rng, "fc2_b", 10),
        numpy_helper.from_array(np.array([-1, 256], dtype=np.int64), "flat_shape"),
    ]
    nodes = [
        helper.make_node("Conv", [INPUT_NAME, "conv1_w", "conv1_b"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        _max_pool("r1", "p1", "pool1"),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        _max_pool("r2", "p2", "pool2"),
        helper.make_node("Reshape", ["p2", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc1_w"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "fc1_b"], ["a1"], name="fc1_bias"),
        helper.make_node("Relu", ["a1"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "fc2_w"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "fc2_b"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1, name="softmax"),
    ]
    return _finish(
        nodes,
        initializers,
        name="trt_otel_demo_mnist",
        channels=1,
        size=28,
        output="probabilities",
        output_shape=["batch", 10],
    )


def conv_net_bytes(layers: int = 8, channels: int = 8, size: int = 16, seed: int = 0) -> bytes:
    """A chain of ``layers`` 3x3 convolutions (same padding), each followed by a ReLU."""
    _onnx()  # numpy and onnx first loaded with Ctrl-C held
    import numpy as np
    from onnx import helper

    if layers < 1:
        raise ValueError("a conv net needs at least one layer")
    rng = np.random.default_rng(seed)
    nodes, initializers, current = [], [], INPUT_NAME
    for index in range(layers):
        weight, bias = f"conv{index}_w", f"conv{index}_b"
        initializers += [_weights(rng, weight, channels, channels, 3, 3),
                         _weights(rng, bias, channels)]  # fmt: skip
        conv, relu = f"conv{index}", f"relu{index}"
        nodes.append(helper.make_node("Conv", [current, weight, bias], [conv], name=conv,
                                      pads=[1, 1, 1, 1]))  # fmt: skip
        nodes.append(helper.make_node("Relu", [conv], [relu], name=relu))
        current = relu
    nodes.append(helper.make_node("Identity", [current], ["output"], name="output"))
    return _finish(nodes, initializers, name=f"trt_otel_conv{layers}", channels=channels, size=size)


def residual_net_bytes(
    blocks: int = SILENT_WINDOW_BLOCKS, channels: int = 8, size: int = 32, seed: int = 0
) -> bytes:
    """``blocks`` residual blocks: ``x + relu(conv3x3(x))``. Weights are small so that the
    activations stay bounded however deep the net is."""
    _onnx()  # numpy and onnx first loaded with Ctrl-C held
    import numpy as np
    from onnx import helper

    if blocks < 1:
        raise ValueError("a residual net needs at least one block")
    rng = np.random.default_rng(seed)
    nodes, initializers, current = [], [], INPUT_NAME
    for index in range(blocks):
        weight, bias = f"block{index}_w", f"block{index}_b"
        initializers += [_weights(rng, weight, channels, channels, 3, 3, scale=0.01),
                         _weights(rng, bias, channels, scale=0.01)]  # fmt: skip
        conv, relu, added = f"block{index}_conv", f"block{index}_relu", f"block{index}_out"
        nodes.append(helper.make_node("Conv", [current, weight, bias], [conv], name=conv,
                                      pads=[1, 1, 1, 1]))  # fmt: skip
        nodes.append(helper.make_node("Relu", [conv], [relu], name=relu))
        nodes.append(helper.make_node("Add", [current, relu], [added], name=added))
        current = added
    nodes.append(helper.make_node("Identity", [current], ["output"], name="output"))
    return _finish(
        nodes, initializers, name=f"trt_otel_residual{blocks}", channels=channels, size=size
    )


def _max_pool(source: str, target: str, name: str) -> Any:
    _onnx()  # numpy and onnx first loaded with Ctrl-C held
    from onnx import helper

    return helper.make_node(
        "MaxPool", [source], [target], kernel_shape=[2, 2], strides=[2, 2], name=name
    )


def write_demo_model(path: Path) -> Path:
    path.write_bytes(demo_model_bytes())
    return path


def write_quickstart_model(path: str | Path) -> Path:
    """The quick start's residual net (``make demo``), written to ``path``."""
    target = Path(path)
    target.write_bytes(residual_net_bytes(SILENT_WINDOW_BLOCKS))
    return target
