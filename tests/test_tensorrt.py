"""The real TensorRT path: runs only where ``tensorrt`` imports and a GPU is present.

Everywhere else it is skipped with the reason. The same build function runs on the simulator in
every other test; these check what only the real TensorRT can: that the engine it builds
deserializes, and that a cancel through the monitor really stops it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from trt_otel import BuildMonitor, Outcome, read_journal
from trt_otel.builder.build import run_build
from trt_otel.builder.onnx_models import demo_model_bytes

pytestmark = [pytest.mark.e2e, pytest.mark.tensorrt]

SHAPES = ["--shapes", "input:1x1x28x28,4x1x28x28,8x1x28x28"]


@pytest.fixture(scope="module")
def trt() -> Any:
    module = pytest.importorskip(
        "tensorrt", reason="needs the tensorrt package (pip install 'trt-otel[tensorrt]')"
    )
    try:
        module.Builder(module.Logger(module.Logger.ERROR))
    except Exception as error:  # no GPU, no driver, no CUDA
        pytest.skip(f"TensorRT cannot create a builder here ({error})")
    return module


def test_a_real_build_writes_an_engine_that_deserializes(
    trt: Any, mnist: Path, tmp_path: Path
) -> None:
    engine, journal = tmp_path / "tiny.engine", tmp_path / "tiny.jsonl"
    result = subprocess.run(
        [*CLI, "build", str(mnist), "-o", str(engine), "--journal", str(journal), "--no-progress",
         *SHAPES],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    assert runtime.deserialize_cuda_engine(engine.read_bytes()) is not None
    events = read_journal(journal).events
    assert any(e.type == "phase_start" for e in events), "TensorRT reported its phases"
    start = events[0]
    assert start.attributes["trt.version"] == trt.__version__  # type: ignore[attr-defined]


def test_a_cancelled_real_build_stops_and_writes_nothing(
    trt: Any, mnist: Path, tmp_path: Path
) -> None:
    engine, journal, sentinel = tmp_path / "c.engine", tmp_path / "c.jsonl", tmp_path / "STOP"
    process = subprocess.Popen(
        [*CLI, "build", str(mnist), "-o", str(engine), "--journal", str(journal), "--no-progress",
         "--cancel-file", str(sentinel), "--grace", "60s", *SHAPES],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (journal.exists() and b'"step"' in journal.read_bytes()):
        assert process.poll() is None, "the build ended before its first step"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sentinel.write_text("test\n")
    _, err = process.communicate(timeout=300)
    assert process.returncode == 3, err
    assert not engine.exists() and not list(tmp_path.glob(".*partial"))
    ends = [e for e in read_journal(journal).events if e.type == "build_end"]
    assert ends and ends[-1].outcome is Outcome.CANCELLATION  # type: ignore[attr-defined]
    assert "stopped with" not in ends[-1].detail, "TensorRT honoured the cancel itself"  # type: ignore[attr-defined]


class CancelAtFirstStep(BuildMonitor):
    """A user's subclass, as TensorRT's binding sees it."""

    def step_complete(self, phase_name: str, step: int) -> bool:
        if not self.cancelled:
            self.cancel("test")
        return super().step_complete(phase_name, step)


def test_the_monitor_cancels_a_real_build_in_process(trt: Any, tmp_path: Path) -> None:
    monitor = CancelAtFirstStep()
    assert isinstance(monitor, trt.IProgressMonitor)
    monitor.start()
    result = run_build(trt, Path("tiny.onnx"), demo_model_bytes(), monitor,
                       engine_path=tmp_path / "never.engine")  # fmt: skip
    assert result.outcome is Outcome.CANCELLATION
    assert monitor.state.cancel is not None and monitor.state.cancel.reason == "test"
    assert not (tmp_path / "never.engine").exists()
