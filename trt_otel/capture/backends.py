"""The real builders trt-otel drives: NVIDIA TensorRT and NVIDIA TensorRT for RTX.

Both are the same ``nvinfer1`` API from Python (``Builder``, ``OnnxParser``, ``IBuilderConfig``,
``IProgressMonitor``), under two module names:

- ``tensorrt-rtx``: the ``tensorrt_rtx`` module (PyPI ``tensorrt-rtx-cu12`` with ``-libs`` and
  ``-bindings``). Its builder runs without a GPU (ahead of time, for RTX-class and A100-class
  cards), so it is the builder of the tests, CI and ``make demo``.
- ``tensorrt``: the ``tensorrt`` module (PyPI ``tensorrt``), which needs an NVIDIA GPU.

The backend is chosen by name (``--backend``), or else the first that is installed, TensorRT
first; a module the program has already imported wins over one merely installed, so a program
that did ``import tensorrt_rtx`` gets TensorRT-RTX even where both are installed.

This module only finds and describes backends; importing ``trt_otel`` imports neither.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trt_otel.core.startup import native_import


@dataclass(frozen=True, slots=True)
class Backend:
    """One real builder."""

    name: str
    """As ``--backend`` and the build record's ``trt.backend`` write it."""
    module: str
    """Its Python module."""
    title: str
    install: str
    """How to install it, for messages."""
    distributions: tuple[str, ...]
    """PyPI distributions whose version is the module's, where the module has no
    ``__version__``."""
    dla: bool = True
    """Whether it can build for a DLA core (and so set the DLA memory pools)."""
    timing_cache: bool = True
    """Whether its timing cache does anything (TensorRT-RTX's calls are no-ops since 1.2)."""


TENSORRT = Backend(
    name="tensorrt",
    module="tensorrt",
    title="TensorRT",
    install="pip install 'trt-otel[tensorrt]' (needs an NVIDIA GPU and driver)",
    distributions=("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11"),
)
TENSORRT_RTX = Backend(
    name="tensorrt-rtx",
    module="tensorrt_rtx",
    title="TensorRT-RTX",
    install="pip install 'trt-otel[tensorrt-rtx]' (Linux or Windows on x86-64; builds without "
    "a GPU)",
    distributions=("tensorrt-rtx-cu12", "tensorrt-rtx-cu13", "tensorrt-rtx"),
    # Seen in 1.7.1: setting a DLA pool logs "Setting DLA memory pool size on TensorRT build
    # with DLA disabled" and is ignored; create_timing_cache warns "Timing cache operations are
    # no-ops in TensorRT-RTX".
    dla=False,
    timing_cache=False,
)
BACKENDS: tuple[Backend, ...] = (TENSORRT, TENSORRT_RTX)
"""In order of preference when none is named."""
BACKEND_NAMES = tuple(backend.name for backend in BACKENDS)


def backend_named(name: str) -> Backend:
    """The backend called ``name`` (``tensorrt``, ``tensorrt-rtx``; ``tensorrt_rtx`` too)."""
    wanted = name.strip().lower().replace("_", "-")
    for backend in BACKENDS:
        if backend.name == wanted:
            return backend
    raise ValueError(f"unknown backend {name!r}; choose {' or '.join(BACKEND_NAMES)}")


def backend_of_module(module: object) -> Backend | None:
    """The backend a module is, by its name (None for anything else: the simulator)."""
    name = getattr(module, "__name__", None)
    return next((b for b in BACKENDS if b.module == name), None)


def is_installed(backend: Backend) -> bool:
    if backend.module in sys.modules:  # imported, or blocked with None
        return sys.modules[backend.module] is not None
    try:
        return importlib.util.find_spec(backend.module) is not None
    except (ImportError, ValueError):
        return False


def installed_backends() -> list[Backend]:
    """The backends whose module can be found, in order of preference (none is imported)."""
    return [backend for backend in BACKENDS if is_installed(backend)]


def default_backend() -> Backend | None:
    """The backend used when none is named: one the program already imported, else the first
    installed. None when neither is installed."""
    for backend in BACKENDS:
        if sys.modules.get(backend.module) is not None:
            return backend
    installed = installed_backends()
    return installed[0] if installed else None


def import_module(backend: Backend) -> ModuleType:
    """Import the backend's module (ImportError, with how to install it, if it cannot be)."""
    try:
        with native_import():  # a Ctrl-C inside its pybind11 initialisation would crash
            return importlib.import_module(backend.module)
    except ImportError as error:
        raise ImportError(
            f"{backend.title} is not installed or does not load ({error}); install it with "
            f"`{backend.install}`"
        ) from error


def version_of(module: Any, backend: Backend | None = None) -> str:
    """The module's real version: its ``__version__``, else its distribution's."""
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and version:
        return version
    from importlib import metadata  # slow to import, and only this needs it

    for distribution in backend.distributions if backend is not None else ():
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def record_attributes(backend: Backend, module: Any) -> dict[str, str]:
    """What the build record says about its builder: ``trt.backend`` and ``trt.version``."""
    return {"trt.backend": backend.name, "trt.version": version_of(module, backend)}


def install_hint() -> str:
    """How to get a builder, when neither is installed."""
    return (
        "no TensorRT builder is installed: install TensorRT-RTX with "
        f"`{TENSORRT_RTX.install}`, or TensorRT with `{TENSORRT.install}`; "
        "`trt-otel demo` runs the same pipeline on the simulator"
    )
