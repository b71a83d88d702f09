"""Prometheus file-based service discovery: a running build's scrape endpoint, announced.

Prometheus' ``file_sd_configs`` watches a folder of JSON files, each a list of target groups
(``[{"targets": ["host:port"], "labels": {...}}]``), and scrapes every target they name,
re-reading a file when it changes. With ``--prometheus-sd-dir DIR`` a build writes one such file
for its endpoint once it serves, and removes it once the endpoint has closed (after its last
scrape), whether the build succeeded, failed, was cancelled or interrupted: one Prometheus,
configured once, finds every build on the host (or on every host that shares the folder).

A file is ``DIR/trt-otel-HOST-PID-ID.json``, written whole (a reader never sees half of it) and
readable by all (Prometheus runs as a user of its own). A process killed outright (SIGKILL, the
OOM killer) cannot remove its file; the next build on the same host removes the files of the
host's processes that are gone, and Prometheus marks such a target down meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trt_otel.control.stopping import process_running
from trt_otel.core.files import write_atomically

PREFIX = "trt-otel-"
MAX_LABEL_CHARS = 128
"""A label value is cut to this many characters: a model's file name can be long, and every
scraped series carries the value."""
_UNSPECIFIED = frozenset({"0.0.0.0", "::", ""})
_NAME_PART = re.compile(r"[^A-Za-z0-9.-]+")


def discovery_labels(attributes: Mapping[str, Any], host: str | None = None) -> dict[str, str]:
    """The target's labels from the build's attributes: ``host``, and ``gpu`` (its model, as
    NVML names it), ``backend`` and ``model`` (the ONNX file's name) where they are known."""
    labels = {"host": host or socket.gethostname()}
    known = {
        "gpu": attributes.get("gpu.name"),
        "backend": attributes.get("trt.backend"),
        "model": str(attributes["model.path"]).rsplit("/", 1)[-1]
        if "model.path" in attributes
        else None,
    }
    labels.update({name: str(value) for name, value in known.items() if value})
    return {name: value[:MAX_LABEL_CHARS] for name, value in labels.items()}


def target_address(address: str, port: int, host: str | None = None) -> str:
    """``host:port`` as Prometheus reaches it: the address served on, or this host's name for
    one served on every interface (0.0.0.0, ::)."""
    if address in _UNSPECIFIED:
        address = host or socket.gethostname()
    if ":" in address:
        address = f"[{address}]"
    return f"{address}:{port}"


class ScrapeTarget:
    """One build's target file in ``directory``: :meth:`announce` writes it, :meth:`withdraw`
    removes it (at most once, and harmless when nothing was written). A context manager that
    withdraws on exit, however the block ends."""

    def __init__(
        self,
        directory: Path,
        labels: Mapping[str, str],
        build_id: str,
        *,
        host: str | None = None,
    ) -> None:
        self.directory = directory
        self.labels = dict(labels)
        self.host = host or socket.gethostname()
        name = _NAME_PART.sub("_", self.host)[:64]
        self.path = directory / f"{PREFIX}{name}-{os.getpid()}-{build_id[:12]}.json"
        self._host_prefix = f"{PREFIX}{name}-"
        self.written = False

    def announce(self, address: str, port: int, metrics_path: str = "/metrics") -> None:
        """Write the target file (and remove this host's files left by processes now gone).
        Raises :class:`OSError` when the folder cannot be written."""
        self.remove_orphans()
        group = {
            "targets": [target_address(address, port, self.host)],
            "labels": {**self.labels, "__metrics_path__": metrics_path},
        }
        write_atomically(self.path, (json.dumps([group], indent=1) + "\n").encode(), mode=0o644)
        self.written = True

    def withdraw(self) -> None:
        if self.written:
            self.written = False
            with contextlib.suppress(OSError):
                self.path.unlink()

    def remove_orphans(self) -> list[Path]:
        """This host's target files whose process has ended, removed; the paths removed."""
        removed: list[Path] = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return removed
        for name in names:
            if not (name.startswith(self._host_prefix) and name.endswith(".json")):
                continue
            pid_text = name[len(self._host_prefix) :].split("-", 1)[0]
            if not pid_text.isdigit() or int(pid_text) == os.getpid():
                continue
            if process_running(int(pid_text)) is False:
                with contextlib.suppress(OSError):
                    (self.directory / name).unlink()
                    removed.append(self.directory / name)
        return removed

    def __enter__(self) -> ScrapeTarget:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.withdraw()
