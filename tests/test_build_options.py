"""`trt-otel build`'s options, through the simulated builder (the same build function as the
real one): they reach the builder config, bad ones are refused before the build, engine and
timing cache are written atomically, and the build record says what was asked for."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from rtx_builds import import_rtx, write_conv
from trt_otel import read_journal
from trt_otel.app.arguments import add_builder_options, builder_options
from trt_otel.app.cli import main
from trt_otel.builder.build import BuildSetupError, run_build
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.options import (
    BuildOptions,
    OptionError,
    parse_size,
    shape_ranges,
    unsupported_options,
)
from trt_otel.builder.simulator import SIMULATED_ENGINE_MAGIC
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.events import BuildStarted, LogMessage

DEMO = ["demo", "--speed", "0", "--no-progress", "--no-gpu"]


def engine_summary(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    assert data.startswith(SIMULATED_ENGINE_MAGIC)
    summary: dict[str, Any] = json.loads(data[len(SIMULATED_ENGINE_MAGIC) :])
    return summary


def build_record(journal: Path) -> dict[str, Any]:
    start = read_journal(journal).events[0]
    assert isinstance(start, BuildStarted)
    return start.attributes


@pytest.mark.e2e
def test_options_reach_the_builder_config_and_the_build_record(tmp_path: Path) -> None:
    engine, journal = tmp_path / "m.engine", tmp_path / "m.jsonl"
    code = main([
        *DEMO, "-o", str(engine), "--journal", str(journal), "--fp16", "--bf16",
        "--workspace", "2G", "--memPoolSize", "tacticSharedMem:48K", "--max-threads", "2",
        "--builderOptimizationLevel", "5",
        "--minShapes", "input:1x1x28x28", "--optShapes", "input:8x1x28x28",
        "--maxShapes", "input:32x1x28x28",
    ])  # fmt: skip
    assert code == 0
    summary = engine_summary(engine)
    assert summary["flags"] == ["BF16", "FP16"]
    assert summary["memory_pools"] == {"WORKSPACE": 2 * 2**30, "TACTIC_SHARED_MEMORY": 48 * 2**10}
    assert summary["optimization_level"] == 5 and summary["max_threads"] == 2
    assert summary["profiles"] == [{"input": [[1, 1, 28, 28], [8, 1, 28, 28], [32, 1, 28, 28]]}]
    record = build_record(journal)
    assert record["trt.options.precision"] == "fp16,bf16"
    assert record["trt.options.memory_pool.workspace"] == 2 * 2**30
    assert record["trt.options.optimization_level"] == 5
    assert record["trt.options.shapes.input"] == "1x1x28x28/8x1x28x28/32x1x28x28"
    assert record["trt.version"] == "simulated" and len(record["model.sha256"]) == 64


@pytest.mark.e2e
def test_a_dynamic_input_without_shapes_is_built_for_one_and_says_so(tmp_path: Path) -> None:
    engine, journal = tmp_path / "m.engine", tmp_path / "m.jsonl"
    assert main([*DEMO, "-o", str(engine), "--journal", str(journal)]) == 0
    assert engine_summary(engine)["profiles"] == [
        {"input": [[1, 1, 28, 28], [1, 1, 28, 28], [1, 1, 28, 28]]}
    ]
    logs = [e for e in read_journal(journal).events if isinstance(e, LogMessage)]
    assert any("no shapes were given: building for 1x1x28x28" in e.message for e in logs)


@pytest.mark.e2e
def test_strongly_typed_networks(tmp_path: Path) -> None:
    engine = tmp_path / "typed.engine"
    assert main([*DEMO, "-o", str(engine), "--strongly-typed"]) == 0
    assert engine_summary(engine)["strongly_typed"] is True


@pytest.mark.e2e
def test_the_timing_cache_is_saved_and_used_again(tmp_path: Path) -> None:
    cache, engine = tmp_path / "timing.cache", tmp_path / "m.engine"
    assert main([*DEMO, "-o", str(engine), "--timing-cache", str(cache)]) == 0
    assert cache.exists() and engine_summary(engine)["timing_cache_hits"] == 0
    assert main([*DEMO, "-o", str(engine), "--timingCacheFile", str(cache)]) == 0
    layers = len(onnx.load_from_string(demo_model_bytes()).graph.node)
    assert engine_summary(engine)["timing_cache_hits"] == engine_summary(engine)["layers"]
    assert layers == engine_summary(engine)["layers"], "every layer of the model, from the cache"
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.e2e
def test_an_unusable_timing_cache_is_replaced_with_a_warning(tmp_path: Path) -> None:
    cache, journal = tmp_path / "timing.cache", tmp_path / "m.jsonl"
    cache.write_bytes(b"\x00garbage")
    assert main([*DEMO, "--timing-cache", str(cache), "--journal", str(journal)]) == 0
    logs = [e for e in read_journal(journal).events if isinstance(e, LogMessage)]
    assert any(e.severity == "WARNING" and "unusable" in e.message for e in logs)
    assert cache.read_bytes().startswith(b"TRT-OTEL-SIMULATED-TIMING-CACHE")


@pytest.mark.e2e
def test_builder_messages_are_kept_from_the_chosen_level(tmp_path: Path) -> None:
    info, quiet = tmp_path / "info.jsonl", tmp_path / "quiet.jsonl"
    assert main([*DEMO, "--journal", str(info)]) == 0
    assert main([*DEMO, "--journal", str(quiet), "--log-level", "error"]) == 0
    severities = [
        {e.severity for e in read_journal(j).events if isinstance(e, LogMessage)}
        for j in (info, quiet)
    ]
    assert "INFO" in severities[0]
    assert "INFO" not in severities[1] and "VERBOSE" not in severities[1]


def model_with_unknown_ops(path: Path) -> Path:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok"),
        helper.make_node("FancyOp", ["a"], ["b"], name="fancy", domain="com.example"),
        helper.make_node("OtherOp", ["b"], ["y"], name="other", domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    path.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    onnx.checker.check_model(onnx.load(str(path)))
    return path


@pytest.mark.e2e
def test_every_parser_error_is_reported_with_its_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_with_unknown_ops(tmp_path / "custom.onnx")
    engine, journal = tmp_path / "custom.engine", tmp_path / "custom.jsonl"
    code = main([*DEMO, "--model", str(model), "-o", str(engine), "--journal", str(journal)])
    assert code == 4
    err = capsys.readouterr().err
    assert "node 1: No importer registered for op: FancyOp" in err
    assert "node 2: No importer registered for op: OtherOp" in err
    assert not engine.exists() and not list(tmp_path.glob(".*partial"))


@pytest.mark.e2e
def test_a_cancelled_build_writes_nothing_and_keeps_the_old_engine(tmp_path: Path) -> None:
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"the engine that works")
    assert main(["demo", "--no-progress", "--no-gpu", "-o", str(engine), "--timeout", "1s"]) == 3
    assert engine.read_bytes() == b"the engine that works"
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workspace", "lots"], "is not a size"),
        (["--memPoolSize", "vram:1G"], "unknown memory pool 'vram'"),
        (["--memPoolSize", "workspace"], "write POOL:SIZE"),
        (["--shapes", "input:1x1x28x28"], "write INPUT:MIN,OPT,MAX"),
        (["--shapes", "input:8x1x28x28,4x1x28x28,16x1x28x28"], "min <= opt <= max"),
        (["--minShapes", "input:1x1x28x28"], "needs --opt-shapes and --max-shapes too"),
        (["--minShapes", "input:1x1x28"], "needs --opt-shapes"),
        (["--shapes", "input:1,2,3x"], "is not a shape"),
        (["--strongly-typed", "--fp16"], "cannot be combined with --fp16"),
        (["--max-threads", "0"], "--max-threads must be at least 1"),
    ],
)
def test_bad_options_are_refused_before_the_build(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*DEMO, *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "build started" not in err


@pytest.mark.e2e
def test_an_input_the_model_does_not_have_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*DEMO, "--shapes", "images:1x3x8x8,1x3x8x8,1x3x8x8"]) == 2
    assert "no input named 'images'; the model's inputs are 'input'" in capsys.readouterr().err


def test_an_out_of_range_optimization_level_is_an_argparse_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*DEMO, "--builder-optimization-level", "9"])
    assert exit_info.value.code == 2


def test_sizes_and_shapes_parse_as_trtexec_writes_them() -> None:
    assert parse_size("4G") == parse_size("4GiB") == parse_size("4096M") == 4 * 2**30
    assert parse_size("1048576") == 2**20
    ranges = shape_ranges(["a:1x2,2x2,4x2"], ["b:1"], ["b:2"], ["b:3"])
    assert ranges == {"a": ((1, 2), (2, 2), (4, 2)), "b": ((1,), (2,), (3,))}
    with pytest.raises(OptionError, match="from --shapes and from"):
        shape_ranges(["a:1,1,1"], ["a:1"], ["a:1"], ["a:1"])
    with pytest.raises(OptionError, match="different ranks"):
        shape_ranges(["a:1x2,1x2,1"], [], [], [])


def test_memory_pools_are_read_comma_separated_and_repeated() -> None:
    """As trtexec takes them (``--memPoolSize workspace:1G,tacticSharedMem:48K``), and one
    pool per option too: every pool named reaches the build's options."""
    parser = argparse.ArgumentParser()
    add_builder_options(parser)
    args = parser.parse_args(
        ["--memPoolSize", "workspace:1G,tacticSharedMem:48K", "--mem-pool-size", "tacticDRAM:2G"]
    )
    assert builder_options(args).memory_pools == {
        "WORKSPACE": 1 << 30,
        "TACTIC_SHARED_MEMORY": 48 << 10,
        "TACTIC_DRAM": 2 << 30,
    }


def test_a_dimension_of_zero_is_a_shape_and_a_negative_one_is_not() -> None:
    """TensorRT builds for empty tensors (a batch of 0 as a profile's minimum): a 0 is a
    dimension; -1 is the ONNX file's "dynamic", which a profile must replace with a size."""
    assert shape_ranges(["a:0x3,1x3,8x3"], [], [], []) == {"a": ((0, 3), (1, 3), (8, 3))}
    assert shape_ranges([], ["b:0"], ["b:0"], ["b:0"]) == {"b": ((0,), (0,), (0,))}
    with pytest.raises(OptionError, match="dimensions are 0 or more"):
        shape_ranges(["a:-1x3,1x3,8x3"], [], [], [])


def test_a_pool_size_larger_than_any_memory_names_the_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*DEMO, "--workspace", str(2**64)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"'{2**64}' is larger than any memory" in err
    assert "at most 1,152,921,504,606,846,976 bytes" in err, "the message names the limit"
    assert parse_size(str(2**40)) == 2**40, "more than the host has is a limit, and allowed"


def test_a_pool_size_the_binding_cannot_take_is_refused_before_the_build(tmp_path: Path) -> None:
    """Through the build API (not the command line, which caps sizes lower): TensorRT-RTX's real
    binding takes a size_t, and anything else was a TypeError from inside the build."""
    rtx = import_rtx()
    model_path = write_conv(tmp_path / "conv.onnx")
    for size in (2**64, -1):
        monitor = BuildMonitor()
        options = BuildOptions(memory_pools={"WORKSPACE": size})
        with pytest.raises(BuildSetupError) as refused:
            run_build(rtx, model_path, model_path.read_bytes(), monitor, options=options)
        assert str(refused.value) == (
            f"--mem-pool-size workspace: {size:,} bytes does not fit TensorRT's memory pool "
            f"limit (a size_t: 0 to {2**64 - 1:,})"
        )
        assert monitor.log.recent() == [], "refused before the build started"
    largest = BuildOptions(memory_pools={"WORKSPACE": 2**64 - 1})
    assert unsupported_options(rtx, largest) == [], "the binding takes 2**64-1"
