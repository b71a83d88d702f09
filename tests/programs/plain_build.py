"""Build each model given, one after the other; say on stdout what each build returned."""

import sys

from engines import build

for number, model in enumerate(sys.argv[1:], start=1):
    print(f"building {number}", flush=True)
    engine = build(model, name=f"net{number}")
    # Not the engine's size: it can differ from one build to the next of the same model.
    print(f"result {number}: {'None' if engine is None else 'engine'}", flush=True)
print("to stderr", file=sys.stderr)
