"""The report's figures, each at its value: what a resource line, the top phases' table and the
timeline's bars say of a build made on a manual clock (no process, no browser)."""

from __future__ import annotations

import re

from trt_otel import BuildMonitor, ManualClock
from trt_otel.core.events import GpuSample
from trt_otel.views.report.html import render_html, timeline_svg
from trt_otel.views.report.markdown import headline
from trt_otel.views.report.model import report_of


def test_gpu_utilization_is_drawn_in_percent() -> None:
    """NVML's ratio (0 to 1) is a line in percent, as the builder's CPU is."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    for utilization in (0.25, 0.5):
        clock.advance(1)
        monitor.sample(GpuSample, index=0, utilization=utilization, memory_used_bytes=1 << 30)
    monitor.step_complete("Building engine", 0)
    monitor.phase_finish("Building engine")
    monitor.end()
    report = report_of(monitor.log.recent())
    (line,) = [s for s in report.series if s.name == "GPU 0 utilization"]
    assert line.unit == "%"
    assert [value for _, value in line.points] == [25.0, 50.0]


def test_the_top_phases_share_of_the_build_is_their_self_time() -> None:
    """A 10 s build whose outermost phase spends 8 s in a child: the child's share is 80%,
    the outermost's own 20% (not the 100% its total would say)."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    clock.advance(2)
    monitor.phase_start("Timing tactics", "Building engine", 1)
    clock.advance(8)
    monitor.phase_finish("Timing tactics")
    monitor.phase_finish("Building engine")
    monitor.end()
    page = render_html([report_of(monitor.log.recent())], "t")
    table = page[page.index('<table class="phases">') :]
    shares = dict(
        re.findall(
            r"<b>([^<]+)</b></td><td class=\"num\">[^<]*</td><td class=\"num\">[^<]*</td>"
            r"<td class=\"num\">[^<]*</td><td class=\"num\">([^<]+)</td>",
            table,
        )
    )
    assert shares == {"Timing tactics": "80%", "Building engine": "20%"}


def test_bars_of_one_row_are_merged_only_when_they_ended_alike() -> None:
    """Two instances of a phase back to back (closer than a pixel), the first finished and the
    second unwound by a cancel: two bars, one of each, never one bar of the first's status."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    monitor.phase_start("Timing", "Building engine", 1)
    clock.advance(5)
    monitor.phase_finish("Timing")
    monitor.phase_start("Timing", "Building engine", 1)
    clock.advance(5)
    monitor.cancel("enough", source="user")
    monitor.end()
    svg = timeline_svg(report_of(monitor.log.recent()))
    bars = re.findall(r'<rect class="bar (\w+)"', svg)
    assert sorted(bars) == ["aborted", "aborted", "finished"], bars


def test_the_live_timeline_draws_the_builds_end_at_once_though_it_redraws_once_a_second() -> None:
    """The page polls ``/timeline.svg``; within a second it is served the picture already
    drawn, but never once the build has ended: its end is drawn at once."""
    from trt_otel.core.readmodel import ReadModel
    from trt_otel.views.report.live import LiveTimeline

    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    model = ReadModel()
    timeline = LiveTimeline(model, clock)
    told = -1

    def tell() -> None:
        nonlocal told
        events = monitor.log.recent(told)
        model.handle(events)
        told = events[-1].seq

    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    tell()
    clock.advance(2)
    running = timeline.svg()
    assert re.findall(r'<rect class="bar (\w+)"', running) == ["open"]
    clock.advance(0.2)
    monitor.step_complete("Building engine", 0)
    tell()
    assert timeline.svg() == running, "a step within the second: the same picture"
    clock.advance(0.2)
    monitor.phase_finish("Building engine")
    monitor.end()
    tell()
    ended = timeline.svg()
    assert re.findall(r'<rect class="bar (\w+)"', ended) == ["finished"]


def test_the_live_timeline_draws_a_silent_build_up_to_now_though_no_event_comes() -> None:
    """TensorRT silent and no sample arriving either: each drawing shows the open phase's
    current silence up to now (on the build's clock), not only up to the last event."""
    from trt_otel.core.readmodel import ReadModel
    from trt_otel.views.report.live import LiveTimeline

    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    model = ReadModel()
    timeline = LiveTimeline(model, clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 2)
    monitor.step_complete("Building engine", 0)
    model.handle(monitor.log.recent())
    silences = r"<title>silent for ([\d.]+)s in Building engine</title>"
    clock.advance(2)
    assert re.findall(silences, timeline.svg()) == ["2.0"]
    clock.advance(20)
    assert re.findall(silences, timeline.svg()) == ["22.0"], "drawn again, up to now"
    monitor.close()


def timeline_labels(monitor: BuildMonitor) -> list[str]:
    """The row labels of the timeline of ``monitor``'s build, as drawn."""
    svg = timeline_svg(report_of(monitor.log.recent()))
    return re.findall(r'<text class="label"[^>]*>([^<]*)</text>', svg)


def test_a_nested_phases_label_is_cut_to_fit_beside_its_indent() -> None:
    """The labels' column holds 44 characters, less one a level of nesting: a 42-character
    name fits at the root, and three levels down is cut, with an ellipsis."""
    name = "Computing the costs of every tactic, again"
    assert len(name) == 42
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    parent = None
    for level in ("Building engine", "Optimizing graph", "Timing tactics", name):
        monitor.phase_start(level, parent, 1)
        parent = level
    clock.advance(1)
    for level in (name, "Timing tactics", "Optimizing graph", "Building engine"):
        monitor.phase_finish(level)
    monitor.phase_start(name, None, 1)
    clock.advance(1)
    monitor.phase_finish(name)
    monitor.end()
    labels = timeline_labels(monitor)
    assert labels.count(name) == 1, labels
    assert name[:40] + "…" in labels, labels


def test_a_label_of_exactly_the_columns_width_is_drawn_whole() -> None:
    """At the root the column holds 44 characters: a name of 44 is drawn as it is, one of 45
    is cut to 43 and an ellipsis."""
    fits, too_long = "A" * 44, "B" * 45
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    for name in (fits, too_long):
        monitor.phase_start(name, None, 1)
        clock.advance(1)
        monitor.phase_finish(name)
    monitor.end()
    labels = timeline_labels(monitor)
    assert labels == [fits, "B" * 43 + "…"], labels


def test_the_headline_counts_none_in_the_plural_and_one_in_the_singular() -> None:
    """A build of one phase that finished before its one step: ``0 steps``, ``1 phase``."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    clock.advance(1)
    monitor.phase_finish("Building engine")
    monitor.end()
    line = headline(report_of(monitor.log.recent()))
    assert line.startswith("✅ **success** in 1.0s, 0 steps, 1 phase"), line
