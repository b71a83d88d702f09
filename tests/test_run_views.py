"""The views of a run of several builds: spans (one trace: the run's span, its builds under it),
the HTTP view (the current build, a cancel of it, one event stream across builds) and the
metrics (builds by outcome)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from cli import CLI
from otlp_receiver import OtlpReceiver
from runs import PROGRAMS, PYTHON, builds_in, residual_net, start_of
from trt_otel import read_journal
from trt_otel.core.events import CancelRequested
from waiting import wait_for_journal, wait_until

pytestmark = pytest.mark.e2e

pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install -e '.[dev]')")

TOKEN = "run-views-token"


def test_the_builds_of_a_run_are_children_of_its_span_in_the_jobs_trace(
    mnist: Path, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    journal, seen = tmp_path / "run.jsonl", tmp_path / "traceparent"
    job_trace, job_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    result = subprocess.run(
        [*CLI, "run", "--journal", str(journal), "--otlp-endpoint",
         f"http://127.0.0.1:{receiver.http_port}", "--", PYTHON,
         str(PROGRAMS / "traced_build.py"), str(seen), str(mnist), str(mnist), str(mnist)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "TRACEPARENT": f"00-{job_trace}-{job_span}-01",
             "TRACESTATE": "ci=github"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    builds = builds_in(read_journal(journal).events)
    spans = receiver.wait_for_final(1 + 3 * 13)
    assert {s.trace_id for s in spans} == {job_trace}, "one trace: the CI job's"
    (run_span,) = [s for s in spans if s.name.startswith("RUN ")]
    assert run_span.kind == 2, "SERVER: a pipeline run"
    assert run_span.parent_span_id == job_span
    assert run_span.attributes["cicd.pipeline.action.name"] == "RUN"
    assert run_span.attributes["cicd.pipeline.result"] == "success"
    roots = sorted(
        (s for s in spans if s.parent_span_id == run_span.span_id), key=lambda s: s.start_ns
    )
    assert [r.attributes["network.name"] for r in roots] == ["net1", "net2", "net3"]
    assert [r.attributes["trt.build.id"] for r in roots] == [start_of(b).build_id for b in builds]
    for root in roots:
        (engine,) = [
            s for s in spans if s.name == "Building engine" and s.parent_span_id == root.span_id
        ]
        assert engine.start_ns >= root.start_ns
    # The program was handed the run's span as its parent, and the job's trace state.
    traceparent, tracestate = seen.read_text().splitlines()
    assert traceparent == f"00-{job_trace}-{run_span.span_id}-01"
    assert tracestate == "ci=github"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def _cancel(base: str) -> int:
    request = urllib.request.Request(
        f"{base}/cancel", b"from the test", {"Authorization": f"Bearer {TOKEN}"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def test_http_and_metrics_show_the_current_build_count_builds_and_cancel_the_one_running(
    mnist: Path, tmp_path: Path
) -> None:
    gate, journal = tmp_path / "gate", tmp_path / "run.jsonl"
    second = residual_net(400, tmp_path)  # its silent step leaves time for the cancel
    process = subprocess.Popen(
        [*CLI, "run", "--journal", str(journal), "--http-port", "0", "--cancel-token", TOKEN,
         "--prometheus-port", "0", "--prometheus-linger", "0", "--grace", "10m", "--",
         PYTHON, str(PROGRAMS / "between.py"), str(mnist), str(gate), str(second)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert process.stderr is not None
    stderr = process.stderr
    reader = threading.Thread(target=lambda: lines.extend(stderr), daemon=True)
    reader.start()
    try:
        wait_for_journal(journal, process, "build_end")
        text = "".join(lines)
        base = re.search(r"http: (http://\S+)/status", text)
        metrics = re.search(r"metrics: (http://\S+/metrics)", text)
        assert base is not None and metrics is not None, text
        scraped = _get(metrics[1])
        assert 'trt_run_builds_total{outcome="success"} 1.0' in scraped
        assert "trt_run_builds_started_total 1.0" in scraped
        first_id = start_of(builds_in(read_journal(journal).events)[0]).build_id
        assert f'"build_id": "{first_id}"' in _get(f"{base[1]}/status").replace('":"', '": "')

        stream: list[str] = []

        def follow() -> None:
            with urllib.request.urlopen(f"{base[1]}/events", timeout=60) as response:
                stream.extend(line.decode() for line in response)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        gate.touch()
        wait_until(
            lambda: read_journal(journal).events[-1].type != "build_end",
            "the second build never started",
            60,
        )
        status = json.loads(_get(f"{base[1]}/status"))
        second_id = start_of(builds_in(read_journal(journal).events)[1]).build_id
        assert (status["build_id"], status["outcome"]) == (second_id, None)
        assert _cancel(base[1]) == 202  # accepted: TensorRT stops at its next step
        stdout, _ = process.communicate(timeout=120)
        follower.join(30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 3, "".join(lines)
    assert "result 1: engine" in stdout.splitlines()
    assert "result 2: None" in stdout.splitlines()
    _, cancelled = builds_in(read_journal(journal).events)
    assert cancelled[-1].type == "build_end"
    assert [e.source for e in cancelled if isinstance(e, CancelRequested)] == ["http"]
    events = [line.removeprefix("event: ").strip() for line in stream if line.startswith("event:")]
    assert events.count("build_start") == 2, "the stream went on across the builds"
    assert events.count("build_end") == 2
