"""What the views say about a build that is silent, being stopped, stopped, or never ended: a
heartbeat in plain lines and the live view while TensorRT is silent, no full bar for a build
that did not finish, no ETA while cancelling, messages printed above the live tree, and a
replay that says plainly when the record has no end."""

from __future__ import annotations

import io
import re
import signal
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from cli import CLI
from trt_otel import BuildMonitor, ManualClock
from trt_otel.core.eta import Estimate
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.console import LiveConsole, render_build
from trt_otel.views.terminal import warn
from waiting import wait_for_text


def text_of(renderable: object, width: int = 120) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


def cancelled_midway() -> tuple[BuildMonitor, ReadModel]:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("Building engine", None, 4)
    monitor.step_complete("Building engine", 0)
    monitor.phase_start("Determining refit engines", "Building engine", 10)
    monitor.step_complete("Determining refit engines", 4)
    monitor.cancel("enough", source="user")
    model = ReadModel()
    model.handle(monitor.log.recent())
    return monitor, model


def test_a_cancelled_build_does_not_draw_a_full_bar() -> None:
    monitor, model = cancelled_midway()
    monitor.end()
    model = ReadModel()
    model.handle(monitor.log.recent())
    assert model.state.outcome is not None
    ratio = model.state.progress_ratio()
    assert 0.3 < ratio < 0.4, ratio  # (1 + 5/10) / 4 steps of the root
    header = text_of(render_build(model)).splitlines()[0]
    assert header.startswith("build cancellation") and "100%" not in header and "38%" in header


def test_no_eta_while_cancelling() -> None:
    _, model = cancelled_midway()
    eta = Estimate(seconds=42.0, basis="steps", unknown="")
    header = text_of(render_build(model, eta=eta)).splitlines()[0]
    assert header.startswith("cancelling") and "ETA" not in header


def test_the_live_view_says_how_long_tensorrt_has_been_silent_and_where() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    model = ReadModel()
    out = io.StringIO()
    view = LiveConsole(model, Console(file=out, width=120, color_system=None), clock=clock)
    model.subscribe(view)
    monitor.phase_start("Building engine", None, 6)
    monitor.phase_start("Determining refit engines", "Building engine", 1)
    model.handle(monitor.log.recent())
    try:
        clock.advance(5)
        assert "silent for" not in text_of(view._renderable())
        clock.advance(75)
        header = text_of(view._renderable(), width=250).splitlines()[0]
    finally:
        view.close()
    assert "silent for 1m20s in Determining refit engines" in header


def test_a_warning_printed_mid_build_lands_above_the_live_tree() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    model = ReadModel()
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    view = LiveConsole(model, console, clock=clock)
    model.subscribe(view)
    monitor.phase_start("Building engine", None, 6)
    model.handle(monitor.log.recent())  # the live display starts
    try:
        warn("spans: the collector at http://localhost:4317 is unreachable")
    finally:
        view.close()
    assert "trt-otel: warning: spans: the collector at http://localhost:4317" in out.getvalue()


@pytest.mark.e2e
def test_plain_lines_keep_a_heartbeat_through_a_silent_window(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "4", "--silence", "25s"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    beats = re.findall(r"… silent for (\S+) in ([^(]+) \(", result.stderr)
    assert len(beats) >= 2, result.stderr
    assert beats[0][0].startswith("1") and beats[1][0].startswith("2"), beats  # 1x.xs, 2x.xs
    assert all(phase.strip() for _, phase in beats)


@pytest.mark.e2e
def test_replay_says_plainly_that_a_killed_build_never_ended(tmp_path: Path) -> None:
    journal = tmp_path / "k9.jsonl"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--journal", str(journal), "--silence", "2m"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_text(journal, b"Optimizing graph", timeout_s=60)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    result = subprocess.run(
        [*CLI, "replay", str(journal)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 4, result.stderr  # a build with no end did not build
    assert f"trt-otel: {journal}: the build never ended: its record stops" in result.stderr
    assert "its writer died or was stopped before the end" in result.stderr
    assert "build never ended" in result.stdout
    assert "building" not in result.stdout
