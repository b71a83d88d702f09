"""Waits the tests on real processes share: each polls with a deadline, never a bare sleep."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from trt_otel import read_journal
from trt_otel.builder.simulator import Callback, generate_plan

CALLBACK_TYPES = (b'"type":"phase_start"', b'"type":"step"', b'"type":"phase_finish"')


def wait_until(
    condition: Callable[[], object], what: str, timeout_s: float = 60, *, every_s: float = 0.02
) -> None:
    """Until ``condition()`` is true; fails, saying ``what`` was awaited, after ``timeout_s``.
    ``every_s``: how often it is asked (a condition that queries a server asks it less often)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        time.sleep(every_s)


def wait_for_file(path: Path, timeout_s: float = 30) -> None:
    """Until something is at ``path`` (a file that a process creates when it is ready)."""
    wait_until(path.exists, f"{path} did not appear", timeout_s)


def wait_for_text(path: Path, text: bytes, timeout_s: float = 60) -> None:
    """Until ``text`` is in the file at ``path`` (a journal a build is writing)."""
    wait_until(
        lambda: path.exists() and text in path.read_bytes(),
        f"{text!r} never appeared in {path}",
        timeout_s,
    )


def silent_at(plan: list[Callback]) -> int:
    """How many callbacks the simulator makes before its silent window (``--silence``): it
    holds still before the first "Timing tactics" starts."""
    return next(
        index
        for index, callback in enumerate(plan)
        if callback.kind == "phase_start" and callback.name == "Timing tactics"
    )


DEMO_SILENT_AT = silent_at(generate_plan(13))
"""The demo's (its model has 13 layers): every callback before its silence."""


def callbacks_in(journal: Path) -> int:
    """The callbacks a journal holds so far (whole lines only)."""
    if not journal.exists():
        return 0
    lines = journal.read_bytes().split(b"\n")[:-1]
    return sum(1 for line in lines if any(kind in line for kind in CALLBACK_TYPES))


def wait_for_silence(journal: Path, before: int = DEMO_SILENT_AT, timeout_s: float = 60) -> None:
    """Until the journal holds the ``before`` callbacks made before the silent window: the
    build is inside it (no callback comes until it ends)."""
    wait_until(
        lambda: callbacks_in(journal) >= before,
        f"{journal} never reached the silent window ({before} callbacks)",
        timeout_s,
    )


def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux's ``/proc/PID/fd``)."""
    try:
        return any(
            os.readlink(descriptor) == str(path) for descriptor in Path(f"/proc/{pid}/fd").iterdir()
        )
    except OSError:  # it ended, or a descriptor closed while read
        return False


def wait_for_journal(
    journal: Path, process: subprocess.Popen[str], kind: str, name: str | None = None
) -> None:
    """Until the journal has an event of type ``kind`` (and that ``name``, for a phase), for
    two minutes at most; fails at once if ``process`` (its writer) ends first."""
    deadline = time.monotonic() + 120
    while True:
        # Created before its header is written: an empty journal is one just begun.
        if journal.exists() and journal.stat().st_size > 0:
            events = read_journal(journal).events
            if any(e.type == kind and getattr(e, "name", name) == name for e in events):
                return
        assert time.monotonic() < deadline, f"never saw {kind} {name or ''} in the journal"
        assert process.poll() is None, process.communicate()
        time.sleep(0.05)


def write_at_once(path: Path, text: str) -> None:
    """Make ``path`` appear with ``text`` in it, whole (written beside it, then renamed): a
    poller that sees a cancel file the moment it is created would otherwise read it empty."""
    part = path.with_name(path.name + ".part")
    part.write_text(text)
    os.replace(part, path)
