"""How long a stop takes: real TensorRT-RTX builds cancelled at random moments, through each way
of stopping one, from the request to the moment the command has exited.

Each build is ``trt-otel build`` of a 600-block residual net (a silent window of seconds in
"Determining refit engines", where a cancel can only wait for TensorRT's next step or escalate),
with the defaults a user has (``--grace 30s``, ``--stop-budget 7.5s``). The moment is drawn
uniformly over an uncancelled build's length, so some cancels land inside the silent window and
some outside it. Paths: Ctrl-C (SIGINT), SIGTERM to trt-otel, SIGTERM to its whole process group
(``scancel``, ``kill -- -PGID``), SIGUSR1 (a scheduler's time-limit warning), ``POST /cancel``,
a cancel file, and ``--timeout``. For each: p50, p99 and the worst of

- **exit**: the request (for ``--timeout``, the journal's cancel) to the command's exit, every
  trt-otel process gone (the worker dies with its supervisor);
- **journal**: the cancel event to the journal's ``build_end`` (what
  ``trt_build_cancel_latency_seconds`` observes);

and whether anything was lost: every journal must end, with the cancel in it and the exit code its
outcome's. ``--builds N`` per path (30 by default), ``--paths`` to choose. Prints one row per path.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trt_otel import read_journal
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES, residual_net_bytes
from trt_otel.core.events import BuildFinished, CancelRequested, PhaseStarted, StepCompleted

CLI = [sys.executable, "-m", "trt_otel.app.cli"]
SHAPES = RESIDUAL_SHAPES
SILENT_PHASE = "Determining refit engines"
TOKEN = "benchmark-token"
PATHS = ("sigint", "sigterm", "sigterm-group", "sigusr1", "http", "file", "timeout")
EXIT_OF_PATH = {"sigint": 130}
"""The exit code each path gives (3, a cancel or a timeout, unless named)."""


@dataclass
class Stop:
    path: str
    at_s: float
    exit_s: float | None = None
    journal_s: float | None = None
    in_silence: bool = False
    ended_first: bool = False
    """The build ended before its request was sent: no stop to time (not a loss)."""
    lost: list[str] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", type=int, default=30, help="builds per path (default: 30)")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"unknown paths {unknown}: choose from {', '.join(PATHS)}")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="trt-otel-cancel-") as folder:
        root = Path(folder)
        model = root / "residual600.onnx"
        model.write_bytes(residual_net_bytes(600))
        length_s = _uncancelled_length(model, root)
        print(f"an uncancelled build takes {length_s:.1f}s; cancels drawn over it", flush=True)
        stops = []
        for index in range(args.builds * len(paths)):
            path = paths[index % len(paths)]
            stop = _cancel_one(model, root / f"b{index}", path, rng.uniform(0.05, 0.95) * length_s)
            stops.append(stop)
            silence = "  in silence" if stop.in_silence else ""
            silence += "  ended before its request" if stop.ended_first else ""
            lost = "  LOST: " + "; ".join(stop.lost) if stop.lost else ""
            print(f"  {path:14s} at {stop.at_s:5.1f}s  exit {_text(stop.exit_s)}  journal "
                  f"{_text(stop.journal_s)}{silence}{lost}", flush=True)  # fmt: skip
    return _report(stops, paths)


def _uncancelled_length(model: Path, root: Path) -> float:
    began = time.monotonic()
    done = subprocess.run(
        [*CLI, "build", str(model), "-o", str(root / "whole.engine"), "--shapes", SHAPES,
         "--no-progress", "--no-gpu", "--no-summary"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the uncancelled build failed: {done.stderr[-500:]}")
    return time.monotonic() - began


def _cancel_one(model: Path, folder: Path, path: str, at_s: float) -> Stop:
    folder.mkdir()
    journal, sentinel, url_file = folder / "j.jsonl", folder / "STOP", folder / "url"
    options = ["--journal", str(journal)]
    if path == "http":
        options += ["--http-port", "0", "--http-url-file", str(url_file), "--cancel-token", TOKEN]
    elif path == "file":
        options += ["--cancel-file", str(sentinel)]
    elif path == "timeout":
        options += ["--timeout", f"{at_s:.2f}s"]
    began = time.monotonic()
    process = subprocess.Popen(
        [*CLI, "build", str(model), "-o", str(folder / "e.engine"), "--shapes", SHAPES,
         "--no-progress", "--no-gpu", "--no-summary", *options],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(process.stderr or ()), daemon=True)
    reader.start()
    stop = Stop(path, at_s)
    requested = None
    if path != "timeout":
        try:
            process.wait(max(0.0, began + at_s - time.monotonic()))
            stop.ended_first = True
        except subprocess.TimeoutExpired:
            requested = time.monotonic()
            _request(path, process, sentinel, url_file)
    try:
        code = process.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        code = process.wait()
        stop.lost.append("still running 120 s after its cancel")
    exited = time.monotonic()
    reader.join(5)
    _check(stop, journal, code, (requested, exited), "".join(stderr))
    return stop


def _request(path: str, process: subprocess.Popen[str], sentinel: Path, url_file: Path) -> None:
    signals: dict[str, Callable[[], object]] = {
        "sigint": lambda: process.send_signal(signal.SIGINT),
        "sigterm": lambda: process.send_signal(signal.SIGTERM),
        "sigterm-group": lambda: os.killpg(process.pid, signal.SIGTERM),
        "sigusr1": lambda: os.killpg(process.pid, signal.SIGUSR1),
        "file": lambda: sentinel.write_text("benchmark\n"),
        "http": lambda: _post_cancel(url_file),
    }
    signals[path]()


def _post_cancel(url_file: Path) -> None:
    text = url_file.read_text().strip() if url_file.exists() else ""
    match = re.match(r"http://([^:/]+):(\d+)", text)
    if match is None:
        return  # not serving yet: the build is checked as uncancelled
    connection = http.client.HTTPConnection(match.group(1), int(match.group(2)), timeout=10)
    try:
        connection.request(
            "POST", "/cancel", body=b'{"reason": "benchmark"}',
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )  # fmt: skip
        connection.getresponse().read()
    finally:
        connection.close()


def _check(
    stop: Stop, journal: Path, code: int, times: tuple[float | None, float], stderr: str
) -> None:
    """What the build's journal and exit say of its stop; ``times``: when the stop was
    requested (None: by the build's own ``--timeout``) and when the command exited."""
    requested, exited = times
    if not journal.exists():
        stop.lost.append("no journal")
        return
    events = list(read_journal(journal).events)
    cancel = next((e for e in events if isinstance(e, CancelRequested)), None)
    end = events[-1] if events and isinstance(events[-1], BuildFinished) else None
    if end is None:
        stop.lost.append("the journal never ends")
    if cancel is None:
        if not stop.ended_first:
            stop.lost.append(f"no cancel in the journal (exit {code}): {stderr[-200:]!r}")
        elif code != 0:
            stop.lost.append(f"ended before its cancel with exit {code}")
        return
    if end is not None:
        stop.journal_s = (end.mono_ns - cancel.mono_ns) / 1e9
    since = requested if requested is not None else cancel.mono_ns / 1e9
    stop.exit_s = exited - since
    expected = EXIT_OF_PATH.get(stop.path, 3)
    if code != expected:
        stop.lost.append(f"exit {code}, not {expected}")
    before = [e for e in events if e.mono_ns <= cancel.mono_ns]
    last = next((e for e in reversed(before) if isinstance(e, PhaseStarted | StepCompleted)), None)
    stop.in_silence = isinstance(last, PhaseStarted) and last.name == SILENT_PHASE


def _report(stops: list[Stop], paths: list[str]) -> int:
    print(f"\n{'path':14s} {'n':>3s} {'silent':>6s}   exit p50   p99 worst   journal p50   p99 "
          "worst  lost")  # fmt: skip
    worst_p99 = 0.0
    lost = 0
    for path in paths:
        mine = [s for s in stops if s.path == path]
        exits = sorted(s.exit_s for s in mine if s.exit_s is not None)
        journals = sorted(s.journal_s for s in mine if s.journal_s is not None)
        silent = sum(s.in_silence for s in mine)
        gone = sum(bool(s.lost) for s in mine)
        lost += gone
        worst_p99 = max(worst_p99, _quantile(exits, 0.99) or 0.0)
        print(f"{path:14s} {len(mine):3d} {silent:6d}   {_figures(exits)}   {_figures(journals)}"
              f"  {gone}")  # fmt: skip
    print(f"\nworst p99 from request to exit: {worst_p99:.2f}s; builds with something lost: {lost}")
    return 1 if lost else 0


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _figures(values: list[float]) -> str:
    if not values:
        return f"{'-':>8s} {'-':>5s} {'-':>5s}"
    p50, p99 = _quantile(values, 0.5), _quantile(values, 0.99)
    return f"{p50:7.2f}s {p99:5.2f} {values[-1]:5.2f}"


def _text(seconds: float | None) -> str:
    return "   -  " if seconds is None else f"{seconds:5.2f}s"


if __name__ == "__main__":
    sys.exit(main())
