"""A build with the script's own progress monitor, which counts its callbacks (written to the
file given) and, with a step number, answers False at that step (or the Python literal given
after the step number: None, 1...)."""

import ast
import json
import sys

import tensorrt_rtx as trt
from engines import build


class Counting(trt.IProgressMonitor):  # type: ignore[misc]
    def __init__(self, cancel_at: int | None, answer: object) -> None:
        trt.IProgressMonitor.__init__(self)
        self.counts = {"phase_start": 0, "step": 0, "phase_finish": 0}
        self.cancel_at = cancel_at
        self.answer = answer

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        self.counts["phase_start"] += 1

    def step_complete(self, phase_name: str, step: int) -> object:
        self.counts["step"] += 1
        return self.answer if self.counts["step"] == self.cancel_at else True

    def phase_finish(self, phase_name: str) -> None:
        self.counts["phase_finish"] += 1


model, counts_file = sys.argv[1], sys.argv[2]
cancel_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
monitor = Counting(cancel_at, ast.literal_eval(sys.argv[4]) if len(sys.argv) > 4 else False)
engine = build(model, monitor=monitor)
with open(counts_file, "w") as handle:
    json.dump({**monitor.counts, "engine": engine is not None}, handle)
print("result:", "None" if engine is None else "engine")
