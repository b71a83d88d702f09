"""Build each model given, one after the other; say on stdout what each build returned."""

import sys

from engines import build

for number, model in enumerate(sys.argv[1:], start=1):
    print(f"building {number}", flush=True)
    engine = build(model, name=f"net{number}")
    print(f"result {number}: {'None' if engine is None else f'{engine.nbytes} bytes'}", flush=True)
print("to stderr", file=sys.stderr)
