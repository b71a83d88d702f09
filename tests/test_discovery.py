"""``--prometheus-sd-dir``: each running build announces its endpoint to Prometheus through a
file_sd target file, removed at its end. A real Prometheus discovers concurrent builds (real
processes) on its own, scrapes each, and gets their final values before they are withdrawn."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import CLI
from prometheus_server import PrometheusServer, needs_prometheus
from trt_otel import BuildMonitor, Outcome, read_journal
from trt_otel.app.components import attach_views
from trt_otel.app.config import MetricsConfig, ObservabilityConfig
from trt_otel.core.events import BuildFinished
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.discovery import ScrapeTarget, discovery_labels, target_address
from waiting import wait_for_text, wait_until


def test_a_target_file_is_what_file_sd_reads_and_is_removed_once(tmp_path: Path) -> None:
    labels = discovery_labels(
        {"gpu.name": "NVIDIA H200", "trt.backend": "tensorrt-rtx", "model.path": "/m/resnet.onnx"},
        host="gpu-node-7",
    )
    assert labels == {
        "host": "gpu-node-7",
        "gpu": "NVIDIA H200",
        "backend": "tensorrt-rtx",
        "model": "resnet.onnx",
    }
    with ScrapeTarget(tmp_path, labels, "0123456789abcdef", host="gpu-node-7") as target:
        target.announce("127.0.0.1", 9464)
        assert target.path.name == f"trt-otel-gpu-node-7-{os.getpid()}-0123456789ab.json"
        groups = json.loads(target.path.read_text())
        assert groups == [
            {"targets": ["127.0.0.1:9464"], "labels": {**labels, "__metrics_path__": "/metrics"}}
        ]
        # Prometheus runs as a user of its own: the file must be readable by others.
        assert stat.S_IMODE(target.path.stat().st_mode) == 0o644
        assert [p.name for p in tmp_path.iterdir()] == [target.path.name], "no temporary left"
    assert not target.path.exists()
    target.withdraw()  # harmless again


def test_a_target_on_every_interface_is_named_by_the_host() -> None:
    assert target_address("0.0.0.0", 9464, host="node-3") == "node-3:9464"
    assert target_address("::1", 9464) == "[::1]:9464"
    assert target_address("10.0.0.5", 80) == "10.0.0.5:80"
    assert discovery_labels({}, host="h") == {"host": "h"}, "unknown labels are left out"


@pytest.mark.e2e
def test_files_of_a_killed_build_on_this_host_are_removed_by_the_next(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    name = ScrapeTarget(tmp_path, {}, "x", host=host).path.name.split("-")[2]  # the host part
    orphan = tmp_path / f"trt-otel-{name}-{gone.pid}-aaaaaaaaaaaa.json"
    living = tmp_path / f"trt-otel-{name}-{os.getppid()}-bbbbbbbbbbbb.json"
    other_host = tmp_path / f"trt-otel-elsewhere-{gone.pid}-cccccccccccc.json"
    for path in (orphan, living, other_host):
        path.write_text("[]")
    with ScrapeTarget(tmp_path, {}, "dddddddddddd", host=host) as target:
        target.announce("127.0.0.1", 1)
        assert not orphan.exists(), "its process is gone: Prometheus would scrape nothing"
        assert living.exists(), "its process runs"
        assert other_host.exists(), "another host's process cannot be checked from here"


def test_the_target_stays_while_the_endpoint_waits_for_its_last_scrape(tmp_path: Path) -> None:
    """Withdrawn only once the endpoint has closed: the scrape that brings Prometheus the
    build's final values still finds the target."""
    monitor = BuildMonitor(attributes={"trt.backend": "simulator"})
    observe = ObservabilityConfig(metrics=MetricsConfig(port=0, linger_s=30, sd_dir=tmp_path))
    stack = contextlib.ExitStack()
    with stack:
        attach_views(stack, monitor, observe, runner=None, model=ReadModel(), attributes={})
        (target,) = tmp_path.glob("*.json")
        url = "http://" + json.loads(target.read_text())[0]["targets"][0] + "/metrics"
        urllib.request.urlopen(url, timeout=5).close()  # scraped during the build
        monitor.end(Outcome.SUCCESS)
        closing = threading.Thread(target=stack.close)
        closing.start()
        # For a second the endpoint lingers, waiting for a scrape after the end: the target
        # must be there all along.
        watched_until = time.monotonic() + 1.0
        while time.monotonic() < watched_until:
            assert closing.is_alive()
            assert target.exists(), "withdrawn before the last scrape"
        urllib.request.urlopen(url, timeout=5).close()
        closing.join(30)
        assert not closing.is_alive()
    assert not target.exists()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--prometheus-sd-dir", "{tmp}"], "give --prometheus-port PORT"),
        (["--prometheus-port", "0", "--prometheus-sd-dir", "{tmp}/missing"], "is not a directory"),
    ],
    ids=["no-endpoint", "no-directory"],
)
def test_a_discovery_folder_that_cannot_work_is_a_usage_error(
    tmp_path: Path, options: list[str], message: str
) -> None:
    given = [option.format(tmp=tmp_path) for option in options]
    journal = tmp_path / "j.jsonl"
    done = subprocess.run(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--journal", str(journal), *given],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not journal.exists(), "nothing started"


@pytest.fixture
def held_builds(tmp_path: Path) -> Iterator[list[tuple[subprocess.Popen[str], Path, Path]]]:
    """Three builds at once, each held in a silent window until its cancel file appears."""
    sd_dir = tmp_path / "targets"
    sd_dir.mkdir()
    builds = []
    for index in range(3):
        journal, cancel = tmp_path / f"b{index}.jsonl", tmp_path / f"cancel-{index}"
        process = subprocess.Popen(
            [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0", "--silence", "10m",
             "--grace", "1s", "--prometheus-port", "0", "--prometheus-sd-dir", str(sd_dir),
             "--prometheus-linger", "20s", "--cancel-file", str(cancel),
             "--journal", str(journal)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        builds.append((process, journal, cancel))
    try:
        yield builds
    finally:
        for process, _, _ in builds:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.e2e
@needs_prometheus("prometheus")
def test_prometheus_discovers_three_concurrent_builds_and_scrapes_each(
    tmp_path: Path, held_builds: list[tuple[subprocess.Popen[str], Path, Path]]
) -> None:
    sd_dir = tmp_path / "targets"
    prometheus = PrometheusServer(tmp_path, sd_dir=sd_dir)
    try:
        for _, journal, _ in held_builds:
            wait_for_text(journal, b"Computing profile costs")
        assert len(list(sd_dir.glob("*.json"))) == 3
        # Found on its own (no target configured), each scraped, each with its labels.
        up = prometheus.wait_for('count(up{job="trt-otel"} == 1) == 3', timeout_s=60)
        assert up, prometheus.active_targets()
        running = prometheus.wait_for('trt_build_state{state="running"} == 1')
        assert len(running) == 3
        host = socket.gethostname()
        for series in running:
            assert series["metric"]["host"] == host
            assert series["metric"]["backend"] == "simulator"
            assert series["metric"]["model"] == "trt-otel-demo-mnist.onnx"
        instances = {series["metric"]["instance"] for series in running}
        assert len(instances) == 3

        for index, (_, _, cancel) in enumerate(held_builds):
            cancel.write_text(f"fleet test {index}\n")
        for process, journal, _ in held_builds:
            _, err = process.communicate(timeout=90)
            assert process.returncode == 3, err
            assert "metrics: final values scraped" in err, "Prometheus scraped the end"
            end = next(e for e in read_journal(journal).events if isinstance(e, BuildFinished))
            assert end.outcome is Outcome.CANCELLATION
        # The final values were scraped before the targets were withdrawn (the series are
        # stale since: the last value within the window)...
        cancelled = prometheus.query(
            'last_over_time(trt_build_state{state="cancellation"}[5m]) == 1'
        )
        assert {series["metric"]["instance"] for series in cancelled} == instances
        # ...and then the files are gone, and Prometheus stops scraping them.
        assert list(sd_dir.iterdir()) == []
        wait_until(
            lambda: not prometheus.active_targets(),
            "Prometheus still scrapes the withdrawn targets",
            30,
        )
    finally:
        prometheus.close()


def test_a_file_whose_process_cannot_be_checked_is_left_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a process known to be gone loses its target file: one whose state cannot be read
    (psutil fails, ``process_running`` says None) may still serve its last scrape."""
    from trt_otel.views import discovery

    unknown = tmp_path / "trt-otel-node-4242-aaaaaaaaaaaa.json"
    unknown.write_text("[]")
    monkeypatch.setattr(discovery, "process_running", lambda pid: None)
    assert ScrapeTarget(tmp_path, {}, "bbbbbbbbbbbb", host="node").remove_orphans() == []
    assert unknown.exists()
    monkeypatch.setattr(discovery, "process_running", lambda pid: False)
    assert ScrapeTarget(tmp_path, {}, "bbbbbbbbbbbb", host="node").remove_orphans() == [unknown]
