"""The live tree and the plain lines, rendered from the same fold."""

from __future__ import annotations

import io

from rich.console import Console

from trt_otel import BuildMonitor, ManualClock
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core.durations import format_duration
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.console import MAX_NODES_SHOWN, LiveConsole, PlainLines, render_build


def finished_build() -> BuildMonitor:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)

    def sleep(seconds: float) -> None:
        clock.advance(seconds)

    Driver(speed=1, sleep=sleep).run(monitor, generate_plan(13))
    monitor.end()
    return monitor


def model_of(monitor: BuildMonitor) -> ReadModel:
    model = ReadModel()
    model.handle(monitor.log.recent())
    return model


def render(monitor: BuildMonitor) -> str:
    out = io.StringIO()
    Console(file=out, width=100, force_terminal=False, color_system=None).print(
        render_build(model_of(monitor))
    )
    return out.getvalue()


def test_the_tree_folds_repeated_phases_and_shows_the_outcome() -> None:
    text = render(finished_build())
    lines = text.splitlines()
    assert lines[0].startswith("build success")
    assert "100%" in lines[0]
    assert "✓ Building engine (5 of 6 steps)" in text, "a finished phase must not read as 5/6"
    assert "✓ Optimizing graph (29 of 33 steps)" in text
    assert "Evaluating tactic times ×" in text
    assert len(lines) < 30  # hundreds of tactic measurements, folded


def test_an_open_build_shows_progress_of_open_phases() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("Building engine", None, 6)
    monitor.step_complete("Building engine", 0)
    monitor.phase_start("Cloning network graph", "Building engine", 4)
    monitor.step_complete("Cloning network graph", 0)
    monitor.step_complete("Cloning network graph", 1)
    monitor.cancel("timeout after 15m", source="timeout")
    text = render(monitor)
    assert text.splitlines()[0].startswith("cancelling")
    assert "▶ Building engine" in text and "1/6" in text
    assert "▶ Cloning network graph" in text and "2/4" in text
    assert "cancel requested by timeout: timeout after 15m" in text


def test_plain_lines_show_shallow_phases_and_a_summary() -> None:
    monitor = finished_build()
    out = io.StringIO()
    model = ReadModel()
    model.subscribe(PlainLines(model, out, progress_every_s=5))
    model.handle(monitor.log.recent())
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(f"build started ({monitor.build_id})")
    assert any("▶ Building engine (6 steps)" in line for line in lines)
    assert any("✓ Optimizing graph (29 of 33 steps) in" in line for line in lines)
    assert any("… " in line and "steps; in" in line for line in lines)
    assert "build success in" in lines[-1]
    assert not any("Measuring tactic time" in line for line in lines if "▶" in line)


def test_the_live_console_draws_to_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True)
    monitor = finished_build()
    model = ReadModel()
    model.subscribe(LiveConsole(model, console, refresh_per_second=20))
    model.handle(monitor.log.recent())
    model.close()
    assert "build success" in out.getvalue()


def test_one_step_and_one_phase_read_singular() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.phase_start("Building engine", None, 1)
    monitor.step_complete("Building engine", 0)
    monitor.phase_finish("Building engine")
    monitor.end()
    out = io.StringIO()
    model = ReadModel()
    model.subscribe(PlainLines(model, out, progress_every_s=5))
    model.handle(monitor.log.recent())
    text = out.getvalue() + render(monitor)
    assert "▶ Building engine (1 step)" in text
    assert "✓ Building engine (1 step) in" in text
    assert "(1 step, 1 phase)" in text
    assert "1 steps" not in text and "1 phases" not in text, text


def test_a_finished_build_draws_its_bar_full_and_as_wide_as_a_running_ones() -> None:
    running = BuildMonitor(clock=ManualClock())
    running.phase_start("Building engine", None, 2)
    running.step_complete("Building engine", 0)
    half = render(running).splitlines()[0]
    assert "━" * 10 + "╺" + "─" * 10 in half, half
    full = render(finished_build()).splitlines()[0]
    assert "━" * 21 in full and "╺" not in full, full


def test_a_build_that_ended_before_any_phase_reads_zero_steps_and_phases() -> None:
    monitor = BuildMonitor(clock=ManualClock())
    monitor.start()
    monitor.end()
    out = io.StringIO()
    model = ReadModel()
    model.subscribe(PlainLines(model, out, progress_every_s=5))
    model.handle(monitor.log.recent())
    assert "(0 steps, 0 phases)" in out.getvalue().splitlines()[-1]
    assert render(monitor).splitlines()[0].endswith("0 steps")


def test_durations_read_well() -> None:
    assert [format_duration(s) for s in (0.42, 12.34, 245, 7380)] == [
        "0.4s",
        "12.3s",
        "4m05s",
        "2h03m",
    ]


def test_a_tree_nested_past_the_limit_shows_its_deeper_phases_as_one_line() -> None:
    """A journal nesting phases 100,000 deep must not make a tree whose indentation alone is
    quadratic in the depth: past MAX_TREE_DEPTH levels, one line says there is more."""
    from trt_otel.views.console import MAX_TREE_DEPTH

    monitor = BuildMonitor(clock=ManualClock())
    depth = 3 * MAX_TREE_DEPTH
    parent = None
    for level in range(depth):
        monitor.phase_start(f"p{level}", parent, 1)
        parent = f"p{level}"
    out = io.StringIO()
    Console(file=out, width=10_000, force_terminal=False, color_system=None).print(
        render_build(model_of(monitor))
    )
    text = out.getvalue()
    monitor.close()
    assert f"p{MAX_TREE_DEPTH - 1} " in text
    assert f"p{MAX_TREE_DEPTH} " not in text
    assert f"… phases nested deeper than {MAX_TREE_DEPTH} levels" in text
    assert len(text.splitlines()) <= MAX_TREE_DEPTH + 5


def test_a_phase_with_thousands_of_children_shows_its_first_and_last_and_counts_the_rest() -> None:
    """A journal with 1,000 phases side by side (no real build has them: TensorRT's repeats
    fold into one node) is drawn in a bounded tree: the first hundred, a line counting the
    ones left out, and the last hundred, the open phase being built among them."""
    monitor = BuildMonitor(clock=ManualClock())
    monitor.phase_start("Building engine", None, 1)
    for index in range(1_000):
        monitor.phase_start(f"layer {index}", "Building engine", 1)
        if index < 999:
            monitor.phase_finish(f"layer {index}")
    lines = render(monitor).splitlines()
    shown = [line for line in lines if "layer " in line]
    assert len(shown) == MAX_NODES_SHOWN
    assert "layer 0 " in shown[0] and "layer 99 " in shown[99]
    assert "layer 900 " in shown[100] and "▶ layer 999 " in shown[-1], "the open one is shown"
    assert any("800 phases not shown" in line for line in lines)
