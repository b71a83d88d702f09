"""What a user pays for ``trt-otel demo --trace ...`` as the command runs it, whole process tree.

The trace is phase-dense: the body of the recorded TensorRT 10.16.2 MNIST build (1,163 phases
and 4,107 steps, "Measuring tactic time" started 1,107 times) repeated inside one root phase
until it holds the steps asked for. The command runs with every projection on: the journal,
/metrics (scraped every second), the HTTP view, spans to an unreachable collector, plain
console lines. Measured from outside, per run:

- CPU: user + system time of the whole process tree (the supervisor and the build's worker,
  reaped by it), per callback, against the lock-and-dict monitor's own cost (its time per
  callback minus the no-op monitor's), measured in this process on the same callbacks in the
  same run;
- peak resident set (``VmHWM``) of the supervisor and of the worker, read every 20 ms;
- how long after the last callback (its time in the journal) the journal's ``build_end`` was
  on disk, read every 5 ms;
- with a cancel file created mid-build: how long after the cancel decision (the ``cancel``
  event's time) ``build_end`` was on disk.

``python benchmarks/command_cost.py [quick]``: quick leaves the million-step trace out.
"""

from __future__ import annotations

import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from harness import LockAndDictMonitor

from trt_otel.builder.simulator import Callback, Driver, NoOpMonitor, load_trace
from trt_otel.core.journal_reader import read_journal

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("TRT_OTEL_TRACES_DIR", ROOT.parent / "shared" / "traces"))
TRACE = TRACES / "trt-10.16.2-mnist.jsonl"
ROOT_PHASE = "Building engine"
CALLBACK_EVENTS = (b'"type":"phase_start"', b'"type":"step"', b'"type":"phase_finish"')


def phase_dense_trace(path: Path, steps: int) -> int:
    """Write the recorded build's body repeated until it has ``steps`` steps; returns the
    number of callbacks."""
    recorded = load_trace(TRACE)
    body = [c for c in recorded[1:-2] if c.name != ROOT_PHASE]
    per_copy = sum(c.kind == "step_complete" for c in body) + 1
    copies = max(1, math.ceil(steps / per_copy))
    encoder = msgspec.json.Encoder()
    root = {
        "cb": "phase_start",
        "phase_name": ROOT_PHASE,
        "parent_phase": None,
        "num_steps": copies,
    }
    body_lines = encoder.encode_lines([_line(c) for c in body])
    with open(path, "wb") as out:
        out.write(encoder.encode(root) + b"\n")
        for copy in range(copies):  # the root steps once per copy, as it would per stage
            out.write(body_lines)
            step = {"cb": "step_complete", "phase_name": ROOT_PHASE, "step": copy}
            out.write(encoder.encode(step) + b"\n")
        out.write(encoder.encode({"cb": "phase_finish", "phase_name": ROOT_PHASE}) + b"\n")
    callbacks = 1 + copies * (len(body) + 1) + 1
    return callbacks


def _line(callback: Callback) -> dict[str, object]:
    if callback.kind == "phase_start":
        return {
            "cb": "phase_start",
            "phase_name": callback.name,
            "parent_phase": callback.parent,
            "num_steps": callback.num_steps,
        }
    if callback.kind == "step_complete":
        return {"cb": "step_complete", "phase_name": callback.name, "step": callback.step}
    return {"cb": "phase_finish", "phase_name": callback.name}


def baseline_ns(plan: Sequence[Callback]) -> tuple[float, float]:
    """Time per callback of the no-op and the lock-and-dict monitors (the fastest of five
    runs each: noise only adds, and the difference of two noisy figures is noisier still)."""

    def per_callback(monitor: object) -> float:
        began = time.perf_counter_ns()
        Driver(speed=0).run(monitor, plan)  # type: ignore[arg-type]
        return (time.perf_counter_ns() - began) / len(plan)

    noop = min(per_callback(NoOpMonitor()) for _ in range(5))
    minimal = min(per_callback(LockAndDictMonitor()) for _ in range(5))
    return noop, minimal


@dataclass
class Run:
    callbacks: int
    cpu_s: float
    wall_s: float
    peak_mib: dict[str, float]
    last_callback_to_end_s: float
    cancel_to_end_s: float | None
    exit_code: int
    events: int
    notes: list[str] = field(default_factory=list)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            for child in text.split():
                found.append(int(child))
                found.extend(_children(int(child)))
    except OSError:
        pass
    return found


def _hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _role(pid: int) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "other"
    if b"spawn_main" in cmdline:
        return "worker"
    if b"resource_tracker" in cmdline:
        return "resource tracker"
    return "other"


def run_command(
    trace: Path,
    directory: Path,
    *,
    speed: float,
    cancel_after_s: float | None = None,
    http: bool = True,
    program: Sequence[str] | None = None,
) -> Run:
    """Run ``trt-otel demo`` on ``trace`` with every projection on (``http``: the HTTP view
    and its live page too); measure it from outside. ``program``: the command that is
    ``trt-otel`` (default: this checkout's)."""
    from prometheus_server import free_port

    journal = directory / "run.jsonl"
    journal.unlink(missing_ok=True)
    cancel_file = directory / "stop"
    cancel_file.unlink(missing_ok=True)
    metrics_port, http_port, dead_port = free_port(), free_port(), free_port()
    command = [
        *(program or [str(ROOT / ".venv" / "bin" / "trt-otel")]),
        "demo",
        "--trace", str(trace),
        "--speed", str(speed),
        "--journal", str(journal),
        "--prometheus-port", str(metrics_port),
        *(["--http-port", str(http_port)] if http else []),
        "--otlp-endpoint", f"http://127.0.0.1:{dead_port}",
        "--cancel-file", str(cancel_file),
        "--no-progress",
        "--no-gpu",
    ]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks: dict[str, float] = {}
    seen: dict[str, int] = {}
    stop = threading.Event()

    def watch_memory() -> None:
        while not stop.is_set():
            for pid, role in [(process.pid, "supervisor")] + [
                (child, _role(child)) for child in _children(process.pid)
            ]:
                value = _hwm_mib(pid)
                if value is not None:
                    peaks[role] = max(peaks.get(role, 0.0), value)
            stop.wait(0.02)

    def watch_journal() -> None:
        offset, tail = 0, b""
        while not stop.is_set():
            try:
                with open(journal, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                data = b""
            now = time.time_ns()
            if data:
                offset += len(data)
                window = tail + data
                if "first_callback" not in seen and any(k in window for k in CALLBACK_EVENTS):
                    seen["first_callback"] = now
                if b'"type":"build_end"' in window:
                    seen["build_end"] = now
                    return
                tail = window[-64:]
            stop.wait(0.005)

    def scrape() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2):
                    pass
            except OSError:
                pass
            stop.wait(1.0)

    def cancel_later() -> None:
        assert cancel_after_s is not None
        while "first_callback" not in seen and not stop.is_set():
            stop.wait(0.005)
        if not stop.wait(cancel_after_s):
            cancel_file.touch()

    threads = [threading.Thread(target=t, daemon=True) for t in (watch_memory, watch_journal)]
    threads.append(threading.Thread(target=scrape, daemon=True))
    if cancel_after_s is not None:
        threads.append(threading.Thread(target=cancel_later, daemon=True))
    for thread in threads:
        thread.start()
    _, stderr = process.communicate(timeout=900)
    wall_s = time.monotonic() - began
    stop.set()
    for thread in threads:
        thread.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    events = read_journal(journal).events
    callbacks = [e for e in events if e.type in ("phase_start", "step", "phase_finish")]
    cancels = [e for e in events if e.type == "cancel"]
    ends = [e for e in events if e.type == "build_end"]
    run = Run(
        callbacks=len(callbacks),
        cpu_s=cpu_s,
        wall_s=wall_s,
        # "other": a child between its fork and its exec, still the supervisor's image.
        peak_mib={k: v for k, v in peaks.items() if k in ("supervisor", "worker")},
        last_callback_to_end_s=(
            (seen["build_end"] - callbacks[-1].wall_ns) / 1e9
            if callbacks and "build_end" in seen
            else math.nan
        ),
        cancel_to_end_s=(
            (seen["build_end"] - cancels[0].wall_ns) / 1e9
            if cancels and "build_end" in seen
            else None
        ),
        exit_code=process.returncode,
        events=len(events),
    )
    if not ends or "build_end" not in seen:
        run.notes.append("no build_end in the journal")
    if cancels:
        late = [e for e in callbacks if e.seq > cancels[0].seq and e.mono_ns < cancels[0].mono_ns]
        if late:
            run.notes.append(f"{len(late):,} callbacks made before the cancel logged after it")
    if process.returncode not in (0, 3):
        run.notes.append(f"exit {process.returncode}: {stderr.decode()[-400:]}")
    return run


def main() -> int:
    quick = sys.argv[1:] == ["quick"]
    # 250k steps: about 400k callbacks, the size the journal's end is held to (3 s at most).
    sizes = (10_000, 100_000, 250_000) if quick else (10_000, 100_000, 250_000, 1_000_000)
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        traces: dict[int, tuple[Path, int]] = {}
        for steps in sizes:
            path = directory / f"dense-{steps}.jsonl"
            traces[steps] = (path, phase_dense_trace(path, steps))
        plan = load_trace(traces[100_000][0])
        noop_ns, minimal_ns = baseline_ns(plan)
        own_ns = minimal_ns - noop_ns
        load = os.getloadavg()[0]
        print(
            f"baseline on the 100k trace ({len(plan):,} callbacks): no-op {noop_ns / 1e3:.2f} us, "
            f"lock-and-dict {minimal_ns / 1e3:.2f} us, its own cost {own_ns / 1e3:.2f} us; "
            f"load {load:.1f}",
            flush=True,
        )
        print("as the command runs it, full speed (--speed 0), every projection on:")
        runs: dict[int, Run] = {}
        for steps in sizes:
            path, _ = traces[steps]
            run = runs[steps] = run_command(path, directory, speed=0)
            per_callback_us = run.cpu_s / run.callbacks * 1e6
            peaks = ", ".join(f"{k} {v:.0f} MiB" for k, v in sorted(run.peak_mib.items()))
            print(
                f"  {steps:>9,} steps, {run.callbacks:>9,} callbacks: whole-tree CPU "
                f"{run.cpu_s:6.1f} s = {per_callback_us:5.2f} us/callback "
                f"({per_callback_us * 1e3 / own_ns:5.1f}x); peak RSS {peaks}; build_end on disk "
                f"{run.last_callback_to_end_s:5.2f} s after the last callback; "
                f"wall {run.wall_s:5.1f} s; exit {run.exit_code}"
                + "".join(f"; {n}" for n in run.notes),
                flush=True,
            )
        small, large = runs[sizes[-2]], runs[sizes[-1]]
        marginal_ns = (large.cpu_s - small.cpu_s) / (large.callbacks - small.callbacks) * 1e9
        print(
            f"  marginal CPU per callback between the two largest (start-up excluded): "
            f"{marginal_ns / 1e3:.2f} us ({marginal_ns / own_ns:.1f}x); of which the simulated "
            f"builder's own (the no-op monitor's time): {noop_ns / 1e3:.2f} us"
        )
        # The live page's cost in memory: the same largest run without --http-port.
        bare = run_command(traces[sizes[-1]][0], directory, speed=0, http=False)
        with_page = max(large.peak_mib.values(), default=math.nan)
        without = max(bare.peak_mib.values(), default=math.nan)
        print(
            f"  the HTTP view and its page at {sizes[-1]:,} steps: peak RSS {with_page:.0f} MiB "
            f"against {without:.0f} MiB without --http-port ({with_page - without:+.0f} MiB; "
            f"goal: within 20 MiB); whole-tree CPU {large.cpu_s:.1f} s against {bare.cpu_s:.1f} s"
        )
        print("a cancel file created mid-build: cancel decision to build_end on disk:")
        for label, steps, speed, after_s in (
            ("at a builder's pace (--speed 20)", 10_000, 20.0, 3.0),
            ("at full speed", sizes[-1], 0.0, 0.3),
        ):
            path, _ = traces[steps]
            run = run_command(path, directory, speed=speed, cancel_after_s=after_s)
            cancel = "no cancel" if run.cancel_to_end_s is None else f"{run.cancel_to_end_s:.2f} s"
            print(
                f"  {label}, {steps:,}-step trace, cancelled {after_s:.1f} s in: {cancel} "
                f"(last callback to build_end {run.last_callback_to_end_s:.2f} s); "
                f"exit {run.exit_code}" + "".join(f"; {n}" for n in run.notes),
                flush=True,
            )
        mid = runs[250_000]
        print(
            f"build_end on disk after the last of {mid.callbacks:,} callbacks at full speed: "
            f"{mid.last_callback_to_end_s:.2f} s (held to 3 s)"
        )
        # The headline: the largest trace four times more (its whole-tree CPU moves by a
        # tenth between runs here), the median of the five.
        cpu_s = [large.cpu_s] + [
            run_command(traces[sizes[-1]][0], directory, speed=0).cpu_s for _ in range(4)
        ]
        figures = sorted(s / large.callbacks * 1e9 / own_ns for s in cpu_s)
        per_callback = ", ".join(f"{s / large.callbacks * 1e6:.2f}" for s in sorted(cpu_s))
        print(
            f"the largest trace five times: {', '.join(f'{f:.1f}x' for f in figures)} "
            f"({per_callback} us a callback)"
        )
        print(
            f"headline: whole-tree CPU per callback as the command runs it ({large.callbacks:,} "
            f"callbacks, median of five runs) / lock-and-dict own cost = {figures[2]:.1f}x "
            f"(load {os.getloadavg()[0]:.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    sys.exit(main())
