"""Journals crafted as an adversary would: a header naming a process that is not the writer."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path


def craft_journal(journal: Path, writer_pid: int) -> None:
    """A journal whose header names ``writer_pid`` as its writer, on this host, written now
    (into the file already there, so a process holding it open holds this one)."""
    now = time.time_ns()
    header = {
        "format": "trt-otel-journal", "version": 1, "created_wall_ns": now,
        "producer": "trt-otel 0.1.0", "writer_pid": writer_pid,
        "writer_host": socket.gethostname(), "touch_interval_s": 10.0,
    }  # fmt: skip
    start = {
        "type": "build_start", "seq": 0, "wall_ns": now, "mono_ns": time.monotonic_ns(),
        "thread": "MainThread", "build_id": "crafted", "attributes": {},
    }  # fmt: skip
    with journal.open("r+" if journal.exists() else "w") as file:
        file.write(json.dumps(header) + "\n" + json.dumps(start) + "\n")
