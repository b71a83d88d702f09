"""trt-otel run's hook into the program's interpreter (see :mod:`trt_otel.capture.bootstrap`)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _install() -> None:
    try:
        import _trt_otel_recorder  # type: ignore[import-not-found]  # on the path at run time

        _trt_otel_recorder.install_from_environment()
    except Exception as error:  # the program runs, unobserved, rather than not at all
        print(f"trt-otel: cannot observe this program's builds: {error}", file=sys.stderr)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path: the program's own, or its environment's."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
