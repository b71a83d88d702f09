"""Two builds at once, from two threads (TensorRT-RTX releases the GIL while it builds)."""

import sys
import threading

from engines import build

results: dict[str, str] = {}


def build_one(model: str, name: str) -> None:
    engine = build(model, name=name)
    results[name] = "None" if engine is None else "engine"


threads = [
    threading.Thread(target=build_one, args=(model, f"thread{number}"))
    for number, model in enumerate(sys.argv[1:3], start=1)
]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(" ".join(f"{name}: {results[name]}" for name in sorted(results)))
