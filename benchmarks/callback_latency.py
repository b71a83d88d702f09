"""Latency of each TensorRT callback into trt-otel, under load: percentiles.

Four builder threads call back, each doing a little work between callbacks without the GIL (as
TensorRT's C++ does), while everything that can compete for the GIL is busy: every projection on
(journal, console, spans to an unreachable OTLP collector, the HTTP view, the ETA), a Prometheus
server scraping /metrics every second (Debian's, where installed; else a scraper thread), 20
clients listening to /events, and a cancel URL policy polling a server that never answers. Each
callback is timed from the calling thread, GIL wait included.

Two set-ups: trt-otel as ``trt-otel build`` runs it (callbacks in the worker process, all the
rest in the supervisor), and everything in one process. The goal is p99 under 1 ms.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from harness import FullMonitor, full_monitor

from trt_otel import BuildMonitor
from trt_otel.builder.simulator import Callback, generate_plan
from trt_otel.capture.supervisor import run_isolated
from trt_otel.control.probes import CancelUrl
from trt_otel.control.runner import PolicyRunner

THREADS = 4
WORK_S = 50e-6
"""Builder work between two callbacks of one thread (a sleep: the GIL is free meanwhile)."""
PLAN = generate_plan(13, num_profiles=2) * 3


def thread_plan(index: int) -> list[Callback]:
    """The plan with this thread's own phase names (names are unique among open phases)."""
    renamed = []
    for call in PLAN:
        parent = f"{call.parent} #{index}" if call.parent is not None else None
        name = f"{call.name} #{index}"
        renamed.append(
            Callback(call.kind, name, parent=parent, num_steps=call.num_steps, step=call.step)
        )
    return renamed


def call_back(monitor: BuildMonitor, plan: list[Callback], out: list[int]) -> None:
    timer = time.perf_counter_ns
    for call in plan:
        time.sleep(WORK_S)
        began = timer()
        if call.kind == "step_complete":
            monitor.step_complete(call.name, call.step)
        elif call.kind == "phase_start":
            monitor.phase_start(call.name, call.parent, call.num_steps)
        else:
            monitor.phase_finish(call.name)
        out.append(timer() - began)


def latencies(monitor: BuildMonitor) -> list[int]:
    """Every callback's latency in ns, from ``THREADS`` builder threads."""
    results: list[list[int]] = [[] for _ in range(THREADS)]
    threads = [
        threading.Thread(target=call_back, args=(monitor, thread_plan(i), results[i]))
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [value for result in results for value in result]


def in_worker(monitor: BuildMonitor) -> list[int]:
    return latencies(monitor)


@contextmanager
def hanging_server() -> Iterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/cancel"
    finally:
        stop.set()
        thread.join()
        for connection in held:
            connection.close()
        listener.close()


def listen(port: int, stop: threading.Event) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/events")
    response = connection.getresponse()
    while not stop.is_set() and response.readline():
        pass
    connection.close()


@contextmanager
def load(full: FullMonitor, directory: Path, flag_url: str) -> Iterator[str]:
    """Scraping, listening and a hanging cancel URL around ``full``; yields what scrapes."""
    stop = threading.Event()
    with ExitStack() as stack:
        if shutil.which("prometheus"):
            from prometheus_server import PrometheusServer

            server = PrometheusServer(directory / "prometheus", f"127.0.0.1:{full.metrics.port}")
            stack.callback(server.close)
            scraper = "a Prometheus server, every 1 s"
        else:

            def scrape() -> None:
                while not stop.wait(1.0):
                    with socket.create_connection(("127.0.0.1", full.metrics.port)) as s:
                        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                        while s.recv(65536):
                            pass

            threading.Thread(target=scrape, daemon=True).start()
            scraper = "a scraper thread, every 1 s (no Prometheus installed)"
        listeners = [
            threading.Thread(target=listen, args=(full.status.port, stop), daemon=True)
            for _ in range(20)
        ]
        for listener in listeners:
            listener.start()
        runner = PolicyRunner(full.monitor, CancelUrl(flag_url, interval_s=0.5),
                              warn=lambda message: None)  # fmt: skip
        runner.start()
        stack.callback(runner.stop)
        stack.callback(stop.set)
        yield scraper


def percentiles(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {"p50": at(0.50), "p99": at(0.99), "p99.9": at(0.999), "max": ordered[-1] / 1000,
            "mean": statistics.fmean(ordered) / 1000}  # fmt: skip


def main() -> int:
    from prometheus_server import free_port

    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder, hanging_server() as flag_url:
        directory = Path(folder)
        for setup in ("as the command runs it", "all in one process"):
            (directory / setup[:3] / "prometheus").mkdir(parents=True)
            full = full_monitor(directory / setup[:3], free_port(), "latency")
            with load(full, directory / setup[:3], flag_url) as scraper:
                full.monitor.start()
                time.sleep(2.0)  # let Prometheus and the listeners settle in
                if setup == "as the command runs it":
                    result = run_isolated(in_worker, monitor=full.monitor)
                    assert result.returned, result
                    values = list(result.value)
                else:
                    values = latencies(full.monitor)
            full.close()
            figures[setup] = percentiles(values)
    print(f"{THREADS} builder threads, {len(PLAN) * THREADS:,} callbacks, {WORK_S * 1e6:.0f} us of "
          f"work between a thread's callbacks; OTLP collector down, /metrics scraped by "
          f"{scraper}, 20 SSE listeners, a cancel URL that never answers")  # fmt: skip
    print(f"  {'set-up':24s} {'p50':>8s} {'p99':>8s} {'p99.9':>8s} {'max':>9s} {'mean':>8s} (us)")
    for setup, figure in figures.items():
        columns = " ".join(f"{figure[k]:8.1f}" for k in ("p50", "p99", "p99.9"))
        print(f"  {setup:24s} {columns} {figure['max']:9.1f} {figure['mean']:8.1f}")
    command = figures["as the command runs it"]["p99"]
    print(
        f"headline: p99 callback latency as the command runs it = {command:.0f} us "
        f"(goal: under 1000 us)"
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    sys.exit(main())
