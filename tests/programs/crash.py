"""Ways a program ends badly: ``raise`` (an exception after a build), ``segfault`` (the
process dies of SIGSEGV inside a build, from its own monitor), ``exit7`` (sys.exit(7) after a
build) and ``exit7-no-build``."""

import os
import signal
import sys

import tensorrt_rtx as trt
from engines import build

how, model = sys.argv[1], sys.argv[2]


class DieAtFirstStep(trt.IProgressMonitor):  # type: ignore[misc]
    def __init__(self) -> None:
        trt.IProgressMonitor.__init__(self)

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        pass

    def step_complete(self, phase_name: str, step: int) -> bool:
        os.kill(os.getpid(), signal.SIGSEGV)
        return True

    def phase_finish(self, phase_name: str) -> None:
        pass


if how == "exit7-no-build":
    sys.exit(7)
if how == "segfault":
    build(model, monitor=DieAtFirstStep())
    sys.exit("not reached")
build(model)
if how == "raise":
    raise RuntimeError("the script failed after its build")
sys.exit(7)
