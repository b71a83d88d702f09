"""The Prometheus projection, scraped by a real Prometheus server and checked by promtool."""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from prometheus_server import PrometheusServer, free_port, needs_prometheus, promtool_lint
from trt_otel import BuildMonitor, JournalWriter, ManualClock, read_journal
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.capture.gpu import GpuReading, GpuSampler
from trt_otel.core.events import AnomalyKind, Outcome
from trt_otel.views.prometheus import (
    CANCEL_REASONS,
    MetricSources,
    MetricsServer,
    metrics_registry,
)
from waiting import wait_until

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "dashboards" / "trt-otel.json"


@pytest.fixture(scope="module")
def exporter_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory, exporter_port: int
) -> Iterator[PrometheusServer]:
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus package is not installed (.ci/run installs it)")
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), f"127.0.0.1:{exporter_port}")
    yield server
    server.close()


class SlowBuild:
    """A simulated build on its own thread, paced so that Prometheus scrapes it many times."""

    def __init__(self, monitor: BuildMonitor, speed: float) -> None:
        self.monitor = monitor
        self.completed: bool | None = None
        self.thread = threading.Thread(target=self._run, args=(speed,), name="simulated-build")

    def _run(self, speed: float) -> None:
        result = Driver(speed=speed).run(self.monitor, generate_plan(13))
        self.completed = result.completed
        self.monitor.end_with_result(b"engine" if result.completed else None)


class RecordedGpu:
    """A recorded GPU series in place of NVML (no GPU here)."""

    index = 0

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> GpuReading:
        self.reads += 1
        return GpuReading(
            memory_used_bytes=(4 + self.reads % 8) * 2**30,
            memory_total_bytes=141 * 2**30,
            utilization=(self.reads % 10) / 10,
            memory_utilization=0.2,
            sm_clock_hz=1_980_000_000,
            memory_clock_hz=3_201_000_000,
            power_w=250.0,
            temperature_c=45.0,
        )

    def process_memory_bytes(self, pid: int) -> int | None:
        return None

    def describe(self) -> dict[str, object]:
        return {"gpu.index": 0}

    def close(self) -> None:
        pass


def scrape(port: int) -> str:
    return scrape_url(f"http://127.0.0.1:{port}/metrics")


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.mark.e2e
@needs_prometheus()
def test_prometheus_finds_the_step_gauges_the_build_reported(
    prometheus: PrometheusServer, exporter_port: int
) -> None:
    monitor = BuildMonitor(attributes={"trt.backend": "simulator"})
    server = MetricsServer(metrics_registry(MetricSources(monitor)), exporter_port)
    try:
        monitor.start()
        assert prometheus.wait_for('trt_build_state{state="running"} == 1')
        assert Driver(speed=0).run(monitor, generate_plan(13)).completed
        monitor.end()
        assert server.wait_for_scrape_after(time.monotonic(), 10)
        assert prometheus.wait_for('trt_build_state{state="success"} == 1')
        state = monitor.state
        expected = {
            name: (state.phases[i].num_steps, state.phases[i].steps_completed)
            for name, i in state.latest_by_name.items()
        }
        steps = {
            r["metric"]["phase"]: float(r["value"][1])
            for r in prometheus.query("trt_build_phase_steps")
        }
        completed = {
            r["metric"]["phase"]: float(r["value"][1])
            for r in prometheus.query("trt_build_phase_steps_completed")
        }
        assert steps == {name: float(n) for name, (n, _) in expected.items()}
        assert completed == {name: float(c) for name, (_, c) in expected.items()}
        (total,) = prometheus.query("trt_build_steps_completed_total")
        assert float(total["value"][1]) == state.steps_completed_total
        (ratio,) = prometheus.query("trt_build_progress_ratio")
        assert float(ratio["value"][1]) == 1.0
    finally:
        server.close()


def gauge_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition text, by name and labels: what a scrape reads."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_step_gauges_read_by_a_scrape_are_the_builds_mid_build_and_at_the_end() -> None:
    """The contract's gauges, read from the exposition text a scrape gets (no Prometheus
    binary needed): per phase the latest instance's steps and steps completed, the build's
    total, and its progress."""
    from prometheus_client import generate_latest

    monitor = BuildMonitor(attributes={"trt.backend": "simulator"})
    registry = metrics_registry(MetricSources(monitor))
    plan = generate_plan(13)
    monitor.start()
    ratios = []
    for part in (plan[: len(plan) // 2], plan[len(plan) // 2 :]):
        Driver(speed=0).run(monitor, part)
        values = gauge_values(generate_latest(registry).decode())
        state = monitor.state
        for name, phase_id in state.latest_by_name.items():
            phase = state.phases[phase_id]
            labels = (("phase", name),)
            assert values[("trt_build_phase_steps", labels)] == phase.num_steps
            assert values[("trt_build_phase_steps_completed", labels)] == phase.steps_completed
        assert values[("trt_build_steps_completed_total", ())] == state.steps_completed_total
        assert values[("trt_build_progress_ratio", ())] == state.progress_ratio()
        ratios.append(state.progress_ratio())
    monitor.end()
    values = gauge_values(generate_latest(registry).decode())
    assert values[("trt_build_progress_ratio", ())] == 1.0
    assert 0 < ratios[0] < 1, "mid-build"
    assert values[("trt_build_state", (("state", "success"),))] == 1
    assert values[("trt_build_state", (("state", "running"),))] == 0
    steps = sum(c.kind == "step_complete" for c in plan)
    assert values[("trt_build_steps_completed_total", ())] == steps


def test_the_event_and_callback_counts_are_the_logs_own() -> None:
    """``trt_otel_events_total`` is every event the log holds (seq counts from 0), and the
    callbacks' count is TensorRT's calls, not the events they made."""
    from prometheus_client import generate_latest

    monitor = BuildMonitor()
    registry = metrics_registry(MetricSources(monitor))
    plan = generate_plan(3)
    Driver(speed=0).run(monitor, plan)
    monitor.end()
    values = gauge_values(generate_latest(registry).decode())
    events = monitor.log.recent()
    assert events[0].seq == 0
    assert values[("trt_otel_events_total", ())] == len(events) == events[-1].seq + 1
    assert values[("trt_otel_callbacks_total", ())] == len(plan)


@pytest.mark.e2e
@needs_prometheus()
def test_every_dashboard_expression_returns_data_during_a_build(
    prometheus: PrometheusServer, exporter_port: int, tmp_path: Path
) -> None:
    monitor = BuildMonitor(attributes={"trt.backend": "simulator", "model.path": "/m/mnist.onnx"})
    monitor.log.follow(JournalWriter(tmp_path / "build.jsonl"))
    server = MetricsServer(metrics_registry(MetricSources(monitor)), exporter_port)
    build = SlowBuild(monitor, speed=0.5)
    # No GPU here: a recorded series stands in for NVML, so the GPU panels have data too.
    sampler = GpuSampler(monitor, RecordedGpu(), interval_s=0.2)
    build.thread.start()
    sampler.start()
    try:
        assert prometheus.wait_for('trt_build_state{state="running"} == 1')
        # rate() needs two samples in its window; wait for a few scrapes of the running build.
        assert prometheus.wait_for("count_over_time(trt_build_steps_completed_total[1m]) >= 4")
        expressions = dashboard_expressions()
        empty = [e for e in expressions if not prometheus.query(e)]
        assert empty == [], "every panel has data, cancellations too (0 for every reason)"

        monitor.cancel("checked every panel", source="test")
        build.thread.join(60)
        assert build.completed is False
        assert server.wait_for_scrape_after(time.monotonic(), 10)
        cancellations = [e for e in expressions if "cancellations" in e]
        assert cancellations
        assert prometheus.wait_for('trt_build_cancellations_total{reason="test"} == 1')
        for expression in cancellations:
            by_reason = {
                r["metric"]["reason"]: float(r["value"][1]) for r in prometheus.query(expression)
            }
            assert by_reason == {reason: 0.0 for reason in CANCEL_REASONS} | {"test": 1.0}
        assert prometheus.wait_for('trt_build_state{state="cancellation"} == 1')
    finally:
        sampler.stop()
        if build.thread.is_alive():
            monitor.cancel("test cleanup")
            build.thread.join(60)
        server.close()


@pytest.mark.e2e
@needs_prometheus()
def test_promtool_finds_nothing_to_lint_mid_build() -> None:
    from trt_otel.control.policies import PolicyHealth
    from trt_otel.views.otlp_settings import SpanExportHealth

    monitor = BuildMonitor(attributes={"trt.backend": "simulator", "model.path": "m.onnx"})
    sources = MetricSources(
        monitor,
        span_health=lambda: SpanExportHealth(10, 2, 3, 1, "refused"),
        policy_health=lambda: [PolicyHealth("url(http://x)", "http", 4, "HTTP status 500")],
    )
    server = MetricsServer(metrics_registry(sources), 0)
    try:
        plan = generate_plan(13)
        Driver(speed=0).run(monitor, plan[: len(plan) // 2])
        monitor.cancel("lint", source="test")
        monitor.phase_finish("not open")  # an anomaly, so that family has a sample too
        text = scrape(server.port)
        assert 'trt_build_phase_open{phase="Measuring tactic time"}' in text
        assert 'trt_build_cancellations_total{reason="test"} 1.0' in text
        assert 'trt_otel_anomalies_total{kind="finish_of_unknown_phase"} 1.0' in text
        assert "trt_otel_spans_failed_total 3.0" in text
        assert 'trt_otel_policy_errors_total{policy="http"} 4.0' in text
        assert promtool_lint(text) == ""
    finally:
        server.close()


def test_a_port_in_use_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trt_otel.app.cli import main

    monitor = BuildMonitor()
    taken = MetricsServer(metrics_registry(MetricSources(monitor)), 0)
    try:
        assert main(["demo", "--speed", "0", "--prometheus-port", str(taken.port)]) == 2
        assert "cannot serve metrics on 127.0.0.1" in capsys.readouterr().err
    finally:
        taken.close()


@pytest.mark.e2e
def test_a_dead_pushgateway_is_reported_and_the_build_still_succeeds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trt_otel.app.cli import main

    dead = f"http://127.0.0.1:{free_port()}"
    assert main(["demo", "--speed", "0", "--no-progress", "--pushgateway", dead]) == 0
    assert f"cannot push metrics to {dead}" in capsys.readouterr().err


def test_the_dashboard_uses_fixed_datasource_uids_only() -> None:
    text = DASHBOARD.read_text()
    assert "${DS_" not in text
    dashboard = json.loads(text)
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"]}
    uids |= {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel["targets"]}
    assert uids == {"prometheus"}
    assert any("16686" in link["url"] for link in dashboard["links"])


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
def test_the_compose_file_is_valid_and_names_the_stack() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    assert set(services) == {"otel-collector", "jaeger", "prometheus", "grafana", "demo"}
    published = {
        name: {
            str(p["published"]) if isinstance(p, dict) else str(p).split(":")[0]
            for p in s.get("ports", [])
        }
        for name, s in services.items()
    }
    assert "16686" in published["jaeger"]
    assert {"4317", "4318"} <= published["otel-collector"], "OTLP goes to the collector"
    assert "9090" in published["prometheus"]
    assert "3000" in published["grafana"]
    for name in services:
        image = services[name]["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name} image is not pinned"
    demo = " ".join(services["demo"]["command"])
    assert "trt-otel demo" in demo and "--otlp-metrics" in demo
    assert services["demo"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == (
        "http://otel-collector:4318"
    )
    prometheus_flags = services["prometheus"]["command"]
    assert "--web.enable-otlp-receiver" in prometheus_flags
    assert "--enable-feature=exemplar-storage" in prometheus_flags


def test_the_collector_forwards_each_signal_to_its_backend() -> None:
    """The collector's own configuration: every pipeline names parts it defines; spans reach
    Jaeger, metrics Prometheus's OTLP receiver, log records an exporter."""
    config = yaml.safe_load((REPO / "deploy" / "otel-collector" / "config.yaml").read_text())
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics", "logs"}
    for pipeline in pipelines.values():
        assert set(pipeline["receivers"]) <= set(config["receivers"])
        assert set(pipeline.get("processors", [])) <= set(config["processors"])
        assert set(pipeline["exporters"]) <= set(config["exporters"])
    exporters = config["exporters"]
    (traces,) = pipelines["traces"]["exporters"]
    assert exporters[traces]["endpoint"] == "jaeger:4317"
    (metrics,) = pipelines["metrics"]["exporters"]
    assert exporters[metrics]["metrics_endpoint"] == "http://prometheus:9090/api/v1/otlp/v1/metrics"
    assert pipelines["logs"]["exporters"]
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")


@pytest.mark.e2e
@pytest.mark.skipif(
    shutil.which("prometheus-pushgateway") is None,
    reason="Debian's prometheus-pushgateway is not installed (.ci/run installs it)",
)
def test_a_short_build_pushes_its_final_values_to_a_pushgateway(tmp_path: Path) -> None:
    from trt_otel.app.cli import main

    with pushgateway() as url:
        assert main(["demo", "--speed", "0", "--no-progress", "--pushgateway", url]) == 0
        text = scrape_url(f"{url}/metrics")
        key = re.search(r'trt_build_state\{build_id="([0-9a-f]{32})"', text)
        assert key is not None, text
        group = f'build_id="{key[1]}",instance="",job="trt_otel"'
        assert f'trt_build_state{{{group},state="success"}} 1' in text
        assert f"trt_build_progress_ratio{{{group}}} 1" in text


@contextlib.contextmanager
def pushgateway() -> Iterator[str]:
    """A real Pushgateway on a free port, ready to take pushes; yields its URL."""
    port = free_port()
    gateway = subprocess.Popen(
        # In memory: Debian's default persists every group to /var/lib/prometheus, where
        # one test's pushes would meet another's.
        [
            "prometheus-pushgateway",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            "--persistence.file=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
            except OSError:
                return False
            return True

        wait_until(ready, "the pushgateway did not start", 20)
        yield url
    finally:
        gateway.terminate()
        gateway.wait(10)


def scrape_url(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


# -- one registry, one server: negotiation, zeros, the wait at exit ------------------------------


def get(port: int, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return dict(response.headers), response.read()


def test_the_endpoint_negotiates_openmetrics_and_gzip_as_prometheus_client_does() -> None:
    monitor = BuildMonitor()
    monitor.start()
    server = MetricsServer(metrics_registry(MetricSources(monitor)), 0)
    try:
        headers, body = get(server.port, {"Accept": "application/openmetrics-text"})
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.endswith(b"# EOF\n")
        headers, body = get(server.port, {"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        text = gzip.decompress(body).decode()
        assert text.startswith("# HELP") and "trt_build_state" in text
        headers, body = get(server.port, {})
        assert headers["Content-Type"].startswith("text/plain") and b"# EOF" not in body
    finally:
        server.close()


def test_bounded_label_sets_are_there_at_0_before_anything_happens() -> None:
    monitor = BuildMonitor()
    monitor.start()
    server = MetricsServer(metrics_registry(MetricSources(monitor)), 0)
    try:
        text = scrape(server.port)
    finally:
        server.close()
    for reason in ("timeout", "stall", "file", "http", "signal", "user"):
        assert f'trt_build_cancellations_total{{reason="{reason}"}} 0.0' in text
    for kind in AnomalyKind:
        assert f'trt_otel_anomalies_total{{kind="{kind.value}"}} 0.0' in text
    assert 'trt_build_state{state="running"} 1.0' in text


@pytest.mark.e2e
def test_nothing_scraping_means_no_wait_at_exit(capsys: pytest.CaptureFixture[str]) -> None:
    from trt_otel.app.cli import main

    began = time.monotonic()
    args = ["demo", "--speed", "0", "--no-progress", "--prometheus-port", "0"]
    assert main([*args, "--prometheus-linger", "60s", "--http-port", "0"]) == 0
    took = time.monotonic() - began
    assert took < 40, f"the build waited {took:.0f}s for a scrape nobody makes"
    assert "final values scraped" not in capsys.readouterr().err


def test_registering_reading_or_pushing_is_not_a_scrape() -> None:
    from prometheus_client import generate_latest

    monitor = BuildMonitor()
    registry = metrics_registry(MetricSources(monitor))
    server = MetricsServer(registry, 0)
    try:
        monitor.start()
        generate_latest(registry)  # what the HTTP view's /metrics and a push do
        monitor.end()
        began = time.monotonic()
        assert server.linger(30.0) is False
        assert time.monotonic() - began < 1.0
        assert server.scrapes == 0
    finally:
        server.close()


def test_a_scrape_answered_after_prometheus_gave_up_on_it_is_not_the_final_one() -> None:
    monitor = BuildMonitor()
    server = MetricsServer(metrics_registry(MetricSources(monitor)), 0)

    def scrape(timeout: str) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics",
            headers={"X-Prometheus-Scrape-Timeout-Seconds": timeout},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    try:
        monitor.start()
        monitor.end()
        after = time.monotonic()
        scrape("0.000001")  # no answer is that quick: Prometheus dropped it
        assert server.scrapes == 1, "still a scrape: something is scraping"
        assert not server.wait_for_scrape_after(after, 0.2), "but not one that stored the end"
        scrape("10")
        assert server.wait_for_scrape_after(after, 5)
        later = time.monotonic()
        scrape("not a number")  # believed, as a scraper that says nothing is
        assert server.wait_for_scrape_after(later, 5)
    finally:
        server.close()
        monitor.close()


def test_a_scrape_is_the_final_one_only_once_its_answer_is_sent() -> None:
    """A build ends when its final scrape is counted, and its process exits with it: counted
    while the answer was still being written, the answer was cut off (seen in the suite, under
    load: the build said its final values were scraped and Prometheus had none of them)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

    class Large:
        """An answer larger than a loopback socket's buffers hold (16 MiB or so)."""

        def collect(self) -> Iterator[GaugeMetricFamily]:
            family = GaugeMetricFamily("trt_test_large", "a large answer", labels=["name"])
            for index in range(80_000):
                family.add_metric([f"{index:0200d}"], index)
            yield family

    registry = CollectorRegistry()
    registry.register(Large())
    server = MetricsServer(registry, 0)
    try:
        after = time.monotonic()
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(("127.0.0.1", server.port))
            client.sendall(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.0 200"), "the answer has begun"
            assert server.scrapes == 1, "something is scraping"
            assert not server.wait_for_scrape_after(after, 0.5), "but the answer is not sent"
            received = 0
            while chunk := client.recv(1 << 20):
                received += len(chunk)
        assert received > 16 << 20
        assert server.wait_for_scrape_after(after, 10), "sent: the final scrape"
    finally:
        server.close()


@pytest.mark.e2e
@needs_prometheus()
def test_a_real_scraper_gets_the_final_values_before_the_end(
    prometheus: PrometheusServer, exporter_port: int
) -> None:
    monitor = BuildMonitor()
    server = MetricsServer(metrics_registry(MetricSources(monitor)), exporter_port)
    try:
        monitor.start()
        assert prometheus.wait_for('trt_build_state{state="running"} == 1')
        monitor.cancel("enough", source="file")
        monitor.end(Outcome.CANCELLATION, "enough")
        began = time.monotonic()
        assert server.linger(30.0) is True, "Prometheus scrapes every second"
        assert time.monotonic() - began < 10
        assert prometheus.wait_for('trt_build_state{state="cancellation"} == 1')
        assert prometheus.wait_for('trt_build_cancellations_total{reason="file"} == 1')
    finally:
        server.close()


@pytest.mark.e2e
@pytest.mark.skipif(
    shutil.which("prometheus-pushgateway") is None,
    reason="Debian's prometheus-pushgateway is not installed (.ci/run installs it)",
)
def test_the_push_carries_the_same_series_as_a_scrape() -> None:
    from trt_otel.views.prometheus import push_build_metrics

    monitor = BuildMonitor(attributes={"trt.backend": "simulator"})
    registry = metrics_registry(MetricSources(monitor, eta=lambda: 12.0))
    server = MetricsServer(registry, 0)
    try:
        with pushgateway() as url:
            Driver(speed=0).run(monitor, generate_plan(3))
            monitor.end()
            push_build_metrics(registry, url)
            scraped = series(scrape(server.port))
            pushed = {
                name: labels
                - {("instance", ""), ("job", "trt_otel"), ("build_id", monitor.build_id)}
                for name, labels in series(scrape_url(f"{url}/metrics")).items()
                if name in scraped
            }
        assert pushed == scraped
        assert "trt_build_eta_seconds" in scraped and "trt_build_phase_steps" in scraped
    finally:
        server.close()


def series(text: str) -> dict[str, frozenset[tuple[str, str]]]:
    """Every sample's name and labels in an exposition (values aside; a bucket's bound as the
    number it is: the Pushgateway writes 1.0 as 1)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if "le" in labels:
                labels["le"] = repr(float(labels["le"]))
            found.setdefault(sample.name, set()).update(labels.items())
    return {name: frozenset(labels) for name, labels in found.items()}


@pytest.mark.e2e
@pytest.mark.skipif(
    shutil.which("prometheus-pushgateway") is None,
    reason="Debian's prometheus-pushgateway is not installed (.ci/run installs it)",
)
def test_builds_pushing_to_one_pushgateway_each_keep_their_own_group(tmp_path: Path) -> None:
    """A push replaces its group: grouped by the build's id, two builds pushing to the same
    Pushgateway (concurrent ones, or one after another) are both there, not the last alone."""
    from trt_otel.app.cli import main

    journals = [tmp_path / "one.jsonl", tmp_path / "two.jsonl"]
    with pushgateway() as url:
        for journal in journals:
            args = ["demo", "--speed", "0", "--no-progress", "--no-gpu", "--pushgateway", url]
            assert main([*args, "--journal", str(journal)]) == 0
        with urllib.request.urlopen(f"{url}/api/v1/metrics", timeout=5) as response:
            groups = json.load(response)["data"]
        text = scrape_url(f"{url}/metrics")
    ids = {read_journal(journal).events[0].build_id for journal in journals}  # type: ignore[attr-defined]
    assert len(ids) == 2
    assert {group["labels"].get("build_id") for group in groups} == ids
    for build_id in ids:
        group = f'build_id="{build_id}",instance="",job="trt_otel"'
        assert f'trt_build_state{{{group},state="success"}} 1' in text


def test_the_info_metric_names_the_model_by_its_file_name() -> None:
    """The model label is the file's name, not its directory (paths differ between hosts)."""
    monitor = BuildMonitor(attributes={"model.path": "/models/resnet/mnist.onnx"})
    registry = metrics_registry(MetricSources(monitor))
    monitor.start()
    model = registry.get_sample_value("trt_build_info", {"model": "mnist.onnx"})
    monitor.close()
    assert model is not None


def test_a_build_as_long_as_a_buckets_bound_is_counted_in_that_bucket() -> None:
    """Prometheus buckets are ``le``: a one-minute build is within the 60 s bucket."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    clock.advance(60)
    monitor.end()
    text = generate_latest(metrics_registry(MetricSources(monitor))).decode()
    buckets = {
        sample.labels["le"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "trt_build_duration_seconds_bucket"
    }
    assert (buckets["30.0"], buckets["60.0"], buckets["120.0"]) == (0.0, 1.0, 1.0)


def test_a_scrape_before_the_end_is_not_the_final_one() -> None:
    """The linger waits for a scrape that begins after it does: one made during the build read
    the values of then, not the final ones."""
    monitor = BuildMonitor()
    registry = metrics_registry(MetricSources(monitor))
    server = MetricsServer(registry, 0)
    try:
        monitor.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as f:
            assert f.status == 200
        assert server.scrapes == 1
        monitor.end()
        assert server.linger(0.3) is False, "no scrape since: not final"
    finally:
        server.close()
