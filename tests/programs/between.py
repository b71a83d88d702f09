"""Two builds with a pause between them: build the first model, wait until the gate file
exists, build the second. Says what each build returned."""

import os
import sys
import time

from engines import build

first, gate, second = sys.argv[1:4]
engine = build(first, name="first")
print(f"result 1: {'None' if engine is None else 'engine'}", flush=True)
while not os.path.exists(gate):
    time.sleep(0.05)
engine = build(second, name="second")
print(f"result 2: {'None' if engine is None else 'engine'}", flush=True)
