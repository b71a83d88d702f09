"""Build each model given, one after the other; say on stdout what each build returned."""

import sys

from engines import build

for number, model in enumerate(sys.argv[1:], start=1):
    print(f"building {number}", flush=True)
    engine = build(model, name=f"net{number}")
    # Not the engine's size: it can differ from one build to the next of the same model.
    print(f"result {number}: {'None' if engine is None else 'engine'}", flush=True)
# One write: print() writes the text and its newline apart, and with PYTHONUNBUFFERED (set in
# many containers and CI runners) each is a write of its own, between which a line of
# trt-otel's, on the same stderr, can fall.
sys.stderr.write("to stderr\n")
