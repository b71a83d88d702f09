"""Writing a build's files: atomically, and, when that fails after the build, as a failure that
keeps the built plan somewhere rather than losing hours of building.

:func:`~trt_otel.core.files.write_atomically` gives readers the old file or the whole new one.
:func:`save_build` writes the engine and the timing cache after a build; when one cannot be
written (a full disk, a directory gone or made read-only mid-build), it says so, and keeps the
plan in the first place that takes it: beside the engine, the temporary directory, or the
working directory.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trt_otel.core.files import write_atomically


@dataclass(frozen=True, slots=True)
class SaveFailure:
    """Why a built engine (or its timing cache) did not reach its path."""

    detail: str
    """For the terminal, the journal and the span: what failed, and where the plan was kept."""
    error_type: str
    kept: Path | None
    """Where the built plan was kept instead (None: nowhere, or it was written)."""


def save_build(
    engine: bytes,
    engine_path: Path | None,
    timing_cache: bytes | None = None,
    timing_cache_path: Path | None = None,
) -> SaveFailure | None:
    """Write the engine, then the timing cache. Returns None when both were written."""
    if engine_path is not None:
        try:
            write_atomically(engine_path, engine)
        except OSError as error:
            kept, tried = keep_plan(engine, engine_path)
            where = (
                f"the built plan was kept at {kept}"
                if kept is not None
                else f"the built plan could not be kept either ({'; '.join(tried)})"
            )
            detail = f"the engine was built but cannot be written to {engine_path}: "
            detail += f"{_reason(error)}; {where}"
            return SaveFailure(detail, "EngineWriteError", kept)
    if timing_cache is not None and timing_cache_path is not None:
        try:
            write_atomically(timing_cache_path, timing_cache)
        except OSError as error:
            written = f"; the engine was written to {engine_path}" if engine_path else ""
            detail = f"cannot write timing cache {timing_cache_path}: {_reason(error)}{written}"
            return SaveFailure(detail, "TimingCacheWriteError", None)
    return None


def keep_plan(engine: bytes, engine_path: Path) -> tuple[Path | None, list[str]]:
    """Write ``engine`` to the first place that takes it; returns it (or None) and what failed."""
    name = f"{engine_path.name}.unsaved-{os.getpid()}"
    places = [
        engine_path.parent if str(engine_path.parent) else Path("."),
        Path(tempfile.gettempdir()),
        Path.cwd(),
    ]
    tried: list[str] = []
    for place in dict.fromkeys(places):
        candidate = place / name
        try:
            write_atomically(candidate, engine)
        except OSError as error:
            tried.append(f"{place}: {_reason(error)}")
            continue
        return candidate, tried
    return None, tried


def _reason(error: OSError) -> str:
    return error.strerror or str(error) or type(error).__name__
