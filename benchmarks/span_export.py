"""Why the span export keeps a queue of its own: trt-otel's ``SpanExportQueue`` against the
OpenTelemetry SDK's ``BatchSpanProcessor``, on the same spans and the same OTLP/HTTP exporter.

Each runs in a fresh process (``--one``) so their CPU and threads are counted apart. A build's
phases end as spans at a steady pace (``--spans`` over ``--seconds``), then the build ends and the
processor is shut down, as a build's exit does. Two collectors:

- **up**: a real HTTP server on loopback that accepts every export (``200``), in the same
  process (its cost counts for both alike);
- **down**: nothing listens on the port (connection refused), the collector a user forgot to
  start, or the one a network policy hides.

Printed per processor and collector: the process's CPU (user + system, every thread), the time
the end of the build waited for the processor's shutdown, the spans the processor can account
for (exported, failed, dropped: the SDK's processor counts none of them) and the lines it wrote
to the process's logging. Run: ``python benchmarks/span_export.py``.
"""

from __future__ import annotations

import argparse
import http.server
import io
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanContext, TraceFlags

from trt_otel.views.otlp import SpanExportQueue

PROCESSORS = ("trt-otel", "sdk-batch")
COLLECTORS = ("up", "down")


class _Accepting(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def collector(kind: str) -> Iterator[str]:
    if kind == "up":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        finally:
            server.shutdown()
        return
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1/traces"


def span(number: int) -> ReadableSpan:
    trace_id = 0x5CE0E9A56015FEC5AADFA328AE398115
    return ReadableSpan(
        name="Timing tactics",
        context=SpanContext(trace_id, number + 1, False, TraceFlags(TraceFlags.SAMPLED)),
        resource=Resource.create({"service.name": "trt-otel-bench"}),
        attributes={"trt.phase.num_steps": 12, "trt.phase.steps_completed": 12},
        start_time=1_700_000_000_000_000_000 + number * 1000,
        end_time=1_700_000_000_000_000_000 + number * 1000 + 500,
    )


def one(processor_name: str, collector_kind: str, spans: int, seconds: float) -> dict[str, object]:
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    logging.getLogger().addHandler(handler)
    warned: list[str] = []
    with collector(collector_kind) as url:
        exporter = OTLPSpanExporter(endpoint=url, timeout=10)
        processor: SpanProcessor
        if processor_name == "trt-otel":
            queue = SpanExportQueue(
                exporter, describe=url, warn=warned.append, endpoint=url, request_timeout_s=10
            )
            processor = queue
        else:
            queue = None
            processor = BatchSpanProcessor(exporter)
        began = resource.getrusage(resource.RUSAGE_SELF)
        pace_s = seconds / spans
        start = time.monotonic()
        for number in range(spans):
            processor.on_end(span(number))
            ahead_s = start + (number + 1) * pace_s - time.monotonic()
            if ahead_s > 0.001:
                time.sleep(ahead_s)
        ended = time.monotonic()
        if queue is not None:
            queue.close(timeout_s=3.0)  # the build's own bound on its final flush
        else:
            processor.shutdown()
        waited_s = time.monotonic() - ended
        used = resource.getrusage(resource.RUSAGE_SELF)
    logging.getLogger().removeHandler(handler)
    accounted = "none"
    if queue is not None:
        health = queue.health()
        accounted = (
            f"{health.exported:,} exported, {health.failed:,} failed, {health.dropped:,} dropped"
        )
    return {
        "cpu_s": (used.ru_utime - began.ru_utime) + (used.ru_stime - began.ru_stime),
        "waited_s": waited_s,
        "accounted": accounted,
        "log_lines": len([line for line in logged.getvalue().splitlines() if line.strip()]),
        "warned": len(warned),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--one", nargs=2, metavar=("PROCESSOR", "COLLECTOR"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], args.one[1], args.spans, args.seconds)))
        return 0
    print(f"span export: {args.spans:,} spans over {args.seconds:g} s, then the build's end")
    print(
        f"{'collector':<10} {'processor':<10} {'CPU':>7} {'end waited':>11} {'logged':>7}  "
        "spans accounted for"
    )
    for kind in COLLECTORS:
        for name in PROCESSORS:
            done = subprocess.run(
                [sys.executable, __file__, "--one", name, kind, "--spans", str(args.spans),
                 "--seconds", str(args.seconds)],
                capture_output=True, text=True, check=False, env={**os.environ},
            )  # fmt: skip
            if done.returncode != 0:
                print(f"{kind:<10} {name:<10} failed: {done.stderr.strip()[-300:]}")
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            logged = row["log_lines"] + row["warned"]
            print(
                f"{kind:<10} {name:<10} {row['cpu_s']:>6.2f}s {row['waited_s']:>10.2f}s "
                f"{logged:>7}  {row['accounted']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
