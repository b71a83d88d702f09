"""The fleet dashboard (``dashboards/trt-otel-fleet.json``), checked as the build dashboard is: its
expressions parse (promtool), name metrics trt-otel exposes, and return data from a real
Prometheus that found real builds on its own (``--prometheus-sd-dir``): one running, one
cancelled, one succeeded."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cli import start_demo
from prometheus_server import PrometheusServer, needs_prometheus
from trt_otel.views.prometheus import _GPU_GAUGES
from waiting import wait_for_text

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "dashboards" / "trt-otel-fleet.json"
GRAFANA_VARIABLES = {"$host": ".*", "$gpu": ".*", "$__range": "10m", "$__interval": "1m"}
GPU_METRICS = {metric for _, metric, _ in _GPU_GAUGES}
"""Series only a build with a GPU (NVML) has: none here."""
DURATION = "trt_build_duration_seconds"
"""The build duration histogram (backend, outcome), from the OpenTelemetry metrics work; where
this branch does not expose it yet, the panels that read it are the only ones allowed no data,
and its series names are the only ones allowed to be missing."""
_METRIC = re.compile(r"\b(trt_[a-z0-9_]+)\b")


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def panel_expression(title: str) -> str:
    dashboard = json.loads(DASHBOARD.read_text())
    (panel,) = [panel for panel in dashboard["panels"] if panel["title"] == title]
    return as_prometheus_reads_it(panel["targets"][0]["expr"])


def as_prometheus_reads_it(expression: str) -> str:
    """The expression with Grafana's variables given values (every host and GPU)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expression = expression.replace(variable, value)
    return expression


def test_the_fleet_dashboard_uses_fixed_datasource_uids_and_filters_every_panel() -> None:
    text = DASHBOARD.read_text()
    assert "${DS_" not in text
    dashboard = json.loads(text)
    uids = {panel["datasource"]["uid"] for panel in dashboard["panels"]}
    uids |= {t["datasource"]["uid"] for panel in dashboard["panels"] for t in panel["targets"]}
    uids |= {v["datasource"]["uid"] for v in dashboard["templating"]["list"]}
    assert uids == {"prometheus"}
    names = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert names == {"host", "gpu"}
    for expression in expressions():
        assert 'host=~"$host"' in expression and 'gpu=~"$gpu"' in expression, expression
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.e2e
@needs_prometheus()
def test_every_fleet_expression_parses(tmp_path: Path) -> None:
    """promtool parses each expression as the body of a recording rule."""
    rules = {
        "groups": [
            {
                "name": "fleet-dashboard",
                "rules": [
                    {"record": f"fleet:panel_{i}", "expr": as_prometheus_reads_it(e)}
                    for i, e in enumerate(expressions())
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(expressions())} rules found" in checked.stdout


def start_scraped(sd_dir: Path, journal: Path, *options: str) -> subprocess.Popen[str]:
    """A demo build with its metrics on a free port, a target in ``sd_dir`` for Prometheus."""
    return start_demo(
        "--no-gpu", "--prometheus-port", "0", "--prometheus-sd-dir", sd_dir,
        "--prometheus-linger", "20s", "--sample-interval", "0.2s", "--journal", journal, *options,
    )  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[PrometheusServer, list[subprocess.Popen[str]]]]:
    sd_dir = tmp_path / "targets"
    sd_dir.mkdir()
    prometheus = PrometheusServer(tmp_path, sd_dir=sd_dir)
    started: list[subprocess.Popen[str]] = []
    try:
        yield prometheus, started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate()
        prometheus.close()


@pytest.mark.e2e
@needs_prometheus()
def test_every_fleet_panel_has_data_from_discovered_builds(
    tmp_path: Path, fleet: tuple[PrometheusServer, list[subprocess.Popen[str]]]
) -> None:
    prometheus, started = fleet
    sd_dir = tmp_path / "targets"
    held = ("--speed", "0", "--silence", "10m", "--grace", "1s")
    running = start_scraped(sd_dir, tmp_path / "running.jsonl", *held)
    cancel = tmp_path / "cancel"
    cancelled = start_scraped(
        sd_dir, tmp_path / "cancelled.jsonl", *held, "--cancel-file", str(cancel)
    )
    started += [running, cancelled]
    for journal in ("running.jsonl", "cancelled.jsonl"):
        wait_for_text(tmp_path / journal, b"Computing profile costs")
    assert prometheus.wait_for('count(trt_build_state{state="running"} == 1) == 2', 60)
    succeeded = start_scraped(sd_dir, tmp_path / "succeeded.jsonl", "--speed", "4")
    started.append(succeeded)
    cancel.write_text("make room for a bigger model\n")
    for process, code in ((cancelled, 3), (succeeded, 0)):
        _, err = process.communicate(timeout=120)
        assert process.returncode == code, err
        assert "metrics: final values scraped" in err

    scraped = {r["metric"]["__name__"] for r in prometheus.query('{__name__=~"trt_.*"}')}
    scraped |= {
        r["metric"]["__name__"]
        for r in prometheus.query('last_over_time({__name__=~"trt_.*"}[10m])')
    }
    exposes_duration = f"{DURATION}_count" in scraped
    empty = []
    for expression in expressions():
        names = set(_METRIC.findall(expression))
        pending = not exposes_duration and any(n.startswith(DURATION) for n in names)
        unknown = names - scraped - GPU_METRICS
        if pending:
            unknown = {n for n in unknown if not n.startswith(DURATION)}
        assert not unknown, f"{expression} reads series trt-otel does not expose: {unknown}"
        if names & GPU_METRICS or pending:
            continue  # no GPU here; the histogram is not on this branch yet
        if not prometheus.wait_for(as_prometheus_reads_it(expression), timeout_s=5):
            empty.append(expression)
    assert empty == [], "every panel has data"

    outcomes = prometheus.query(panel_expression("Outcomes over time"))
    assert {r["metric"]["state"]: float(r["value"][1]) for r in outcomes} == {
        "cancellation": 1.0,
        "success": 1.0,
    }
    reasons = {
        r["metric"]["reason"]: float(r["value"][1])
        for r in prometheus.query(panel_expression("Cancellations by reason"))
    }
    assert reasons["file"] == 1.0 and sum(reasons.values()) == 1.0
    (by_host,) = prometheus.query(panel_expression("Builds running by host and GPU"))
    assert float(by_host["value"][1]) == 1.0, "the one build still running"
