"""GPU telemetry, with NVML's reader replaced by a recorded series (no GPU here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from nvml_standin import fake_nvml
from prometheus_server import promtool_lint
from trt_otel import BuildMonitor, GpuSample, read_journal
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.capture.gpu import GpuReading, GpuSampler, NvmlReader, open_reader, selected_gpu
from trt_otel.core.clock import ManualClock
from trt_otel.core.events import Event, PhaseFinished, PhaseStarted
from trt_otel.core.journal import JournalWriter
from trt_otel.testing import CollectingFollower
from trt_otel.views.spans import SpanProjection, SpanRecord
from waiting import wait_until

GIB = 2**30


class RecordedReader:
    """Plays back a recorded series of readings; raises at the given reads."""

    index = 0

    def __init__(self, series: list[GpuReading], fail_at: frozenset[int] = frozenset()) -> None:
        self.series = series
        self.fail_at = fail_at
        self.reads = 0
        self.closed = False
        self.held: dict[int, int] = {}
        """GPU memory by process id."""

    def read(self) -> GpuReading:
        at = self.reads
        self.reads += 1
        if at in self.fail_at:
            raise RuntimeError("GPU is lost")
        return self.series[at % len(self.series)]

    def process_memory_bytes(self, pid: int) -> int | None:
        return self.held.get(pid)

    def describe(self) -> dict[str, Any]:
        return {"gpu.index": 0, "gpu.name": "NVIDIA H200"}

    def close(self) -> None:
        self.closed = True


def rising_series(count: int) -> list[GpuReading]:
    """Memory and utilization rising, as a build's tactic timing drives them."""
    return [
        GpuReading(
            memory_used_bytes=(2 + i) * GIB,
            memory_total_bytes=141 * GIB,
            utilization=min(1.0, i / count),
            memory_utilization=0.1,
            sm_clock_hz=1_980_000_000,
            memory_clock_hz=3_201_000_000,
            power_w=100.0 + 5 * i,
            temperature_c=40.0 + i / 10,
        )
        for i in range(count)
    ]


def sampled_build(reader: RecordedReader, warnings: list[str]) -> tuple[BuildMonitor, list[Event]]:
    """A simulated build in virtual time, sampled once per virtual second."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    collector = CollectingFollower()
    monitor.log.follow(collector, min_interval_s=0.0)
    sampler = GpuSampler(monitor, reader, interval_s=1.0, warn=warnings.append)
    next_sample = [0.0]
    elapsed = [0.0]

    def sleep(seconds: float) -> None:
        clock.advance(seconds)
        elapsed[0] += seconds
        while elapsed[0] >= next_sample[0]:
            sampler.sample_once()
            next_sample[0] += 1.0

    monitor.start()
    Driver(speed=1.0, sleep=sleep).run(monitor, generate_plan(13, seed=2))
    monitor.end()
    monitor.close()
    return monitor, collector.events


def test_each_span_gets_the_peak_memory_and_mean_utilization_while_it_was_open() -> None:
    reader = RecordedReader(rising_series(40))
    monitor, events = sampled_build(reader, [])
    samples = [e for e in events if isinstance(e, GpuSample)]
    assert len(samples) >= 15, "one a virtual second"
    projection = SpanProjection()
    spans: list[SpanRecord] = [s for e in events for s in projection.apply(e)]
    # The expectation, read straight from the events: samples between each phase's start and
    # its finish.
    open_since: dict[str, int] = {}
    expected: dict[int, list[GpuSample]] = {}
    for event in events:
        if isinstance(event, PhaseStarted):
            open_since[event.name] = event.seq
            expected[event.seq] = []
        elif isinstance(event, PhaseFinished):
            open_since.pop(event.name, None)
        elif isinstance(event, GpuSample):
            for seq in open_since.values():
                expected[seq].append(event)
    by_start = {span.start_ns: span for span in spans}
    checked = 0
    for phase in monitor.state.phases.values():
        seen = expected[phase.id]
        span = by_start[phase.start_wall_ns]
        if not seen:
            assert "gpu.samples" not in span.attributes
            continue
        checked += 1
        peak = max(s.memory_used_bytes for s in seen if s.memory_used_bytes is not None)
        mean = sum(s.utilization or 0.0 for s in seen) / len(seen)
        assert span.attributes["gpu.samples"] == len(seen)
        assert span.attributes["gpu.memory.peak_bytes"] == peak
        assert span.attributes["gpu.utilization.mean"] == pytest.approx(mean)
    assert checked >= 3
    build_span = spans[-1]
    assert build_span.attributes["gpu.samples"] == len(samples)
    assert build_span.attributes["gpu.memory.peak_bytes"] == max(
        s.memory_used_bytes or 0 for s in samples
    )


def test_a_failing_reader_costs_samples_not_the_build() -> None:
    warnings: list[str] = []
    reader = RecordedReader(rising_series(10), fail_at=frozenset({0, 3, 4, 5}))
    monitor, events = sampled_build(reader, warnings)
    samples = [e for e in events if isinstance(e, GpuSample)]
    assert monitor.state.outcome is not None and monitor.state.outcome.value == "success"
    assert len(samples) == reader.reads - 4
    assert len(warnings) == 1 and "GPU is lost" in warnings[0]


def test_the_sampler_thread_samples_and_stops(tmp_path: Path) -> None:
    reader = RecordedReader(rising_series(5))
    monitor = BuildMonitor()
    with GpuSampler(monitor, reader, interval_s=0.01) as sampler:
        monitor.start()
        wait_until(lambda: sampler.samples >= 5, "the sampler's thread never sampled 5 times", 30)
    count = sampler.samples
    assert reader.closed
    assert monitor.state.gpu is not None and monitor.state.gpu.index == 0
    assert sum(1 for e in monitor.log.recent() if isinstance(e, GpuSample)) == count
    with pytest.raises(ValueError, match="longer than 0s"):
        GpuSampler(monitor, reader, interval_s=0)


@pytest.mark.e2e
def test_gauges_show_the_latest_sample_and_pass_promtool() -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from trt_otel.views.prometheus import MetricSources, MetricsServer, metrics_registry

    reader = RecordedReader([GpuReading(memory_used_bytes=5 * GIB, utilization=0.5)])
    monitor = BuildMonitor()
    server = MetricsServer(metrics_registry(MetricSources(monitor)), 0)
    try:
        monitor.start()
        GpuSampler(monitor, reader).sample_once()
        text = generate_latest(server.registry).decode()
    finally:
        server.close()
    values = {
        (sample.name, sample.labels.get("gpu")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert values[("trt_build_gpu_memory_used_bytes", "0")] == 5 * GIB
    assert values[("trt_build_gpu_utilization_ratio", "0")] == 0.5
    assert "trt_build_gpu_power_watts" not in text, "not reported, so not shown as 0"
    if shutil.which("promtool"):
        assert promtool_lint(text) == ""


def test_samples_survive_the_journal(tmp_path: Path) -> None:
    reader = RecordedReader([GpuReading(memory_used_bytes=GIB, temperature_c=51.0)])
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(tmp_path / "gpu.jsonl"))
    monitor.start()
    sample = GpuSampler(monitor, reader).sample_once()
    monitor.end()
    monitor.close()
    (recorded,) = [e for e in read_journal(tmp_path / "gpu.jsonl").events if e.type == "gpu"]
    assert recorded == sample
    assert isinstance(recorded, GpuSample) and recorded.power_w is None


@pytest.mark.e2e
def test_without_nvml_sampling_is_off_with_one_line_saying_why() -> None:
    reader, line = open_reader("0")
    if reader is not None:
        reader.close()
        pytest.skip("this machine has a GPU and a driver")
    assert line.startswith("gpu: no telemetry: ")
    if not Path("/proc/driver/nvidia").exists():  # no driver at all: a CPU-only machine
        assert "no NVIDIA driver on this machine" in line and "NVML" in line, line
    result = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert result.stderr.count("gpu: no telemetry") == 1
    quiet = subprocess.run(
        [
            *CLI,
            "demo",
            "--speed",
            "0",
            "--no-progress",
            "--no-gpu",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert quiet.returncode == 0 and "gpu:" not in quiet.stderr


def test_the_gpu_follows_cuda_visible_devices() -> None:
    assert selected_gpu({}) == "0"
    assert selected_gpu({"CUDA_VISIBLE_DEVICES": "3,1"}) == "3"
    uuid = "GPU-8a7e0c2c-51b1-4b9e-9c3f-111111111111"
    assert selected_gpu({"CUDA_VISIBLE_DEVICES": uuid}) == uuid


def test_the_builders_own_gpu_memory_joins_the_sample_once_its_process_is_known(
    tmp_path: Path,
) -> None:
    reader = RecordedReader([GpuReading(memory_used_bytes=5 * GIB)])
    reader.held = {4242: 3 * GIB}
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(tmp_path / "gpu.jsonl"))
    monitor.start()
    sampler = GpuSampler(monitor, reader)
    before = sampler.sample_once()
    sampler.watch(4242)
    after = sampler.sample_once()
    sampler.watch(1)  # a process that holds nothing on this GPU
    none_held = sampler.sample_once()
    monitor.end()
    monitor.close()
    assert before is not None and before.process_memory_used_bytes is None
    assert after is not None and after.process_memory_used_bytes == 3 * GIB
    assert none_held is not None and none_held.process_memory_used_bytes is None
    recorded = [e for e in read_journal(tmp_path / "gpu.jsonl").events if e.type == "gpu"]
    assert recorded == [before, after, none_held]


def test_nvmls_units_become_the_samples_and_what_a_gpu_does_not_say_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MHz become Hz, milliwatts watts, percentages fractions; a reading the device does not
    support is None, never a failed sample."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    reader = NvmlReader("0")
    assert reader.read() == GpuReading(
        memory_used_bytes=5 * GIB,
        memory_total_bytes=80 * GIB,
        utilization=0.75,
        memory_utilization=0.2,
        sm_clock_hz=1_980_000_000,
        memory_clock_hz=2_619_000_000,
        power_w=350.5,
        temperature_c=61.0,
    )
    reader.close()
    silent = fake_nvml(frozenset({"nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"}))
    monkeypatch.setitem(sys.modules, "pynvml", silent)
    reader = NvmlReader("0")
    reading = reader.read()
    reader.close()
    assert (reading.sm_clock_hz, reading.memory_clock_hz, reading.power_w) == (None, None, None)
    assert reading.temperature_c == 61.0
