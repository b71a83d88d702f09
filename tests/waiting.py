"""Waits the tests on real processes share: each polls with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for_text(path: Path, text: bytes, timeout_s: float = 60) -> None:
    """Until ``text`` is in the file at ``path`` (a journal a build is writing)."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and text in path.read_bytes()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.05)
