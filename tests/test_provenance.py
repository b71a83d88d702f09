"""The build record's provenance: what went in on ``build_start`` (versions, host, model, options,
the timing cache before, a ``fingerprint`` of what decides the engine) and what came out in the
``output`` event (the engine's and the timing cache's SHA-256), checked against the files."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from cli import demo_journal, run_cli
from rtx_builds import import_rtx, write_conv
from trt_otel.builder.onnx_models import CONV_SHAPES
from trt_otel.builder.provenance import fingerprint, fingerprint_inputs
from trt_otel.core.events import BuildFinished, BuildOutput, BuildStarted, Event
from trt_otel.core.journal_reader import read_journal
from trt_otel.core.version import __version__


def record(journal: Path) -> tuple[dict[str, Any], dict[str, Any], list[Event]]:
    events = read_journal(journal).events
    start = next(e for e in events if isinstance(e, BuildStarted))
    outputs = [e for e in events if isinstance(e, BuildOutput)]
    return start.attributes, outputs[0].attributes if outputs else {}, events


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_build_records_what_went_in_and_the_engine_that_came_out(tmp_path: Path) -> None:
    import_rtx()
    model = write_conv(tmp_path / "conv.onnx")
    engine, journal = tmp_path / "conv.engine", tmp_path / "b.jsonl"
    done = run_cli(
        "build", str(model), "-o", str(engine), "--shapes", CONV_SHAPES,
        "--journal", str(journal), "--no-progress", "--no-summary",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    went_in, came_out, events = record(journal)
    assert went_in["trt.backend"] == "tensorrt-rtx"
    assert went_in["trt.version"].startswith("1.7.")
    assert went_in["trt_otel.version"] == __version__
    assert went_in["model.sha256"] == sha256(model)
    assert went_in["cuda.runtime.major"] in ("12", "13")
    for key in ("host.name", "os.type", "process.runtime.version"):
        assert went_in[key]
    assert went_in["fingerprint"] == fingerprint(went_in)
    assert came_out["engine.sha256"] == sha256(engine)
    assert came_out["engine.bytes"] == engine.stat().st_size
    # The output comes before the end, so a follower that stops at the end has it.
    assert isinstance(events[-1], BuildFinished)
    assert any(isinstance(e, BuildOutput) for e in events[-3:])
    page = run_cli("report", str(journal), "--format", "markdown").stdout
    assert f"| engine.sha256 | {sha256(engine)} |" in page


@pytest.mark.e2e
def test_the_timing_cache_is_recorded_before_and_after(tmp_path: Path) -> None:
    cache = tmp_path / "timing.cache"
    first = demo_journal(
        tmp_path / "first.jsonl", "--timing-cache", str(cache), "-o", str(tmp_path / "a.e")
    )
    went_in, came_out, _ = record(first)
    assert "trt.timing_cache.sha256.before" not in went_in  # there was none
    after = came_out["trt.timing_cache.sha256.after"]
    assert after == sha256(cache)
    second = demo_journal(
        tmp_path / "second.jsonl", "--timing-cache", str(cache), "-o", str(tmp_path / "b.e")
    )
    went_in, _, _ = record(second)
    assert went_in["trt.timing_cache.sha256.before"] == after


@pytest.mark.e2e
def test_the_fingerprint_tells_the_same_build_from_a_different_one(tmp_path: Path) -> None:
    one = record(demo_journal(tmp_path / "one.jsonl", "--timing-cache", str(tmp_path / "c1")))[0]
    same = record(demo_journal(tmp_path / "same.jsonl", "--timing-cache", str(tmp_path / "c2")))[0]
    other = record(demo_journal(tmp_path / "other.jsonl", "--builder-optimization-level", "1"))[0]
    assert one["fingerprint"] == same["fingerprint"]  # the cache's path decides nothing
    assert one["fingerprint"] != other["fingerprint"]


def test_the_fingerprint_covers_the_model_backend_version_options_and_gpu_architecture() -> None:
    base = {
        "model.sha256": "a" * 64,
        "trt.backend": "tensorrt",
        "trt.version": "10.16.0",
        "gpu.compute_capability": "8.9",
        "trt.options.precision": "fp16",
        "trt.options.timing_cache": "/tmp/cache",
        "host.name": "gpu-7",
        "gpu.uuid": "GPU-1234",
    }
    assert set(fingerprint_inputs(base)) == {
        "model.sha256",
        "trt.backend",
        "trt.version",
        "gpu.compute_capability",
        "trt.options.precision",
    }
    for key, value in [
        ("model.sha256", "b" * 64),
        ("trt.version", "10.16.1"),
        ("gpu.compute_capability", "9.0"),
        ("trt.options.precision", "bf16"),
        ("trt.options.optimization_level", 5),
    ]:
        assert fingerprint({**base, key: value}) != fingerprint(base), key
    # Another host, another card of the same architecture, another cache path: the same build.
    same = {**base, "host.name": "gpu-8", "gpu.uuid": "GPU-5678", "trt.options.timing_cache": "x"}
    assert fingerprint(same) == fingerprint(base)


def test_the_fingerprint_of_a_simulated_build_covers_what_it_simulates() -> None:
    base = {"trt.backend": "tensorrt", "trt.version": "10.16.0", "simulator.shape": "wide"}
    assert fingerprint_inputs(base)["simulator.shape"] == "wide"
    assert fingerprint({**base, "simulator.shape": "deep"}) != fingerprint(base)
    assert fingerprint({**base, "simulator.trace": "b.jsonl"}) != fingerprint(base)
