"""A service-like program that observes its own builds with ``trt_otel.instrument()``: the
models given are built while instrumented, and the first once more after ``uninstrument()``.
Prints what each build returned, whether the library's own method is back at the end, and,
with SCRAPE set to its URL, the build counts its /metrics serves (TRT_OTEL_PROMETHEUS_PORT)."""

import os
import sys
import urllib.request

import trt_otel

trt_otel.instrument()  # settings from the environment (TRT_OTEL_JOURNAL, TRT_OTEL_TIMEOUT)

import tensorrt_rtx as trt  # noqa: E402  # imported after instrument(): patched on import
from engines import build  # noqa: E402

for number, model in enumerate(sys.argv[1:], start=1):
    engine = build(model, name=f"net{number}")
    print(f"result {number}: {'None' if engine is None else 'engine'}", flush=True)
if "SCRAPE" in os.environ:  # the metrics of this process's builds, while instrumented
    with urllib.request.urlopen(os.environ["SCRAPE"], timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("trt_run_builds_total{"):
                print(line)
trt_otel.uninstrument()
engine = build(sys.argv[1], name="after")
print(f"after: {'None' if engine is None else 'engine'}")
print("restored:", not hasattr(trt.Builder.build_serialized_network, "__trt_otel_original__"))
