"""A real Prometheus server (Debian's ``prometheus``) run by the tests on loopback, and the skip
of a test that needs one where Debian's package is not installed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from waiting import wait_until

if TYPE_CHECKING:
    import pytest


def needs_prometheus(*tools: str) -> pytest.MarkDecorator:
    """A test's mark: skipped where one of ``tools`` (by default ``prometheus`` and
    ``promtool``, of Debian's prometheus package) is not installed."""
    import pytest

    missing = any(shutil.which(tool) is None for tool in tools or ("prometheus", "promtool"))
    return pytest.mark.skipif(
        missing, reason="Debian's prometheus package is not installed (.ci/run installs it)"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    """Starts ``prometheus`` scraping ``target`` every second, or every target named by the
    JSON files of ``sd_dir`` (``file_sd_configs``, as a host's Prometheus finds its builds);
    ``query`` reads its HTTP API."""

    def __init__(
        self,
        workdir: Path,
        target: str | None = None,
        sd_dir: Path | None = None,
        features: tuple[str, ...] = (),
    ) -> None:
        """``features``: for ``--enable-feature`` (``exemplar-storage``)."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus is not installed (apt-get install prometheus)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: trt-otel\n    scrape_interval: 1s\n"
            "    scrape_timeout: 900ms\n"
            + (f"    static_configs:\n      - targets: ['{target}']\n" if target else "")
            + (
                f"    file_sd_configs:\n      - files: ['{sd_dir}/*.json']\n"
                "        refresh_interval: 1s\n"
                if sd_dir is not None
                else ""
            )
        )
        self._log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                *(f"--enable-feature={feature}" for feature in features),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("prometheus exited at start")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("prometheus did not become ready")

    def query(self, expression: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(self, expression: str, timeout_s: float = 20) -> list[dict[str, Any]]:
        """Poll until ``expression`` returns data."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expression)
            if result or time.monotonic() > deadline:
                return result
            time.sleep(0.25)

    def exemplars(self, expression: str, start_s: float, end_s: float) -> list[dict[str, Any]]:
        """``/api/v1/query_exemplars``: the exemplars of the series ``expression`` selects."""
        query = urllib.parse.urlencode({"query": expression, "start": start_s, "end": end_s})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_exemplars?{query}", timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        """The targets Prometheus scrapes now (``/api/v1/targets``), with their labels."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=5) as f:
            body = json.load(f)
        targets: list[dict[str, Any]] = body["data"]["activeTargets"]
        return targets

    def wait_until_scraping(self, timeout_s: float = 30) -> None:
        """Until Prometheus has tried its target at least once (up or down): from then on it
        tries it every second, so a build that serves its metrics for a few seconds is
        scraped while it runs."""
        wait_until(
            lambda: any(
                not t.get("lastScrape", "").startswith("0001-") for t in self.active_targets()
            ),
            "prometheus never tried its target",
            timeout_s,
        )

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def promtool_lint(text: str) -> str:
    """What ``promtool check metrics`` says of an exposition: "" when it finds nothing."""
    lint = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    findings = (lint.stdout + lint.stderr).strip()
    return findings or ("" if lint.returncode == 0 else f"promtool exited {lint.returncode}")
