"""The live view and the plain lines make a real TensorRT-RTX silent window visible: that
TensorRT is silent, inside which phase, and for how long. Checked on a journal recorded from a
real build (``tests/data/``, no builder needed): its longest silence is the one step of
"Determining refit engines".
"""

from __future__ import annotations

import io
import itertools
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from cli import CLI
from journals import DATA, read_clean
from rtx_builds import SILENT_PHASE, import_rtx, write_conv
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.events import Event, LogMessage, PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.console import LiveConsole, PlainLines, render_build
from waiting import wait_until

SUCCESS = DATA / "rtx-residual400-success.jsonl"


def before_the_silence(events: list[Event]) -> list[Event]:
    """The events up to the longest time between two callbacks (read here, independently of
    the console): the build as it stood when TensorRT went silent."""
    callbacks = [
        (i, e) for i, e in enumerate(events)
        if isinstance(e, PhaseStarted | StepCompleted | PhaseFinished)
    ]  # fmt: skip
    gap_s, index = max(
        ((b.mono_ns - a.mono_ns) / 1e9, j) for (_, a), (j, b) in itertools.pairwise(callbacks)
    )
    ended_by = events[index]
    assert isinstance(ended_by, StepCompleted) and ended_by.name == SILENT_PHASE
    assert gap_s > 1.0, "the recorded build has a real silent window"
    return events[:index]


def test_the_live_view_says_the_real_silent_step_and_how_long() -> None:
    model = ReadModel()
    model.handle(before_the_silence(read_clean(SUCCESS, contiguous=False).events))

    def header(silent_s: float) -> str:
        console = Console(file=io.StringIO(), width=200, color_system=None)
        console.print(render_build(model, silent_s=silent_s))
        return console.file.getvalue().splitlines()[0]  # type: ignore[attr-defined, no-any-return]

    assert header(42).endswith(f"silent for 42.0s in {SILENT_PHASE}")
    assert "silent" not in header(1)


def test_plain_lines_keep_a_heartbeat_through_the_real_silent_step() -> None:
    model, stream = ReadModel(), io.StringIO()
    lines = PlainLines(model, stream, heartbeat_s=0.2)
    model.subscribe(lines)
    model.handle(before_the_silence(read_clean(SUCCESS, contiguous=False).events))
    wait_until(
        lambda: "… silent for" in stream.getvalue(), "no heartbeat while TensorRT was silent", 10
    )
    model.close()
    beat = next(line for line in stream.getvalue().splitlines() if "… silent for" in line)
    assert f" in {SILENT_PHASE} (" in beat


@pytest.mark.e2e
def test_tensorrt_s_own_error_is_on_the_failure_line_of_a_real_failed_build(
    tmp_path: Path,
) -> None:
    """A real TensorRT-RTX build that returns no engine: shapes for 3 channels on a model of 8
    (the parser takes them, the builder refuses them). Its logger's error, recorded in the
    journal, is the reason the terminal gives, in the plain lines and in the live view."""
    import_rtx()
    model, journal = write_conv(tmp_path / "conv.onnx"), tmp_path / "conv.jsonl"
    done = subprocess.run(
        [*CLI, "build", str(model), "-o",
         str(tmp_path / "conv.engine"), "--journal", str(journal), "--no-progress", "--no-gpu",
         "--shapes", "input:1x3x16x16,1x3x16x16,1x3x16x16"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    events = read_clean(journal, contiguous=False).events
    errors = [e.message for e in events if isinstance(e, LogMessage) and e.severity == "ERROR"]
    assert errors and "Dimension mismatch for tensor input" in errors[-1], errors
    failure = next(line for line in done.stderr.splitlines() if "build failure in" in line)
    assert failure.endswith(f"TensorRT returned no engine; TensorRT: {errors[-1]}"), failure

    model_ = ReadModel()
    out = io.StringIO()
    model_.subscribe(LiveConsole(model_, Console(file=out, width=400, color_system=None)))
    model_.handle(events)
    model_.close()
    assert f"TensorRT: {errors[-1]}" in out.getvalue(), out.getvalue()


def test_a_builder_error_reaches_the_terminal_escaped() -> None:
    monitor = BuildMonitor()
    monitor.start()
    monitor.log_message("ERROR", "\x1b[2J\x1b[1;32mbuild success\x1b[0m\nFAKE: all done")
    monitor.end_with_result(None)
    model = ReadModel()
    out = io.StringIO()
    model.subscribe(PlainLines(model, out, heartbeat_s=None))
    model.handle(monitor.log.recent())
    model.close()
    text = out.getvalue()
    assert "\x1b" not in text and "\nFAKE" not in text, text
    assert "TensorRT: \\x1b[2J\\x1b[1;32mbuild success" in text, text
