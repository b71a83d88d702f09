"""Stopping real TensorRT-RTX builds from outside: every way the command has (a cancel file, a
timeout, a stall timeout, an HTTP request, Ctrl-C) stops a build of a deep residual net, whose
real silent window (one step of "Determining refit engines" with no callback for seconds) is
where a build spends most of its time. Inside that window a cancel can only wait for the next
step, or escalate: both are checked.

Skipped only where ``tensorrt_rtx`` does not import, with the reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from otlp_receiver import OtlpReceiver, final_spans
from prometheus_server import free_port
from rtx_builds import SILENT_BLOCKS, SILENT_PHASE, import_rtx, write_residual
from trt_otel import read_journal
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.capture.supervisor import DEFAULT_KILL_AFTER_S
from trt_otel.core.events import (
    BuildFinished,
    CancelRequested,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from waiting import write_at_once

# Policies are checked every 0.1 s and the worker's process takes a moment to end; under a
# loaded CI machine, allow a few seconds on top of grace + kill delay.
SLACK_S = 4.0

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def residual(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import_rtx()
    return write_residual(tmp_path_factory.mktemp("models") / f"residual{SILENT_BLOCKS}.onnx")


class Build:
    """``trt-otel build`` of the residual net, running."""

    def __init__(self, model: Path, directory: Path, *options: str) -> None:
        self.engine, self.journal = directory / "r.engine", directory / "r.jsonl"
        self.process = subprocess.Popen(
            [*CLI, "build", str(model), "-o", str(self.engine), "--journal", str(self.journal),
             "--no-progress", "--no-gpu", "--shapes", RESIDUAL_SHAPES, *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.stderr = ""

    def wait_for_silent_window(self, timeout_s: float = 60.0) -> None:
        """Until the journal shows TensorRT inside the silent step."""
        deadline = time.monotonic() + timeout_s
        marker = SILENT_PHASE.encode()  # first in its phase_start
        while not (self.journal.exists() and marker in self.journal.read_bytes()):
            assert self.process.poll() is None, f"the build ended first: {self.finish()}"
            assert time.monotonic() < deadline, "the build never reached its silent window"
            time.sleep(0.02)

    def finish(self, timeout_s: float = 120.0) -> int:
        _, self.stderr = self.process.communicate(timeout=timeout_s)
        return self.process.returncode

    def events_after_silence(self) -> list[Any]:
        events = read_journal(self.journal).events
        start = next(
            i
            for i, e in enumerate(events)
            if isinstance(e, PhaseStarted) and e.name == SILENT_PHASE
        )
        return events[start + 1 :]

    def end(self) -> BuildFinished:
        end = read_journal(self.journal).events[-1]
        assert isinstance(end, BuildFinished)
        return end


class Launcher:
    """Starts builds of the residual net in one directory; stops whatever a failed test left."""

    def __init__(self, model: Path, directory: Path) -> None:
        self.model, self.directory = model, directory
        self.started: list[Build] = []

    def start(self, *options: str) -> Build:
        build = Build(self.model, self.directory, *options)
        self.started.append(build)
        return build


@pytest.fixture
def launch(residual: Path, tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(residual, tmp_path)
    yield launcher
    for build in launcher.started:  # a failed test must not leave a builder behind
        if build.process.poll() is None:
            build.process.kill()
            build.process.communicate()


def test_a_cancel_in_the_silent_window_is_honoured_at_the_next_step(
    launch: Launcher, tmp_path: Path
) -> None:
    sentinel = tmp_path / "STOP"
    build = launch.start("--cancel-file", str(sentinel), "--grace", "120s")
    build.wait_for_silent_window()
    write_at_once(sentinel, "stop in the window\n")
    assert build.finish() == 3, build.stderr
    after = build.events_after_silence()
    kinds = [type(e).__name__ for e in after]
    cancel = kinds.index("CancelRequested")
    assert "StepCompleted" not in kinds[:cancel], "the cancel came inside the silent step"
    steps = [e for e in after[cancel:] if isinstance(e, StepCompleted)]
    # The worker's next step answered False: the one step that ended the window, no other.
    assert [(s.name, s.step) for s in steps] == [(SILENT_PHASE, 0)]
    end = build.end()
    assert end.outcome == "cancellation" and end.detail == "stop in the window"
    assert not build.engine.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STOP", "r.jsonl"]


def test_a_cancel_in_the_silent_window_escalates_within_the_grace_period(
    launch: Launcher, tmp_path: Path
) -> None:
    sentinel, grace_s = tmp_path / "STOP", 1.0
    build = launch.start("--cancel-file", str(sentinel), "--grace", "1s")
    build.wait_for_silent_window()
    sentinel.touch()
    cancelled_at = time.monotonic()
    assert build.finish() == 3, build.stderr
    took_s = time.monotonic() - cancelled_at
    assert took_s < grace_s + DEFAULT_KILL_AFTER_S + SLACK_S
    after = build.events_after_silence()
    assert not [e for e in after if isinstance(e, StepCompleted)], "TensorRT never spoke again"
    end = build.end()
    assert end.outcome == "cancellation"
    assert "had not stopped 1.0s later, so its process was stopped with SIG" in end.detail
    assert not build.engine.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["STOP", "r.jsonl"]


@pytest.mark.parametrize(
    ("policy", "outcome", "reason"),
    [
        ("--timeout=3s", "timeout", "timeout"),
        # In the silent window, or before the first callback where the worker starts slowly:
        # counted on callbacks alone, the old meaning, a working builder is stopped too.
        ("--stall-timeout=2s --stall-on=callbacks", "cancellation", "no progress for 2.0s"),
    ],
)
def test_timeouts_stop_a_real_build(
    launch: Launcher, policy: str, outcome: str, reason: str
) -> None:
    build = launch.start("--grace", "2s", *policy.split())
    assert build.finish() == 3, build.stderr
    events = read_journal(build.journal).events
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    assert reason in cancel.reason
    assert build.end().outcome == outcome
    assert not build.engine.exists()


def test_an_http_cancel_stops_a_real_build(launch: Launcher, tmp_path: Path) -> None:
    port = free_port()
    build = launch.start("--http-port", str(port), "--cancel-token", "sesame", "--grace", "2s")
    build.wait_for_silent_window()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/cancel",
        data=json.dumps({"reason": "stopped over HTTP"}).encode(),
        headers={"Authorization": "Bearer sesame", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 202)
    assert build.finish() == 3, build.stderr
    cancel = next(e for e in read_journal(build.journal).events if isinstance(e, CancelRequested))
    assert cancel.source == "http"
    assert build.end().outcome == "cancellation"
    assert not build.engine.exists()


def test_ctrl_c_stops_a_real_build(launch: Launcher) -> None:
    build = launch.start("--grace", "2s")
    build.wait_for_silent_window()
    build.process.send_signal(signal.SIGINT)
    assert build.finish() == 130, build.stderr
    cancel = next(e for e in read_journal(build.journal).events if isinstance(e, CancelRequested))
    assert cancel.source == "signal"
    assert build.end().outcome == "cancellation"
    assert not build.engine.exists()


GITHUB_ACTIONS_STOP = ((signal.SIGINT, 7.5), (signal.SIGTERM, 2.5), (signal.SIGKILL, 0.0))
"""How a GitHub Actions runner stops a cancelled job: SIGINT, SIGTERM 7.5 s later, and SIGKILL
of the process tree 2.5 s after that."""


def test_a_runner_s_stop_ends_the_journal_and_the_spans_before_its_sigterm(
    launch: Launcher, receiver: OtlpReceiver
) -> None:
    """The first signal of a cancelled CI job, in the silent window, with the defaults: the
    build stops within the stop budget (its grace is what the budget leaves after the flush),
    so its journal ends and its spans arrive before the runner's SIGTERM would come."""
    build = launch.start("--otlp-endpoint", f"http://127.0.0.1:{receiver.http_port}")
    build.wait_for_silent_window()
    sent = []
    for number, wait_s in GITHUB_ACTIONS_STOP:
        build.process.send_signal(number)
        sent.append(number)
        try:
            build.process.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    assert sent == [signal.SIGINT], f"still running when the runner sent {sent[-1].name}"
    assert build.finish() == 130, build.stderr
    end = build.end()
    assert end.outcome == "cancellation"
    # Every phase's final span was sent before the process ended (the live snapshots of the
    # open phases, sent while it ran, are not them).
    spans = final_spans(receiver.spans)
    started = sum(1 for e in read_journal(build.journal).events if isinstance(e, PhaseStarted))
    assert len(spans) == started + 1, "one span per phase and one for the build"
    assert {"Building engine", SILENT_PHASE} <= {span.name for span in spans}
    assert not build.engine.exists()


KUBERNETES_GRACE_S = 30.0
"""A pod's ``terminationGracePeriodSeconds`` by default: the kubelet's SIGKILL comes that long
after its SIGTERM."""


def test_a_kubelets_sigterm_ends_the_journal_and_the_spans_within_its_grace(
    launch: Launcher, receiver: OtlpReceiver
) -> None:
    """A pod stopped (a deleted Job, a drained node) in the silent window, with the stop budget
    set to the pod's default grace period: the build stops, its journal ends and every final
    span is sent before the kubelet's SIGKILL would come."""
    build = launch.start(
        "--stop-budget", f"{KUBERNETES_GRACE_S:g}s",
        "--otlp-endpoint", f"http://127.0.0.1:{receiver.http_port}",
    )  # fmt: skip
    build.wait_for_silent_window()
    build.process.send_signal(signal.SIGTERM)
    try:
        build.process.wait(KUBERNETES_GRACE_S)
    except subprocess.TimeoutExpired:
        build.process.kill()  # the kubelet's SIGKILL
        pytest.fail(f"still running {KUBERNETES_GRACE_S:g}s after the kubelet's SIGTERM")
    assert build.finish() == 3, build.stderr
    end = build.end()
    assert end.outcome == "cancellation"
    spans = final_spans(receiver.spans)
    started = sum(1 for e in read_journal(build.journal).events if isinstance(e, PhaseStarted))
    assert len(spans) == started + 1, "one span per phase and one for the build"
    (root,) = [span for span in spans if not span.parent_span_id]
    assert root.attributes["trt.cancel.reason"] == "received SIGTERM"


# -- alive or hung: the builder's process decides what a stall is -------------------------------


def test_a_builder_computing_through_its_silent_window_is_not_stalled(launch: Launcher) -> None:
    build = launch.start("--stall-timeout", "2s", "--sample-interval", "0.2s", "--grace", "1s")
    assert build.finish() == 0, build.stderr
    events = read_journal(build.journal).events
    assert not [e for e in events if isinstance(e, CancelRequested)]
    start = next(e for e in events if isinstance(e, PhaseStarted) and e.name == SILENT_PHASE)
    after = next(e for e in events if isinstance(e, StepCompleted) and e.seq > start.seq)
    silence_s = (after.mono_ns - start.mono_ns) / 1e9
    assert silence_s > 2.0, f"the window ({silence_s:.1f}s) must outlast the stall timeout"
    inside = [e for e in events if isinstance(e, ProcessSample) and start.seq < e.seq < after.seq]
    assert inside and max(e.cpu_percent or 0 for e in inside) > 20, "it computed in the window"
    assert build.engine.exists()


def test_a_stopped_builder_is_stalled_and_killed_within_stall_grace_and_kill(
    launch: Launcher, tmp_path: Path
) -> None:
    stall_s, grace_s = 2.0, 1.0
    build = launch.start("--stall-timeout", "2s", "--grace", "1s", "--sample-interval", "0.2s")
    build.wait_for_silent_window()
    samples = [e for e in read_journal(build.journal).events if isinstance(e, ProcessSample)]
    assert samples, "the builder's process is sampled"
    os.kill(samples[-1].pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    assert build.finish() == 3, build.stderr
    took_s = time.monotonic() - stopped_at
    assert took_s < stall_s + grace_s + DEFAULT_KILL_AFTER_S + SLACK_S
    cancel = next(e for e in read_journal(build.journal).events if isinstance(e, CancelRequested))
    assert cancel.source == "stall"
    assert cancel.reason.startswith("no progress and no activity for 2.0s")
    assert cancel.reason.endswith("the builder's process is stopped (SIGSTOP?)")
    end = build.end()
    assert end.outcome == "cancellation" and "stopped with SIGKILL" in end.detail
    assert not build.engine.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_max_memory_stops_a_real_build_whose_memory_rises_past_it(launch: Launcher) -> None:
    """The builder's resident set stays near 182 MiB once the model is parsed, then rises to
    about 240 MiB (300 in some runs) as TensorRT-RTX builds: a limit between the two is crossed
    by the build, not by its start."""
    build = launch.start("--max-memory", "215MiB", "--grace", "1s", "--sample-interval", "0.2s")
    assert build.finish() == 3, build.stderr
    events = read_journal(build.journal).events
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    assert cancel.source == "memory"
    assert re.fullmatch(r"resident memory \d+ MiB exceeds --max-memory 215 MiB", cancel.reason)
    before = [e for e in events if isinstance(e, ProcessSample) and e.seq < cancel.seq]
    assert (before[-1].rss_bytes or 0) > 215 << 20, "decided on the sample that crossed it"
    assert build.end().outcome == "cancellation"
    assert "resident memory" in build.stderr
    assert not build.engine.exists()


def test_sigterm_cancels_a_real_build_at_its_next_step_and_exits_3(launch: Launcher) -> None:
    """What a deleted Kubernetes Job does to its build (deploy/k8s/): the kubelet's SIGTERM is
    a cancel with its reason, landing at TensorRT's next step, not a kill."""
    build = launch.start("--grace", "5m", "--stop-budget", "5m")
    build.wait_for_silent_window()
    build.process.send_signal(signal.SIGTERM)
    assert build.finish() == 3, build.stderr
    cancel = next(e for e in read_journal(build.journal).events if isinstance(e, CancelRequested))
    assert (cancel.source, cancel.reason) == ("signal", "received SIGTERM")
    end = build.end()
    assert end.outcome == "cancellation"
    assert "stopped with" not in end.detail, "TensorRT stopped by itself, at its next step"
    assert not build.engine.exists()
