"""Every figure of the reports at its value: one crafted build (a manual clock, so the same
events every run) rendered as markdown, as the HTML page and as a Chrome trace, each compared
whole with the copy kept in ``tests/data/golden/``. A figure that changes (a unit, a share, a
bound, an order, what a cancelled build reports) changes the output; the diff shows where.

After a change meant to alter the reports, write the copies again and read their diff:
``TRT_OTEL_WRITE_GOLDEN=1 pytest tests/test_report_golden.py``."""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from journals import DATA
from trt_otel import BuildMonitor, ManualClock
from trt_otel.core.events import GpuSample, ProcessSample
from trt_otel.views.report.chrome_trace import chrome_trace
from trt_otel.views.report.html import render_html
from trt_otel.views.report.markdown import render_markdown
from trt_otel.views.report.model import BuildReport, report_of

GOLDEN = DATA / "golden"
WRITE = os.environ.get("TRT_OTEL_WRITE_GOLDEN") == "1"
GIB = 1 << 30


def crafted_report() -> BuildReport:
    """A build of every kind of row: a silent set-up before the first phase, nested phases, a
    phase repeated under one parent (folded), a silent step, steps, samples of the builder's
    process and its GPU, a warning, and a cancel that TensorRT honours at its next step,
    unwinding what is open."""
    clock = ManualClock()
    monitor = BuildMonitor(
        clock=clock,
        build_id="0af7651916cd43dd8448eb211c80319c",
        attributes={"trt.backend": "tensorrt-rtx", "model.path": "resnet.onnx"},
    )
    monitor.start()

    def sample(cpu: float, rss_gib: float, gpu: float) -> None:
        monitor.sample(
            ProcessSample, pid=42, status="running", cpu_percent=cpu, rss_bytes=int(rss_gib * GIB)
        )
        monitor.sample(GpuSample, index=0, utilization=gpu, memory_used_bytes=int(rss_gib * GIB))

    clock.advance(6.0)  # the set-up (parsing the model): silent, before the first phase
    monitor.phase_start("Building engine", None, 3)
    monitor.phase_start("Optimizing graph", "Building engine", 4)
    for step in range(4):
        clock.advance(0.5)
        monitor.step_complete("Optimizing graph", step)
    monitor.phase_finish("Optimizing graph")
    sample(95.0, 1.5, 0.25)
    for seconds in (1.0, 3.0, 2.0):  # folded: three of one name under one parent
        monitor.phase_start("Timing tactics", "Building engine", 1)
        clock.advance(seconds)
        monitor.step_complete("Timing tactics", 0)
        monitor.phase_finish("Timing tactics")
        sample(180.0, 2.0 + seconds / 4, 0.75)
    monitor.log_message("warning", "tactic 7 skipped: out of workspace")
    monitor.phase_start("Determining refit engines", "Building engine", 2)
    clock.advance(30.0)  # silent: no callback for 30 s
    sample(100.0, 3.0, 1.0)
    monitor.step_complete("Determining refit engines", 0)
    monitor.cancel("over its deadline", source="deadline", timeout=True)
    clock.advance(1.5)
    monitor.step_complete("Determining refit engines", 1)
    monitor.end()
    return report_of(monitor.log.recent())


RENDERINGS: dict[str, Callable[[BuildReport], str]] = {
    "report.md": lambda report: render_markdown([report], "a crafted build"),
    "report.html": lambda report: render_html([report], "a crafted build"),
    "trace.json": lambda report: (
        json.dumps(chrome_trace([report]), indent=1, sort_keys=True) + "\n"
    ),
}


@pytest.mark.parametrize("name", sorted(RENDERINGS))
def test_the_reports_of_a_crafted_build_are_the_ones_kept(name: str) -> None:
    rendered = RENDERINGS[name](crafted_report())
    kept = GOLDEN / name
    if WRITE:
        kept.write_text(rendered, encoding="utf-8")
    expected = kept.read_text(encoding="utf-8")
    if rendered != expected:
        changed = difflib.unified_diff(
            expected.splitlines(), rendered.splitlines(), str(kept), "now", lineterm="", n=1
        )
        pytest.fail("\n".join(list(changed)[:80]), pytrace=False)


def test_the_kept_copies_are_those_of_this_test() -> None:
    """Nothing in the folder that no rendering writes (a copy left from a removed one)."""
    assert sorted(p.name for p in Path(GOLDEN).iterdir()) == sorted(RENDERINGS)
