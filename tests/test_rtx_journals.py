"""Journals recorded from real TensorRT-RTX builds (``tests/data/``, see its README), read with
no builder at all: their record, their replay into spans, ``watch``'s exit codes, the
dashboard's queries over a replay of one, and the simulator's TensorRT-RTX shape against them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from cli import CLI
from journals import DATA, read_clean
from otlp_receiver import OtlpReceiver
from prometheus_server import PrometheusServer, free_port
from rtx_builds import SILENT_PHASE, callbacks_of
from trt_otel import read_journal
from trt_otel.builder.simulator import generate_rtx_plan
from trt_otel.core.events import BuildFinished, BuildStarted, PhaseStarted

JOURNALS = sorted(DATA.glob("rtx-*.jsonl"))
DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "trt-otel.json"


@pytest.mark.parametrize("path", JOURNALS, ids=[p.name for p in JOURNALS])
def test_each_recorded_journal_names_its_real_builder(path: Path) -> None:
    journal = read_journal(path)
    assert journal.problems == []
    start, end = journal.events[0], journal.events[-1]
    assert isinstance(start, BuildStarted) and isinstance(end, BuildFinished)
    assert start.attributes["trt.backend"] == "tensorrt-rtx"
    assert start.attributes["trt.version"] == "1.7.1.116"


@pytest.mark.parametrize("name", ["rtx-conv8-success.jsonl", "rtx-residual400-success.jsonl"])
def test_the_simulators_tensorrt_rtx_shape_is_the_recorded_one(name: str) -> None:
    recorded = callbacks_of(read_clean(DATA / name, contiguous=False).events)
    cloning = next(c for c in recorded if c[:2] == ("phase_start", "Cloning network graph"))
    plan = generate_rtx_plan(int(cloning[3]) - 2)
    simulated = [
        (c.kind, c.name, c.parent, c.num_steps) if c.kind == "phase_start"
        else (c.kind, c.name, c.step) if c.kind == "step_complete"
        else (c.kind, c.name)
        for c in plan
    ]  # fmt: skip
    assert simulated == recorded


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("rtx-conv8-success.jsonl", 0),
        ("rtx-residual400-cancelled.jsonl", 3),
        ("rtx-parser-failure.jsonl", 4),
    ],
)
def test_watching_a_recorded_journal_gives_the_builds_exit_code(name: str, code: int) -> None:
    result = subprocess.run(
        [*CLI, "watch", str(DATA / name), "--no-progress"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == code, result.stderr


@pytest.mark.e2e
def test_a_replayed_cancelled_build_ends_its_spans_inside_the_silent_window(
    receiver: OtlpReceiver,
) -> None:
    name = "rtx-residual400-cancelled.jsonl"
    events = read_clean(DATA / name, contiguous=False).events
    result = subprocess.run(
        [*CLI, "replay", str(DATA / name), "--otlp-endpoint",
         f"http://127.0.0.1:{receiver.grpc_port}", "--otlp-protocol", "grpc"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr  # cancelled, as watch says it
    phases = Counter(e.name for e in events if isinstance(e, PhaseStarted))
    spans = receiver.wait_for_final(sum(phases.values()) + 1)
    (build,) = [s for s in spans if not s.parent_span_id]
    assert build.attributes["trt.backend"] == "tensorrt-rtx"
    assert build.attributes["cicd.pipeline.result"] == "cancellation"
    assert "stopped with SIGTERM" in build.attributes["trt.build.outcome_detail"]
    assert Counter(s.name for s in spans if s.parent_span_id) == phases
    # Killed inside the silent step: TensorRT refused no step (it never reached one), and the
    # step's phase and its ancestors never got a phase_finish; each says so.
    assert not [s for s in spans if s.attributes.get("trt.phase.cancelled")]
    aborted = {s.name for s in spans if s.attributes.get("trt.phase.status") == "aborted"}
    assert aborted == {
        SILENT_PHASE, "Computing profile costs", "Building engine from subgraph",
        "Building engine",
    }  # fmt: skip
    (refit,) = [s for s in spans if s.name == SILENT_PHASE]
    assert refit.attributes["trt.phase.steps_completed"] == 0


@pytest.mark.e2e
def test_the_dashboard_has_data_for_a_replayed_real_build(tmp_path: Path) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus package is not installed (.ci/run installs it)")
    exporter = free_port()
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{exporter}")
    try:
        process = subprocess.Popen(
            [*CLI, "demo", "--trace", str(DATA / "rtx-residual400-success.jsonl"),
             "--speed", "2", "--no-progress", "--no-gpu", "--prometheus-port", str(exporter),
             "--prometheus-linger", "10s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        silent = f'trt_build_phase_steps{{phase="{SILENT_PHASE}"}} == 1'
        assert prometheus.wait_for(silent, timeout_s=60)
        dashboard = json.loads(DASHBOARD.read_text())
        expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
        # No GPU on the recording machine, and no cancel in this build: those panels are empty.
        wanted = [e for e in expressions if "gpu" not in e and "cancellations" not in e]
        assert wanted
        assert [e for e in wanted if not prometheus.wait_for(e, timeout_s=5)] == []
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
        prometheus.close()
