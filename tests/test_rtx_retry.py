"""A retry ladder on TensorRT-RTX's real builder: the first attempt times out, the second rung
(given more time) builds the engine; both attempts are in one journal, and the second's span
links to the first's, as a real OTLP receiver decodes them.

Skipped only where ``tensorrt_rtx`` does not import, with the reason.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cli import CLI
from otlp_receiver import otlp_receiver
from rtx_builds import import_rtx, write_residual
from trt_otel import read_journal
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.core.attempts import attempt_of
from trt_otel.core.events import BuildFinished, BuildStarted, Outcome

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_real_ladders_second_rung_builds_after_the_first_timed_out(tmp_path: Path) -> None:
    import_rtx()
    # The residual net spends seconds in one silent step, whatever the machine: its first
    # attempt surely outlives a 1 s timeout (and is stopped after a 1 s grace).
    model = write_residual(tmp_path / "residual.onnx")
    engine, journal = tmp_path / "residual.engine", tmp_path / "ladder.jsonl"
    with otlp_receiver() as receiver:
        done = subprocess.run(
            [*CLI, "build", str(model), "-o", str(engine), "--no-progress", "--no-gpu",
             "--shapes", RESIDUAL_SHAPES, "--journal", str(journal), "--timeout", "1s",
             "--grace", "1s", "--retry", "--timeout 5m --builder-optimization-level 0",
             "--otlp-endpoint", f"http://127.0.0.1:{receiver.http_port}",
             "--otlp-protocol", "http/protobuf"],
            check=False, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        spans = receiver.wait_for(2, timeout_s=30)
    assert "attempt 1 of 2 ended in timeout (timeout)" in done.stderr
    assert "built by attempt 2 of 2" in done.stderr
    assert engine.stat().st_size > 0
    events = read_journal(journal).events
    first, second = (e for e in events if isinstance(e, BuildStarted))
    assert [e.outcome for e in events if isinstance(e, BuildFinished)] == [
        Outcome.TIMEOUT,
        Outcome.SUCCESS,
    ]
    attempt = attempt_of(second.attributes)
    assert attempt is not None and attempt.previous_build_id == first.build_id
    builds = {s.attributes["trt.build.id"]: s for s in spans if "trt.build.id" in s.attributes}
    earlier, later = builds[first.build_id], builds[second.build_id]
    assert later.links == ((earlier.trace_id, earlier.span_id),)
    assert earlier.attributes["cicd.pipeline.result"] == "timeout"
    assert later.attributes["cicd.pipeline.result"] == "success"
    assert later.attributes["trt.retry.previous_build_id"] == first.build_id
