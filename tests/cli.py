"""The trt-otel command as the tests start it, in a process of its own: its command line (the
one place in the tests that spells ``-m trt_otel.app.cli``), a run to its end, a demo build
started in the background, and the address of the HTTP view a build announces (read at once,
or all along by :class:`ServingBuild`).

Every helper hands back what the process did (its exit code, what it wrote) for the test to
check; none of them checks it, but :func:`demo_journal`, whose callers want a build's journal.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Self

CLI_MODULE = ["-m", "trt_otel.app.cli"]
"""The command line after the interpreter (and after its own options: ``python -S``), also an
MCP client's ``args`` to start ``trt-otel mcp`` with ``sys.executable``."""

CLI = [sys.executable, *CLI_MODULE]
"""``trt-otel``, run by the Python that runs the tests."""

HOLD = ("--speed", "0", "--silence", "2s")
"""A demo at full speed that holds still for 2 s where tactic timing begins (as real builds go
silent there): the time a test has to act mid-build, without a paced build's tens of seconds.
A cancel asked for in the window takes effect at the first step after it, gracefully."""

MID_BUILD = b"Computing profile costs"
"""In a demo's journal once the build has reached its silent window."""

Output = int | IO[str] | None
"""Where a started process's stdout or stderr goes, as :class:`subprocess.Popen` takes it."""


def run_cli(
    *args: str | Path,
    timeout: float = 300,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: int | None = None,
    umask: int = -1,
) -> subprocess.CompletedProcess[str]:
    """``trt-otel ARGS`` to its end (``timeout`` seconds at most), in ``cwd``, with what it
    wrote captured as text. ``env`` is its whole environment (None: this process's); ``umask``
    its umask (-1: this process's)."""
    return subprocess.run(
        [*CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=env,
        stdin=stdin,
        umask=umask,
    )


def run_demo(
    *args: str | Path, timeout: float = 120, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``trt-otel demo --no-progress ARGS`` to its end, as :func:`run_cli`."""
    return run_cli("demo", "--no-progress", *args, timeout=timeout, env=env)


def demo_journal(journal: Path, *options: str | Path) -> Path:
    """The journal of a demo build at full speed, without a summary (``trt-otel demo --speed 0
    --no-progress --no-summary --journal JOURNAL OPTIONS``), which must succeed."""
    done = run_cli(
        "demo", "--speed", "0", "--no-progress", "--no-summary", "--journal", journal, *options,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return journal


def start_cli(
    *args: str | Path,
    stdout: Output = subprocess.PIPE,
    stderr: Output = subprocess.PIPE,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    start_new_session: bool = False,
) -> subprocess.Popen[str]:
    """``trt-otel ARGS`` started, not waited for: its stdout and stderr are pipes (text) unless
    said otherwise; ``env`` is its whole environment (None: this process's)."""
    return subprocess.Popen(
        [*CLI, *map(str, args)],
        stdout=stdout,
        stderr=stderr,
        text=True,
        cwd=cwd,
        env=env,
        start_new_session=start_new_session,
    )


@contextlib.contextmanager
def killed_at_exit(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``process`` (started in a session of its own), and at the block's end its whole group
    killed if it is still running: a test that fails leaves no build behind."""
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_demo(
    *args: str | Path,
    stdout: Output = subprocess.PIPE,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """``trt-otel demo --no-progress ARGS`` started, as :func:`start_cli`."""
    return start_cli("demo", "--no-progress", *args, stdout=stdout, cwd=cwd, env=env)


HTTP_ANNOUNCED = re.compile(r"http: (http://[^/]+)/status")
"""The line a build started with ``--http-port`` says where its HTTP view is on (its group: the
view's base URL)."""


def announced_url(
    process: subprocess.Popen[str], read: list[str] | None = None, timeout_s: float = 30
) -> str:
    """The base URL (``http://HOST:PORT``) of the HTTP view that ``process`` announces on its
    stderr, read up to that line (each line read is added to ``read``). Fails, the process
    killed, if its stderr ends first or the line has not come after ``timeout_s``."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if read is not None:
            read.append(line)
        if not line:
            break
        if match := HTTP_ANNOUNCED.match(line):
            return match.group(1)
    process.kill()
    raise AssertionError("the build did not announce its HTTP endpoint")


class ServingBuild:
    """``trt-otel ARGS``, a build serving its HTTP view on a free port (``--http-port 0``): its
    stderr is read all along into ``lines`` (so the build never blocks on a full pipe), and
    ``base`` is the view's URL, announced within ``announce_s`` (or the build is stopped and
    the test fails). Leaving a ``with`` block stops the build if it still runs."""

    def __init__(self, *args: str | Path, announce_s: float = 60) -> None:
        self.process = start_cli(*args, stdout=subprocess.DEVNULL)
        self.lines: list[str] = []
        self._announced = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._announced.wait(announce_s):
            self.close()
            raise AssertionError(f"the build did not announce its HTTP endpoint: {self.lines}")
        announced = (HTTP_ANNOUNCED.match(line) for line in self.lines)
        self.base = next(m.group(1) for m in announced if m)

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if line.startswith("http: "):
                self._announced.set()

    def wait(self, timeout_s: float = 60) -> int:
        """The build's exit code, once it has ended by itself within ``timeout_s``."""
        try:
            return self.process.wait(timeout_s)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the build if it still runs, and finish reading what it wrote."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(10)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
