"""``--max-gpu-memory``: the builder's process's own GPU memory, from the GPU samples.

No GPU here: the samples are real ``gpu`` events, made by the real sampler from a recorded
reader (NVML's place) and appended to a real log, folded by the build's state and read by the
real policy runner; the journal of those events decides the same when it is read back. Without
a GPU the option refuses the build before it starts, through the real command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from cli import run_cli
from trt_otel import BuildMonitor, ManualClock, read_journal
from trt_otel.app.arguments import add_policy_options, policy_config
from trt_otel.app.ladder import retry_reason
from trt_otel.app.session import Ended
from trt_otel.capture.gpu import GpuReading, GpuSampler, open_reader
from trt_otel.control.gpu_memory import GpuMemoryGuard
from trt_otel.control.registry import GpuMemoryConfig
from trt_otel.control.runner import PolicyRunner
from trt_otel.core.events import CancelRequested, CancelSource, GpuSample, Outcome
from trt_otel.core.journal import JournalWriter
from trt_otel.core.state import BuildState

GIB = 1 << 30
BUILDER = 4242
"""The builder's process id, as the sampler is told it."""


class RecordedGpu:
    """NVML's place: the GPU's readings, and the memory each process holds on it."""

    index = 0

    def __init__(self) -> None:
        self.used = 70 * GIB
        """The GPU's memory in use, by every process on it."""
        self.held: dict[int, int] = {}

    def read(self) -> GpuReading:
        return GpuReading(memory_used_bytes=self.used, memory_total_bytes=140 * GIB)

    def process_memory_bytes(self, pid: int) -> int | None:
        return self.held.get(pid)

    def describe(self) -> dict[str, Any]:
        return {"gpu.index": 0, "gpu.name": "NVIDIA H200"}

    def close(self) -> None:
        pass


def gpu_build(
    limit: str, journal: Path | None = None
) -> tuple[BuildMonitor, RecordedGpu, GpuSampler, PolicyRunner]:
    """A build with ``--max-gpu-memory limit`` as the command line makes it, its GPU sampled."""
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    policy = policy_config(parser.parse_args(["--max-gpu-memory", limit])).policy()
    assert policy is not None
    monitor = BuildMonitor(clock=ManualClock())
    if journal is not None:
        monitor.log.follow(JournalWriter(journal))
    monitor.start()
    monitor.phase_start("Building engine", None, 6)
    gpu = RecordedGpu()
    sampler = GpuSampler(monitor, gpu, build_open=lambda: monitor.state.outcome is None)
    sampler.watch(BUILDER)
    return monitor, gpu, sampler, PolicyRunner(monitor, policy)


def test_the_option_makes_the_guard_with_its_own_settings() -> None:
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    config = policy_config(parser.parse_args(["--max-gpu-memory", "8GiB"]))
    assert config.more == (GpuMemoryConfig(max_gpu_memory_bytes=8 * GIB),)
    policy = config.policy()
    assert isinstance(policy, GpuMemoryGuard) and policy.describe() == "gpu-memory(max 8.0 GiB)"
    assert config.options_reading("gpu") == ["--max-gpu-memory"]


@pytest.mark.parametrize("limit", [0, -1])
def test_a_limit_of_no_memory_is_refused(limit: int) -> None:
    """The library's guard refuses what the command line's size refuses: a limit every build
    would be over."""
    with pytest.raises(ValueError, match="more than 0 bytes"):
        GpuMemoryGuard(limit)
    assert GpuMemoryGuard(1).max_bytes == 1


def test_the_builders_own_gpu_memory_over_the_limit_cancels_the_build() -> None:
    monitor, gpu, sampler, runner = gpu_build("8GiB")
    gpu.held[BUILDER] = 8 * GIB
    assert sampler.sample_once() is not None
    assert runner.check_now() is None, "at the limit is within it"
    assert monitor.step_complete("Building engine", 0) is True
    gpu.held[BUILDER] = 9 * GIB + 100 * (1 << 20)
    sampler.sample_once()
    decision = runner.check_now()
    assert decision is not None
    cancel = monitor.state.cancel
    assert cancel is not None and cancel.source == "memory" and not cancel.timeout
    assert (
        cancel.reason == "the builder's GPU memory 9.1 GiB (GPU 0) exceeds --max-gpu-memory 8.0 GiB"
    )
    assert cancel.policy == "gpu-memory(max 8.0 GiB)"
    assert monitor.step_complete("Building engine", 1) is False
    assert monitor.end() is Outcome.CANCELLATION


def test_other_processes_memory_on_the_gpu_decides_nothing() -> None:
    monitor, gpu, sampler, runner = gpu_build("1GiB")
    gpu.used = 130 * GIB  # the GPU is nearly full, of others' memory
    gpu.held = {BUILDER + 1: 100 * GIB}
    sample = sampler.sample_once()
    assert sample is not None and sample.process_memory_used_bytes is None
    assert runner.check_now() is None
    gpu.held[BUILDER] = 512 << 20
    sampler.sample_once()
    assert runner.check_now() is None
    assert not monitor.cancelled


def test_before_the_builder_is_known_nothing_is_decided() -> None:
    monitor, gpu, _, runner = gpu_build("1GiB")
    gpu.held[BUILDER] = 4 * GIB
    unwatched = GpuSampler(monitor, gpu)  # told no process yet
    assert unwatched.sample_once() is not None
    assert runner.check_now() is None


def test_the_journal_of_the_samples_decides_the_same_when_read_back(tmp_path: Path) -> None:
    journal = tmp_path / "build.jsonl"
    monitor, gpu, sampler, runner = gpu_build("2GiB", journal)
    for held in (GIB, 2 * GIB, 3 * GIB):
        gpu.held[BUILDER] = held
        sampler.sample_once()
    live = runner.check_now()
    monitor.end()
    monitor.close()
    events = read_journal(journal).events
    samples = [e for e in events if isinstance(e, GpuSample)]
    assert [s.process_memory_used_bytes for s in samples] == [GIB, 2 * GIB, 3 * GIB]
    (cancel,) = [e for e in events if isinstance(e, CancelRequested)]
    assert live is not None and (cancel.reason, cancel.source) == (live.reason, "memory")
    # The recorded samples, folded again up to each one, decide at the same sample.
    guard = GpuMemoryGuard(2 * GIB)
    decided = []
    state = BuildState()
    for event in events:
        if isinstance(event, CancelRequested):
            break
        state.apply(event)
        if isinstance(event, GpuSample):
            decided.append(guard.check(dataclasses.replace(runner.view(), gpu=state.gpu)))
    assert [d is not None for d in decided] == [False, False, True]


def test_a_build_stopped_by_it_is_retried_by_a_ladder() -> None:
    ended = Ended(3, "b", Outcome.CANCELLATION, CancelSource.MEMORY, None, "over")
    assert retry_reason(ended) is not None


# -- no GPU: refused before the build ------------------------------------------------------------


@pytest.fixture
def no_gpu() -> None:
    reader, _ = open_reader()
    if reader is not None:
        reader.close()
        pytest.skip("this machine has a GPU and a driver")


@pytest.mark.usefixtures("no_gpu")
@pytest.mark.e2e
def test_without_a_gpu_the_option_refuses_the_build_in_one_line(tmp_path: Path) -> None:
    journal = tmp_path / "build.jsonl"
    refused = run_cli(
        "demo", "--speed", "0", "--no-progress", "--journal", str(journal),
        "--max-gpu-memory", "8GiB", timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        "trt-otel: error: --max-gpu-memory needs the build's GPU sampled, and no GPU is "
        f"visible: {open_reader()[1].removeprefix('gpu: no telemetry: ')}"
    ]
    assert not journal.exists(), "nothing was started"


@pytest.mark.usefixtures("no_gpu")
@pytest.mark.e2e
def test_run_refuses_it_too_before_the_program_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    refused = run_cli(
        "run", "--max-gpu-memory", "1GiB", "--", sys.executable, "-c",
        f"open({str(marker)!r}, 'w')", timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "--max-gpu-memory needs the build's GPU sampled" in refused.stderr
    assert not marker.exists()


@pytest.mark.e2e
def test_no_gpu_and_the_option_are_refused_together() -> None:
    refused = run_cli(
        "demo", "--speed", "0", "--no-progress", "--no-gpu", "--max-gpu-memory", "8G", timeout=120
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        "trt-otel: error: --max-gpu-memory needs the build's GPU sampled, which --no-gpu turns off"
    ]


@pytest.mark.e2e
def test_watch_which_samples_no_gpu_refuses_it(tmp_path: Path) -> None:
    journal = tmp_path / "build.jsonl"
    made = run_cli(
        "demo", "--speed", "0", "--no-progress", "--no-gpu", "--journal", str(journal), timeout=120
    )
    assert made.returncode == 0, made.stderr
    refused = run_cli(
        "watch", str(journal), "--no-progress", "--control-file", str(tmp_path / "control"),
        "--max-gpu-memory", "8G", timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "--max-gpu-memory needs the build's GPU sampled, and watch does not sample" in (
        refused.stderr
    )


@pytest.mark.e2e
def test_a_size_that_is_no_size_is_refused_by_the_parser() -> None:
    refused = run_cli("demo", "--max-gpu-memory", "0", timeout=120)
    assert refused.returncode == 2
    assert "--max-gpu-memory: '0' must be more than 0 bytes" in refused.stderr
