"""Builder options on TensorRT-RTX's real builder: the ones it has reach its config (read back
from its own objects into the journal), and the ones it lacks are refused before the build
(exit 2), never silently dropped. The reasons for each refusal are checked against the real
library, so the refusals stay true when TensorRT-RTX changes.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from cli import run_cli
from rtx_builds import write_conv
from trt_otel import read_journal
from trt_otel.builder.build import BuildSetupError, select_backend
from trt_otel.builder.onnx_models import CONV_SHAPES
from trt_otel.builder.options import BuildOptions, unsupported_options
from trt_otel.capture.backends import TENSORRT_RTX
from trt_otel.core.events import LogMessage


def build(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    model = write_conv(tmp_path / "conv.onnx")
    engine, journal = tmp_path / "conv.engine", tmp_path / "conv.jsonl"
    result = run_cli(
        "build", model, "-o", engine, "--journal", journal, "--no-progress", "--no-gpu", *options,
        timeout=300,
    )  # fmt: skip
    return result, engine, journal


@pytest.mark.e2e
def test_options_reach_the_real_builder_config(rtx: Any, tmp_path: Path) -> None:
    result, engine, journal = build(
        tmp_path, "--builder-optimization-level", "1", "--workspace", "256M",
        "--mem-pool-size", "tacticSharedMem:48K", "--max-threads", "2",
        "--min-shapes", "input:1x8x16x16", "--opt-shapes", "input:3x8x16x16",
        "--max-shapes", "input:5x8x16x16",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = [
        e.message
        for e in read_journal(journal).events
        if isinstance(e, LogMessage) and e.message.startswith("builder config:")
    ]
    assert config == [
        "builder config: optimization level 1, max threads 2, workspace pool 268435456, "
        "tactic_dram pool 68719476736, tactic_shared_memory pool 49152, "
        "profile input 1x8x16x16/3x8x16x16/5x8x16x16"
    ]
    assert engine.stat().st_size > 0


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("options", "refused"),
    [
        (["--fp16"], "--fp16: TensorRT-RTX"),
        (["--int8", "--bf16"], "--int8: TensorRT-RTX"),
        (["--timing-cache", "{tmp}/cache.bin"], "--timing-cache: TensorRT-RTX"),
        (["--mem-pool-size", "dlaSRAM:1M"], "--mem-pool-size dlaSRAM: TensorRT-RTX"),
    ],
)
def test_options_tensorrt_rtx_lacks_are_refused_before_the_build(
    rtx: Any, tmp_path: Path, options: list[str], refused: str
) -> None:
    # Paths in the build's own folder: a refusal that wrote anything would be seen there.
    options = [option.replace("{tmp}", str(tmp_path)) for option in options]
    result, engine, journal = build(tmp_path, "--shapes", CONV_SHAPES, *options)
    assert result.returncode == 2, result.stderr
    assert refused in result.stderr and rtx.__version__ in result.stderr
    assert "Traceback" not in result.stderr
    assert not engine.exists() and not journal.exists(), "refused before anything started"
    assert not (tmp_path / "cache.bin").exists()


@pytest.mark.e2e
def test_the_refusals_are_what_the_real_library_says(rtx: Any) -> None:
    # No precision flags: its networks are strongly typed.
    for precision in ("FP16", "BF16", "INT8", "FP8"):
        assert not hasattr(rtx.BuilderFlag, precision)
    assert hasattr(rtx.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")
    # Its timing cache calls are no-ops, and it says so.
    config = rtx.Builder(rtx.Logger(rtx.Logger.ERROR)).create_builder_config()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.set_timing_cache(config.create_timing_cache(b""), False)
    assert any("no-ops" in str(w.message) for w in caught)
    assert not TENSORRT_RTX.timing_cache
    # A DLA pool is refused by its builder config, which logs why and keeps 0.
    messages: list[str] = []

    class Capture(rtx.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            rtx.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            messages.append(msg)

    config = rtx.Builder(Capture()).create_builder_config()
    config.set_memory_pool_limit(rtx.MemoryPoolType.DLA_MANAGED_SRAM, 1 << 20)
    assert config.get_memory_pool_limit(rtx.MemoryPoolType.DLA_MANAGED_SRAM) == 0
    assert any("DLA disabled" in m for m in messages)
    assert not TENSORRT_RTX.dla
    # And what it has is accepted.
    accepted = BuildOptions(
        strongly_typed=True, memory_pools={"WORKSPACE": 1, "TACTIC_DRAM": 1},
        optimization_level=2, max_threads=1,
    )  # fmt: skip
    assert unsupported_options(rtx, accepted) == []


def test_a_named_backend_that_is_not_installed_says_how_to_install_it(
    rtx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BuildSetupError, match=r"pip install 'trt-otel\[tensorrt\]'"):
        select_backend("tensorrt")
    with pytest.raises(BuildSetupError, match="unknown backend 'tensorrt-llm'"):
        select_backend("tensorrt-llm")
    backend, module = select_backend("tensorrt_rtx")
    assert backend is TENSORRT_RTX and module is rtx
    assert select_backend(None)[0] is TENSORRT_RTX  # the one installed


@pytest.mark.e2e
def test_backend_names_the_library_and_a_missing_one_is_exit_2(
    rtx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trt_otel.app.cli import main

    model = write_conv(tmp_path / "conv.onnx")
    engine, journal = tmp_path / "conv.engine", tmp_path / "conv.jsonl"
    common = ["build", str(model), "-o", str(engine), "--no-progress", "--no-gpu",
              "--shapes", CONV_SHAPES, "--journal", str(journal)]  # fmt: skip
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # not installed (it cannot be, here)
    assert main([*common, "--backend", "tensorrt"]) == 2
    err = capsys.readouterr().err
    assert "TensorRT is not installed" in err and "pip install 'trt-otel[tensorrt]'" in err
    assert not journal.exists() and not engine.exists()
    assert main([*common, "--backend", "tensorrt-rtx", "--in-process"]) == 0
    start = read_journal(journal).events[0]
    assert start.attributes["trt.backend"] == "tensorrt-rtx"  # type: ignore[attr-defined]
    assert engine.stat().st_size > 0
