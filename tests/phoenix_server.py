"""A real trace backend for the tests: Arize Phoenix (an OTLP receiver over gRPC and HTTP, with
a span query API and a UI), run on loopback from its own virtual environment
(``.venv-phoenix``, made by ``make phoenix``: its dependencies are not trt-otel's), and the skip
of a test that needs it where it is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_server import free_port

ROOT = Path(__file__).resolve().parent.parent
PHOENIX = Path(os.environ.get("TRT_OTEL_PHOENIX", ROOT / ".venv-phoenix" / "bin" / "phoenix"))
"""Phoenix's command (``TRT_OTEL_PHOENIX`` where it is installed elsewhere)."""
MISSING = f"Arize Phoenix is not installed at {PHOENIX} (`make phoenix`; .ci/run makes it)"


@dataclass(frozen=True)
class PhoenixSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    status_code: str
    """``UNSET``, ``OK`` or ``ERROR``."""
    attributes: dict[str, Any]

    @property
    def snapshot(self) -> bool:
        return self.attributes.get("trt.span.snapshot") is True


class PhoenixServer:
    """Phoenix on free loopback ports, its data in ``workdir``; stopped by :meth:`close`."""

    def __init__(self, workdir: Path) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        env = {
            **os.environ,
            "PHOENIX_WORKING_DIR": str(workdir),
            "PHOENIX_HOST": "127.0.0.1",
            "PHOENIX_PORT": str(self.http_port),
            "PHOENIX_GRPC_PORT": str(self.grpc_port),
            "PHOENIX_TELEMETRY_ENABLED": "false",
            # A trace backend is all the tests need: no agent assistant, and nothing fetched
            # from the internet at start-up (its docs server, its sandboxes' binaries), which
            # this machine cannot reach and which Phoenix otherwise tries, and waits for.
            "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        }
        self._log = (workdir / "phoenix.log").open("wb")
        self.process = subprocess.Popen(
            [str(PHOENIX), "serve"], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        # A hang's guard: at the start of a full run, the busiest part of it, Phoenix took 94 to
        # 122 s to answer (some 16 s of CPU on a quiet machine).
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                log = (workdir / "phoenix.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Phoenix did not start: {log}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def spans(self, project: str) -> list[PhoenixSpan]:
        """Every span of ``project`` (its REST API, a page at a time); none for a project it
        has not seen yet."""
        spans: list[PhoenixSpan] = []
        cursor: str | None = None
        while True:
            query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
            url = f"{self.url}/v1/projects/{urllib.parse.quote(project)}/spans?"
            try:
                with urllib.request.urlopen(url + urllib.parse.urlencode(query), timeout=10) as a:
                    page = json.load(a)
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return []
                raise
            spans += [
                PhoenixSpan(
                    name=item["name"],
                    trace_id=item["context"]["trace_id"],
                    span_id=item["context"]["span_id"],
                    parent_id=item.get("parent_id"),
                    status_code=item.get("status_code", "UNSET"),
                    attributes=item.get("attributes") or {},
                )
                for item in page["data"]
            ]
            cursor = page.get("next_cursor")
            if not cursor:
                return spans

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
