"""The demo's model: a small MNIST-like ONNX network generated with the ``onnx`` package.

It has a dynamic batch dimension, like the recorded MNIST builds, so a build of it needs one
optimization profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def demo_model_bytes() -> bytes:
    """Serialized ONNX of conv-relu-pool x2, then two fully connected layers and a softmax."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weights(name: str, *shape: int) -> onnx.TensorProto:
        data = rng.standard_normal(shape).astype(np.float32) * 0.1
        return numpy_helper.from_array(data, name)

    initializers = [
        weights("conv1_w", 8, 1, 5, 5),
        weights("conv1_b", 8),
        weights("conv2_w", 16, 8, 5, 5),
        weights("conv2_b", 16),
        weights("fc1_w", 256, 128),
        weights("fc1_b", 128),
        weights("fc2_w", 128, 10),
        weights("fc2_b", 10),
        numpy_helper.from_array(np.array([-1, 256], dtype=np.int64), "flat_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv1_w", "conv1_b"], ["c1"], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"
        ),
        helper.make_node("Conv", ["p1", "conv2_w", "conv2_b"], ["c2"], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node(
            "MaxPool", ["r2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], name="pool2"
        ),
        helper.make_node("Reshape", ["p2", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc1_w"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "fc1_b"], ["a1"], name="fc1_bias"),
        helper.make_node("Relu", ["a1"], ["r3"], name="relu3"),
        helper.make_node("MatMul", ["r3", "fc2_w"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "fc2_b"], ["logits"], name="fc2_bias"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "trt_otel_demo_mnist",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def _max_pool(source: str, target: str, name: str) -> Any:
    from onnx import helper

    return helper.make_node(
        "MaxPool", [source], [target], kernel_shape=[2, 2], strides=[2, 2], name=name
    )


def write_demo_model(path: Path) -> Path:
    path.write_bytes(demo_model_bytes())
    return path
