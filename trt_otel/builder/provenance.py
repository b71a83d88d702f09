"""Provenance: what decides a build's engine and its cost, for its record.

``build_start`` carries what went in (:func:`provenance_attributes`, the model's and the timing
cache's SHA-256, the builder options, the GPU) and a :func:`fingerprint` of the inputs that decide
the engine; a ``output`` event carries what came out (:func:`output_attributes`: the engine's
SHA-256 and the timing cache's after). Two builds with the same fingerprint built the same thing;
a diff of two builds starts with what differs here.

Every value is read without side effects: versions from the libraries already imported, the CUDA
driver and runtime through their own version calls where their libraries load (no CUDA context is
made), and nothing that is not there is guessed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trt_otel.core.version import __version__

FINGERPRINT = "fingerprint"
"""The attribute's name in ``build_start``: other tools match builds by it."""
FINGERPRINT_KEYS = ("model.sha256", "trt.backend", "trt.version", "gpu.compute_capability")
"""What decides the engine, besides every ``trt.options.*`` (but the timing cache's path: where
it lies decides nothing) and, for a simulated build, ``simulator.*``."""

_CUDA_DRIVERS = ("libcuda.so.1", "nvcuda.dll")
_CUDA_MAJORS = ("13", "12", "11")


def provenance_attributes(backend: str | None = None) -> dict[str, Any]:
    """trt-otel's version, the host, its OS and Python, the CUDA driver's version where its
    library loads here, and the CUDA major version the ``backend``'s wheel was built for
    (``tensorrt-rtx-cu12``: ``12``), the runtime it carries."""
    attributes: dict[str, Any] = {
        "trt_otel.version": __version__,
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "os.type": platform.system().lower(),
        "os.version": platform.release(),
        "process.runtime.name": sys.implementation.name,
        "process.runtime.version": platform.python_version(),
    }
    driver = _cuda_version(_CUDA_DRIVERS, "cuDriverGetVersion")
    if driver is not None:
        attributes["cuda.driver.version"] = driver
    runtime = _wheel_cuda(backend) if backend is not None else None
    if runtime is not None:
        attributes["cuda.runtime.major"] = runtime
    return attributes


def _wheel_cuda(backend: str) -> str | None:
    """The CUDA major version in the name of the backend's installed wheel, if one is.

    Read from the ``*.dist-info`` folders beside the backend's imported module, where its wheel
    put them: a listing of one folder, where ``importlib.metadata`` would scan every path's
    distributions (tens of milliseconds of every build). Where the module is not imported or
    not a file, ``importlib.metadata`` is asked."""
    module = sys.modules.get(backend.replace("-", "_"))
    where = getattr(module, "__file__", None)
    if where:
        return _wheel_cuda_beside(Path(where).parent.parent, backend)
    import importlib.metadata  # here: a build's worker imports this module, and not that

    for major in _CUDA_MAJORS:
        try:
            importlib.metadata.version(f"{backend}-cu{major}")
        except importlib.metadata.PackageNotFoundError:
            continue
        return major
    return None


def _wheel_cuda_beside(folder: Path, backend: str) -> str | None:
    """The CUDA major of the ``{backend}-cu{major}`` wheel whose ``.dist-info`` lies in
    ``folder`` (names compared as pip normalizes them)."""
    try:
        names = {entry.name.lower() for entry in os.scandir(folder)}
    except OSError:
        return None
    prefix = backend.replace("-", "_").replace(".", "_").lower()
    for major in _CUDA_MAJORS:
        wheel = f"{prefix}_cu{major}-"
        if any(name.startswith(wheel) and name.endswith(".dist-info") for name in names):
            return major
    return None


def _cuda_version(libraries: tuple[str, ...], function: str) -> str | None:
    """``12.4`` from the first of ``libraries`` that loads: CUDA's version calls need no
    device and make no context."""
    for name in libraries:
        try:
            library = ctypes.CDLL(name)
            version = ctypes.c_int(0)
            if getattr(library, function)(ctypes.byref(version)) == 0 and version.value > 0:
                return f"{version.value // 1000}.{version.value % 1000 // 10}"
        except (OSError, AttributeError):
            continue
    return None


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of a regular file, None when there is none (read a piece at a time)."""
    try:
        if not path.is_file():
            return None
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


def timing_cache_attributes(path: Path | None, when: str) -> dict[str, Any]:
    """``trt.timing_cache.sha256.before`` (or ``.after``) of the timing cache, where it exists."""
    if path is None:
        return {}
    digest = file_sha256(path)
    return {} if digest is None else {f"trt.timing_cache.sha256.{when}": digest}


def output_attributes(
    engine: bytes, engine_path: Path | None, timing_cache: bytes | None = None
) -> dict[str, Any]:
    """What a successful build produced, for its ``output`` event."""
    attributes: dict[str, Any] = {
        "engine.sha256": hashlib.sha256(engine).hexdigest(),
        "engine.bytes": len(engine),
    }
    if engine_path is not None:
        attributes["engine.path"] = str(engine_path)
    if timing_cache is not None:
        attributes["trt.timing_cache.sha256.after"] = hashlib.sha256(timing_cache).hexdigest()
    return attributes


def fingerprint_inputs(attributes: Mapping[str, Any]) -> dict[str, str]:
    """The attributes that decide the engine, as text: the model, the backend and its version,
    the GPU's architecture, every builder option but the timing cache's path, and for a
    simulated build what it simulates."""
    chosen = {key: attributes[key] for key in FINGERPRINT_KEYS if key in attributes}
    for key, value in attributes.items():
        option = key.startswith("trt.options.") and key != "trt.options.timing_cache"
        if option or key.startswith("simulator."):
            chosen[key] = value
    return {key: str(value) for key, value in sorted(chosen.items())}


def fingerprint(attributes: Mapping[str, Any]) -> str:
    """16 hex digits of the SHA-256 of :func:`fingerprint_inputs` (canonical JSON)."""
    canonical = json.dumps(fingerprint_inputs(attributes), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
