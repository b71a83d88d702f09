"""The demo's model is shipped in the package as its generator makes it, so ``trt-otel demo``
reads 151 KB instead of importing numpy and onnx to make them (650 M instructions of its
start-up)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from trt_otel.builder.onnx_models import demo_model_bytes, generate_demo_model_bytes


def structure(model: Any) -> tuple[Any, ...]:
    """What the builder builds of a model: its graph's operators, names, inputs and outputs,
    and its weights' names, types and shapes (not their values: the generator's are numpy's
    seeded stream, which numpy does not promise to keep from one version to the next)."""
    graph = model.graph
    return (
        model.ir_version,
        [(o.domain, o.version) for o in model.opset_import],
        [(n.op_type, n.name, list(n.input), list(n.output), str(n.attribute)) for n in graph.node],
        [str(value) for value in (*graph.input, *graph.output)],
        [(t.name, t.data_type, list(t.dims)) for t in graph.initializer],
    )


def test_the_shipped_demo_model_is_the_generated_network() -> None:
    import onnx

    shipped = onnx.load_from_string(demo_model_bytes())
    onnx.checker.check_model(shipped, full_check=True)
    generated = onnx.load_from_string(generate_demo_model_bytes())
    assert structure(shipped) == structure(generated)
    assert [n.op_type for n in shipped.graph.node].count("Conv") == 2


@pytest.mark.e2e
def test_the_demo_model_is_read_without_numpy_or_onnx() -> None:
    code = (
        "import sys\n"
        "from trt_otel.builder.onnx_models import demo_model_bytes\n"
        "assert len(demo_model_bytes()) > 100_000\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'onnx')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
