"""Alive or hung: the builder's process sampled, the verdict folded from the samples, and the
policies that read it (a stall that means it, a memory guard).

The sampler's tests watch real processes (busy, asleep, stopped with SIGSTOP, killed); the fold's
and the policies' tests use a manual clock, so each verdict boundary is exact.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cli import CLI
from trt_otel import BuildMonitor, ManualClock, ProcessSample
from trt_otel.capture.process import ProcessSampler
from trt_otel.control.policies import BuildView, MemoryGuard, Stall, Timeout
from trt_otel.control.runner import PolicyRunner
from trt_otel.core.activity import ACTIVE_CPU_PERCENT, IDLE_AFTER_S, Verdict
from trt_otel.core.events import GpuSample
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.sizes import SizeError, format_bytes, parse_size
from trt_otel.views.prometheus import MetricSources, metrics_registry
from trt_otel.views.spans import SpanProjection
from trt_otel.views.status import status_document
from waiting import wait_until

S = 1_000_000_000
MIB = 1 << 20


def sampled_build(clock: ManualClock) -> BuildMonitor:
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 6)
    return monitor


def sample(monitor: BuildMonitor, status: str = "sleeping", cpu: float = 0.0, rss_mib: int = 300,
           cpu_s: float = 1.0) -> None:  # fmt: skip
    monitor.sample(
        ProcessSample, pid=1234, status=status, cpu_percent=cpu, cpu_seconds=cpu_s,
        rss_bytes=rss_mib * MIB, available_bytes=8 << 30,
    )  # fmt: skip


def test_a_policy_sees_the_builders_latest_sample_field_by_field() -> None:
    """What the memory guard decides by: the process's own memory and the machine's available
    memory, each from its own field of the latest sample."""
    monitor = sampled_build(ManualClock())
    sample(monitor, rss_mib=300)
    view = PolicyRunner(monitor, Timeout(3600.0)).view()
    assert (view.rss_bytes, view.available_bytes) == (300 * MIB, 8 << 30)


def test_cpu_use_is_work_and_its_absence_becomes_idle_after_a_while() -> None:
    clock = ManualClock()
    monitor = sampled_build(clock)
    activity = monitor.state.activity
    assert activity.verdict is None and activity.describe() is None, "nothing sampled yet"
    sample(monitor, "running", cpu=97.0, rss_mib=300, cpu_s=1.0)
    clock.advance(1)
    sample(monitor, "running", cpu=96.0, rss_mib=455, cpu_s=1.96)
    assert activity.verdict is Verdict.WORKING
    assert activity.describe() == "working (CPU 96%, 455 MiB, rising)"
    working_until = clock.mono_ns()
    for blip in range(int(IDLE_AFTER_S)):  # asleep, but not for long enough to be hung
        clock.advance(1)
        # A few ms a second (the process's own housekeeping) is not work.
        sample(monitor, cpu=1.0, rss_mib=455, cpu_s=1.96 + 0.01 * (blip + 1))
        assert activity.verdict is Verdict.WORKING
    clock.advance(1)
    sample(monitor, cpu=0.0, rss_mib=455, cpu_s=1.99)
    assert activity.verdict is Verdict.IDLE
    assert activity.since_mono_ns == working_until, "idle since it was last seen working"
    assert activity.describe() == f"idle for {IDLE_AFTER_S + 1:.1f}s (CPU 0%, 455 MiB)"
    clock.advance(0.2)  # a blip over a short interval is not work either
    sample(monitor, cpu=10.0, rss_mib=455, cpu_s=2.01)
    assert activity.verdict is Verdict.IDLE
    assert activity.peak_rss_bytes == 455 * MIB
    clock.advance(1)
    sample(monitor, "running", cpu=50.0, cpu_s=2.49)
    assert activity.verdict is Verdict.WORKING, "work again is working again"


def test_a_callback_is_work_however_little_cpu_it_took() -> None:
    clock = ManualClock()
    monitor = sampled_build(clock)
    sample(monitor)
    for _ in range(10):
        clock.advance(1)
        monitor.step_complete("Building engine", 0)
        sample(monitor, cpu=0.0)
    assert monitor.state.activity.verdict is Verdict.WORKING


@pytest.mark.parametrize(
    ("status", "verdict", "evidence"),
    [
        ("stopped", Verdict.STOPPED, "SIGSTOP?"),
        ("tracing-stop", Verdict.STOPPED, "SIGSTOP?"),
        ("zombie", Verdict.GONE, "process 1234 zombie"),
        ("gone", Verdict.GONE, "process 1234 gone"),
    ],
)
def test_a_stopped_or_vanished_process_is_said_at_once(
    status: str, verdict: Verdict, evidence: str
) -> None:
    clock = ManualClock()
    monitor = sampled_build(clock)
    sample(monitor, "running", cpu=90.0)
    clock.advance(1)
    sample(monitor, status, cpu=0.0)
    assert monitor.state.activity.verdict is verdict
    assert monitor.state.activity.evidence() == evidence


def activity_view(now_s: float, *, progress_s: float, active_s: float | None,
                  verdict: Verdict | None) -> BuildView:  # fmt: skip
    return BuildView(
        now_mono_ns=round(now_s * S),
        start_mono_ns=0,
        last_progress_mono_ns=round(progress_s * S),
        open_phase="Determining refit engines",
        verdict=verdict,
        last_active_mono_ns=None if active_s is None else round(active_s * S),
        evidence="CPU 0%, 300 MiB",
    )


def test_a_stall_counts_time_with_neither_progress_nor_activity() -> None:
    stall = Stall(10)
    # Silent for 100 s but working a second ago: not stalled, however long the window.
    assert (
        stall.check(activity_view(100, progress_s=0, active_s=99, verdict=Verdict.WORKING)) is None
    )
    assert (
        stall.check(activity_view(100, progress_s=0, active_s=90.5, verdict=Verdict.IDLE)) is None
    )
    decision = stall.check(activity_view(100, progress_s=0, active_s=90, verdict=Verdict.IDLE))
    assert decision is not None and decision.source == "stall"
    assert decision.reason == (
        "no progress and no activity for 10.0s in 'Determining refit engines': the builder's "
        "process is idle (CPU 0%, 300 MiB)"
    )
    stopped = stall.check(activity_view(100, progress_s=0, active_s=80, verdict=Verdict.STOPPED))
    assert stopped is not None and "the builder's process is stopped" in stopped.reason
    # Progress after the last activity counts too.
    assert stall.check(activity_view(100, progress_s=95, active_s=50, verdict=Verdict.IDLE)) is None


def test_a_stall_falls_back_to_callbacks_where_the_process_is_not_sampled() -> None:
    stall, by_callbacks = Stall(10), Stall(10, on="callbacks")
    unsampled = activity_view(100, progress_s=85, active_s=None, verdict=None)
    decision = stall.check(unsampled)
    assert decision is not None and decision.reason.startswith("no progress for 10.0s")
    working = activity_view(100, progress_s=85, active_s=99, verdict=Verdict.WORKING)
    assert stall.check(working) is None
    decision = by_callbacks.check(working)
    assert decision is not None, "--stall-on callbacks: progress alone decides"
    assert (
        by_callbacks.describe() == "stall(10.0s, callbacks)" and stall.describe() == "stall(10.0s)"
    )
    with pytest.raises(ValueError, match="activity or callbacks"):
        Stall(10, on="cpu")


def test_the_first_sample_is_no_activity_and_a_working_verdict_is_never_called_idle() -> None:
    """The real sampler's first sample measures no CPU use (there is no sample before it): the
    builder is working, as it has only just started, but the sample's time is no sign of work,
    so the stall counts from the last progress; and when it decides on a verdict that still
    says working (no fresh sample since), it says so."""
    clock = ManualClock()
    monitor = sampled_build(clock)  # progress (the phase's start) at 0 s
    clock.advance(2)
    monitor.sample(
        ProcessSample, pid=1234, status="running", cpu_seconds=1.0, rss_bytes=300 * MIB
    )  # as ProcessReader's first reading: no cpu_percent
    activity = monitor.state.activity
    assert activity.verdict is Verdict.WORKING and activity.last_active_mono_ns is None
    runner = PolicyRunner(monitor, Stall(5))
    clock.advance(3.5)  # 5.5 s after the progress, 3.5 s after the first sample
    decision = runner.check_now()
    assert decision is not None, "the first sample's time is not the last activity"
    assert "idle" not in decision.reason
    assert decision.reason == (
        "no progress for 5.0s in 'Building engine', and no sample of the builder's process in "
        "that time showed work (the last one: working (300 MiB))"
    )


def test_a_fresh_sample_that_measures_work_is_activity() -> None:
    clock = ManualClock()
    monitor = sampled_build(clock)
    stall = PolicyRunner(monitor, Stall(5))
    sample(monitor, "running", cpu=0.0, cpu_s=1.0)
    for second in range(1, 20):
        clock.advance(1)
        sample(monitor, "running", cpu=99.0, cpu_s=1.0 + second)
        assert stall.check_now() is None, f"working at {second}s"
    assert monitor.state.activity.last_active_mono_ns == clock.mono_ns()


@pytest.mark.e2e
def test_a_sample_interval_the_stall_timeout_cannot_hold_is_refused_before_the_build() -> None:
    """``--sample-interval 1m --stall-timeout 5s``: no second sample could come within the
    timeout to show a builder computing through a silent window, so it would be stopped as
    hung. Refused (exit 2, one line naming both), given directly or by a retry's rung."""
    cli = [*CLI, "demo", "--speed", "0", "--no-progress"]
    for options in (
        ["--sample-interval", "1m", "--stall-timeout", "5s"],
        ["--sample-interval", "3s", "--stall-timeout", "5s"],
        ["--stall-timeout", "1h", "--retry", "--stall-timeout 1s"],
    ):
        result = subprocess.run(
            [*cli, *options], check=False, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 2, (options, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert "--sample-interval" in lines[0] and "--stall-timeout" in lines[0], lines
        assert "build started" not in result.stderr
    # Counted on callbacks alone, or with two samples in the window, the pair is fine.
    from trt_otel.app.fleet_requests import check_command_line

    check_command_line(["demo", "--sample-interval", "1m", "--stall-timeout", "5s",
                        "--stall-on", "callbacks"])  # fmt: skip
    check_command_line(["demo", "--sample-interval", "2.5s", "--stall-timeout", "5s"])


def test_the_memory_guard_names_the_figures() -> None:
    guard = MemoryGuard(max_rss_bytes=250 * MIB, min_available_bytes=1 << 30)
    base = activity_view(5, progress_s=0, active_s=5, verdict=Verdict.WORKING)
    fits = dataclasses.replace(base, rss_bytes=250 * MIB, available_bytes=1 << 30)
    assert guard.check(fits) is None, "at the limits is within them"
    over = dataclasses.replace(base, rss_bytes=262 * MIB, available_bytes=4 << 30)
    decision = guard.check(over)
    assert decision is not None and decision.source == "memory" and not decision.timeout
    assert decision.reason == "resident memory 262 MiB exceeds --max-memory 250 MiB"
    short = dataclasses.replace(base, rss_bytes=MIB, available_bytes=900 * MIB)
    decision = guard.check(short)
    assert decision is not None
    assert decision.reason == "the host's available memory 900 MiB is below --min-available 1.0 GiB"
    unsampled = dataclasses.replace(base, rss_bytes=None, available_bytes=None)
    assert guard.check(unsampled) is None
    assert guard.describe() == "memory(max 250 MiB, min available 1.0 GiB)"


@pytest.mark.parametrize(
    ("text", "size"),
    [("250MiB", 250 * MIB), ("6G", 6 << 30), ("1.5g", 3 << 29), ("4096", 4096), ("2Gi", 2 << 30),
     ("512 KB", 512 << 10), ("0", 0)],
)  # fmt: skip
def test_sizes_are_read_in_powers_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1G", "6X", "G", "1e9", "99999999999999999999T"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(SizeError):
        parse_size(text)


def test_sizes_read_as_people_read_memory() -> None:
    assert [format_bytes(n) for n in (512, 2048, 455 * MIB, int(5.1 * (1 << 30)), 20 << 30)] == [
        "512 B", "2 KiB", "455 MiB", "5.1 GiB", "20 GiB",
    ]  # fmt: skip


# -- the sampler, on real processes ---------------------------------------------------------------


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A Python process that spins until it reads a line, then sleeps forever."""
    spinning = (
        "import select, sys, time\nwhile not select.select([sys.stdin], [], [], 0)[0]: pass\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", spinning + "sys.stdin.readline()\ntime.sleep(600)"],
        stdin=subprocess.PIPE,
    )
    yield process
    process.kill()
    process.wait()
    assert process.stdin is not None
    process.stdin.close()


def samples_until(
    sampler: ProcessSampler,
    verdict: Verdict,
    monitor: BuildMonitor,
    timeout_s: float = 30,
    cpu_above: float | None = None,
) -> None:
    """Sample until the verdict is ``verdict`` (and the CPU above ``cpu_above``)."""
    deadline = time.monotonic() + timeout_s

    def reached() -> bool:
        activity = monitor.state.activity
        cpu = activity.last_sample.cpu_percent if activity.last_sample is not None else None
        busy = cpu_above is None or (cpu is not None and cpu > cpu_above)
        return activity.verdict is verdict and busy

    while not reached():
        assert time.monotonic() < deadline, (
            f"never {verdict.value}: {monitor.state.activity.describe()}"
        )
        sampler.sample_once()
        time.sleep(0.1)  # the pace of sampling: a sample covers the CPU used since the last


@pytest.mark.e2e
def test_the_sampler_tells_a_busy_process_from_an_idle_stopped_and_gone_one(
    child: subprocess.Popen[bytes],
) -> None:
    monitor = BuildMonitor()
    monitor.start()
    sampler = ProcessSampler(monitor, pid=child.pid)
    samples_until(sampler, Verdict.WORKING, monitor, cpu_above=50)
    last = monitor.state.activity.last_sample
    assert last is not None and last.cpu_percent is not None and last.cpu_percent > 50
    assert last.busiest_thread_percent is not None and last.busiest_thread_percent > 50
    assert last.rss_bytes and last.threads and last.available_bytes
    assert child.stdin is not None
    child.stdin.write(b"sleep\n")
    child.stdin.flush()
    samples_until(sampler, Verdict.IDLE, monitor)
    child.send_signal(signal.SIGSTOP)
    samples_until(sampler, Verdict.STOPPED, monitor)
    child.kill()
    child.wait()
    samples_until(sampler, Verdict.GONE, monitor)
    assert sampler.sample_once() is None, "a process that is gone is said once"
    statuses = [e.status for e in monitor.log.recent() if isinstance(e, ProcessSample)]
    assert statuses[-1] == "gone" and "stopped" in statuses and statuses.count("gone") == 1


@pytest.mark.e2e
def test_the_sampler_samples_on_its_own_thread_once_it_knows_the_process(
    child: subprocess.Popen[bytes],
) -> None:
    sampler = ProcessSampler(BuildMonitor(), interval_s=0.05).start()
    try:
        assert sampler.sample_once() is None, "no process named yet"
        sampler.watch(child.pid)
        wait_until(lambda: sampler.samples >= 3, "the sampler's thread never sampled", 30)
    finally:
        sampler.stop()
    assert not sampler._thread.is_alive()


@pytest.mark.e2e
def test_no_sample_follows_the_builds_end(child: subprocess.Popen[bytes]) -> None:
    monitor = BuildMonitor()
    monitor.start()
    sampler = ProcessSampler(
        monitor, pid=child.pid, build_open=lambda: monitor.state.outcome is None
    )
    assert sampler.sample_once() is not None
    monitor.end()
    assert sampler.sample_once() is None
    assert sampler.sample_once() is None, "and sampling stops"
    assert type(monitor.log.recent()[-1]).__name__ == "BuildFinished"


def test_a_process_that_cannot_be_read_is_said_once() -> None:
    said: list[str] = []
    sampler = ProcessSampler(BuildMonitor(), warn=said.append, pid=2**22 + 12345)
    assert sampler.sample_once() is None
    assert len(said) == 1 and "reading the builder's process failed" in said[0]


# -- every view shows the verdict -----------------------------------------------------------------


def test_status_metrics_and_spans_carry_the_builder() -> None:
    clock = ManualClock()
    monitor = sampled_build(clock)
    sample(monitor, "running", cpu=90.0, rss_mib=300, cpu_s=1.0)
    clock.advance(1)
    sample(monitor, "running", cpu=90.0, rss_mib=400, cpu_s=2.5)
    clock.advance(1)
    sample(monitor, "stopped", cpu=0.0, rss_mib=350, cpu_s=2.5)
    model = ReadModel()
    model.handle(monitor.log.recent())
    now = clock.mono_ns()
    builder = msgspec.to_builtins(status_document(model, model.estimate_locked(now), now))[
        "builder"
    ]
    assert builder["state"] == "stopped" and builder["rss_bytes"] == 350 * MIB
    assert builder["peak_rss_bytes"] == 400 * MIB and builder["cpu_percent"] == 0.0
    assert builder["since_s"] == 0.0
    scraped = _scrape(monitor)
    assert scraped[("trt_build_liveness", (("state", "stopped"),))] == 1
    assert scraped[("trt_build_liveness", (("state", "working"),))] == 0
    assert scraped[("trt_build_process_cpu_seconds_total", ())] == 2.5
    assert scraped[("trt_build_process_peak_resident_bytes", ())] == 400 * MIB
    assert scraped[("trt_build_process_resident_bytes", ())] == 350 * MIB
    assert scraped[("trt_build_host_available_bytes", ())] == 8 << 30


def _scrape(monitor: BuildMonitor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The registry's exposition, parsed back: (name, labels) to value."""
    text = generate_latest(metrics_registry(MetricSources(monitor))).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_phase_span_says_the_cpu_and_peak_memory_spent_in_it() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    sample(monitor, "running", cpu=90.0, rss_mib=200, cpu_s=1.0)  # before the phase
    clock.advance(1)
    monitor.phase_start("Determining refit engines", None, 1)
    for cpu_s, rss in ((2.0, 300), (4.0, 500), (5.5, 450)):
        clock.advance(1)
        sample(monitor, "running", cpu=90.0, rss_mib=rss, cpu_s=cpu_s)
    monitor.phase_finish("Determining refit engines")
    projection = SpanProjection()
    spans = [s for e in monitor.log.recent() for s in projection.apply(e)]
    (phase,) = [s for s in spans if s.name == "Determining refit engines"]
    assert phase.attributes["trt.process.cpu_seconds"] == 4.5
    assert phase.attributes["trt.process.peak_resident_bytes"] == 500 * MIB


@pytest.mark.e2e
def test_a_simulated_deadlock_shows_idle_in_the_heartbeat_and_the_journal(tmp_path: Path) -> None:
    journal = tmp_path / "build.jsonl"
    result = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--silence", "14s",
         "--sample-interval", "0.25s", "--no-progress", "--journal", str(journal)],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    heartbeat = [line for line in result.stderr.splitlines() if "silent for" in line]
    assert heartbeat, result.stderr
    assert ": idle for " in heartbeat[-1], heartbeat
    # Asleep, as far as the heartbeat can tell: the simulated builder's own threads (its spool
    # forwarder) and a loaded machine's accounting may show a few percent, never work.
    shown = re.search(r"\(CPU (\d+)%", heartbeat[-1])
    assert shown is not None and int(shown[1]) < ACTIVE_CPU_PERCENT, heartbeat
    verdicts = [
        json.loads(line)["status"] for line in journal.read_text().splitlines()
        if '"type":"process"' in line
    ]  # fmt: skip
    # A worker that has just ended may be sampled once more before the build's end: a zombie
    # before it is reaped, or gone after (said once, and the sampling stops), last.
    living = [v for v in verdicts if v not in ("zombie", "gone")]
    assert verdicts[: len(living)] == living and len(verdicts) - len(living) <= 1, verdicts
    assert len(living) > 20 and set(living) <= {"running", "sleeping"}
    last = json.loads(journal.read_text().splitlines()[-1])
    assert last["type"] == "build_end", "no sample follows the build's end"


# -- memory remembered ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_earlier_builds_say_what_the_next_one_needs_and_min_available_refuses(
    tmp_path: Path,
) -> None:
    history = tmp_path / "history"
    history.mkdir()
    demo = [*CLI, "demo", "--speed", "0", "--no-progress"]
    first = subprocess.run(
        [*demo, "--journal", str(history / "first.jsonl"), "--sample-interval", "0.05s",
         "--silence", "1s"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    peak = max(
        json.loads(line).get("rss_bytes") or 0
        for line in (history / "first.jsonl").read_text().splitlines()
        if '"type":"process"' in line
    )
    assert peak > 0
    told = subprocess.run(
        [*demo, "--history", str(history)], check=False, capture_output=True, text=True, timeout=120
    )
    assert told.returncode == 0, told.stderr
    assert f"the last 1 builds of this model peaked at {format_bytes(peak)}; " in told.stderr
    refused = subprocess.run(
        [*demo, "--history", str(history), "--min-available", "1000T"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "such a build would leave less than --min-available" in refused.stderr
    assert "so it is not started" in refused.stderr
    assert "build started" not in refused.stderr


@pytest.mark.e2e
def test_watch_samples_the_journals_writer_on_this_host_for_its_stall_policy(
    tmp_path: Path,
) -> None:
    journal, control = tmp_path / "build.jsonl", tmp_path / "control"
    build = subprocess.Popen(
        [*CLI, "demo", "--in-process", "--speed", "0", "--silence", "10m", "--no-progress",
         "--journal", str(journal), "--cancel-file", str(control)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        watch = subprocess.run(
            [*CLI, "watch", str(journal), "--no-progress", "--control-file", str(control),
             "--stall-timeout", "4s", "--sample-interval", "0.2s", "--terminate-after", "1s"],
            check=False, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        build.kill()
        build.wait()
    assert watch.returncode == 3, watch.stderr
    decision = json.loads(control.read_text())
    assert decision["source"] == "stall"
    assert decision["reason"].startswith("no progress and no activity for 4.0s")
    assert "the builder's process is idle" in decision["reason"], decision
    assert "cannot be sampled from here" not in watch.stderr


def test_a_busy_gpu_is_work_while_the_process_waits_on_it() -> None:
    """A builder timing tactics on the GPU waits for its kernels with little CPU of its own:
    the GPU's use is its work (no stall, never idle) until the GPU falls quiet too."""
    clock = ManualClock()
    monitor = sampled_build(clock)

    def verdict() -> Verdict | None:
        return monitor.state.activity.verdict

    sample(monitor, "running", cpu=97.0, cpu_s=1.0)
    for _ in range(int(IDLE_AFTER_S) + 3):
        clock.advance(1)
        monitor.sample(GpuSample, index=0, utilization=0.9)
        sample(monitor, cpu=0.0, cpu_s=1.0)
    assert verdict() is Verdict.WORKING
    for _ in range(int(IDLE_AFTER_S) + 2):
        clock.advance(1)
        monitor.sample(GpuSample, index=0, utilization=0.0)
        sample(monitor, cpu=0.0, cpu_s=1.0)
    assert verdict() is Verdict.IDLE


def test_min_available_is_what_is_left_once_the_build_takes_its_earlier_peak(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """3 GiB free and earlier builds that peaked at 2 GiB leave 1 GiB: enough for
    ``--min-available 1G``, not for ``2G``, though 3 GiB are free now."""
    from trt_otel.app.components import check_memory_history
    from trt_otel.app.config import UsageError
    from trt_otel.core.eta import History, PastBuild

    history = History([PastBuild("earlier.jsonl", 60.0, {}, peak_rss_bytes=2 << 30)])
    check_memory_history(history, 1 << 30, available_bytes=3 << 30)
    assert "peaked at 2.0 GiB; 3.0 GiB is available" in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"would leave less than --min-available 2\.0 GiB"):
        check_memory_history(history, 2 << 30, available_bytes=3 << 30)
