"""Builds on TensorRT-RTX's real builder (CPU-only, ahead of time): the monitor is its
``IProgressMonitor``, the record holds exactly the callbacks it made, the engine is written
atomically, a cancel stops it at the next step, and a parser error names its node.

Skipped only where ``tensorrt_rtx`` does not import, with the reason.
"""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from rtx_builds import callbacks_of, plain_build, shapes, write_conv
from trt_otel import BuildMonitor, Outcome, read_journal
from trt_otel.builder.build import run_build
from trt_otel.builder.onnx_models import CONV_SHAPES, conv_net_bytes
from trt_otel.builder.options import BuildOptions
from trt_otel.core.events import CancelRequested, LogMessage, PhaseFinished, StepCompleted

pytestmark = pytest.mark.e2e


def conv_options() -> BuildOptions:
    low, opt, high = shapes(CONV_SHAPES)
    return BuildOptions(shapes={"input": (low, opt, high)})


def test_a_monitor_is_the_real_builders_iprogressmonitor(rtx: Any) -> None:
    class Mine(BuildMonitor):
        def __init__(self, label: str) -> None:
            super().__init__()
            self.label = label

    for monitor in (BuildMonitor(), BuildMonitor(backend=rtx), Mine("x"), Mine.bound_to(rtx)("y")):
        assert isinstance(monitor, rtx.IProgressMonitor)
        assert monitor.backend == "tensorrt-rtx"
    config = rtx.Builder(rtx.Logger(rtx.Logger.ERROR)).create_builder_config()
    config.progress_monitor = Mine("attached")  # the real binding takes it


def test_a_real_build_records_exactly_the_callbacks_the_builder_made(
    rtx: Any, tmp_path: Path
) -> None:
    model = conv_net_bytes(8)
    plain = plain_build(rtx, model, CONV_SHAPES)
    assert plain.engine, "the plain build made an engine"
    monitor = BuildMonitor()
    engine = tmp_path / "conv.engine"
    result = run_build(
        rtx, Path("conv.onnx"), model, monitor, engine_path=engine, options=conv_options()
    )
    assert result.outcome is Outcome.SUCCESS
    recorded = callbacks_of(monitor.log.recent())
    assert recorded == plain.callbacks
    names = {c[1] for c in recorded if c[0] == "phase_start"}
    assert {"Building engine", "Determining refit engines", "Timing tactics"} <= names
    assert engine.stat().st_size == result.engine_bytes > 0
    assert list(tmp_path.iterdir()) == [engine], "no temporary file left beside the engine"


def test_the_command_builds_with_tensorrt_rtx_and_records_it(rtx: Any, tmp_path: Path) -> None:
    model = write_conv(tmp_path / "conv.onnx")
    engine, journal = tmp_path / "conv.engine", tmp_path / "conv.jsonl"
    result = subprocess.run(
        [*CLI, "build", str(model), "-o", str(engine), "--journal", str(journal),
         "--no-progress", "--no-gpu", "--shapes", CONV_SHAPES],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = read_journal(journal).events
    start = events[0]
    assert start.attributes["trt.backend"] == "tensorrt-rtx"  # type: ignore[attr-defined]
    assert start.attributes["trt.version"] == rtx.__version__  # type: ignore[attr-defined]
    # The worker's callbacks, carried to the supervisor, are exactly the builder's.
    assert callbacks_of(events) == plain_build(rtx, model.read_bytes(), CONV_SHAPES).callbacks
    assert engine.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.engine", "conv.jsonl", "conv.onnx"]


def test_a_cancel_stops_the_real_build_at_its_next_step(rtx: Any, tmp_path: Path) -> None:
    class CancelInOptimizing(BuildMonitor):
        answers: list[bool]

        def step_complete(self, phase_name: str, step: int) -> bool:
            answer = super().step_complete(phase_name, step)
            self.answers.append(answer)
            if phase_name == "Optimizing graph" and step == 5:
                self.cancel("test: stop after step 5", source="test")
            return answer

    monitor = CancelInOptimizing()
    monitor.answers = []
    engine = tmp_path / "conv.engine"
    engine.write_bytes(b"an older engine")
    result = run_build(
        rtx, Path("conv.onnx"), conv_net_bytes(8), monitor, engine_path=engine,
        options=conv_options(),
    )  # fmt: skip
    assert result.outcome is Outcome.CANCELLATION
    events = monitor.log.recent()
    cancel = next(i for i, e in enumerate(events) if isinstance(e, CancelRequested))
    after = events[cancel + 1 :]
    steps_after = [e for e in after if isinstance(e, StepCompleted)]
    # TensorRT made exactly one more step (the one answered False), then only closed phases.
    assert len(steps_after) == 1 and steps_after[0].name == "Optimizing graph"
    assert monitor.answers[-1] is False and monitor.answers.count(False) == 1
    finished = [e.name for e in after if isinstance(e, PhaseFinished)]
    assert finished == ["Optimizing graph", "Building engine from subgraph", "Building engine"]
    assert any(isinstance(e, LogMessage) and "BuildCanceled" in e.message for e in after)
    assert engine.read_bytes() == b"an older engine", "a cancelled build leaves it untouched"
    assert list(tmp_path.iterdir()) == [engine]


def test_a_parser_error_names_its_node_and_fails_the_build(rtx: Any, tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["input"], ["a"], name="fine"),
        helper.make_node("FancyOp", ["a"], ["output"], name="fancy", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes, "bad",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    model = tmp_path / "bad.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    engine = tmp_path / "bad.engine"
    result = subprocess.run(
        [*CLI, "build", str(model), "-o", str(engine), "--no-progress", "--no-gpu"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert "node 1 (fancy, FancyOp)" in result.stderr
    assert not engine.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.onnx"]


def test_a_monitor_bound_to_the_other_library_still_watches_the_build(
    rtx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where both libraries are installed, a monitor made before the build knows which one it
    uses (the worker's) is bound to the default; the build attaches it through a forwarder."""

    class OtherIProgressMonitor:  # stands for tensorrt's, which cannot be installed here
        def __init__(self) -> None:
            pass

    other = types.ModuleType("tensorrt")
    other.IProgressMonitor = OtherIProgressMonitor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", other)
    monitor = BuildMonitor()
    assert isinstance(monitor, OtherIProgressMonitor) and not isinstance(
        monitor, rtx.IProgressMonitor
    )
    model = conv_net_bytes(8)
    result = run_build(rtx, Path("conv.onnx"), model, monitor, options=conv_options())
    assert result.outcome is Outcome.SUCCESS
    assert callbacks_of(monitor.log.recent()) == plain_build(rtx, model, CONV_SHAPES).callbacks
