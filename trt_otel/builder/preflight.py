"""Checks before a build starts: everything about its files that can be known without building.

A real build can run for hours, so what would only fail at its end (an engine that cannot be
written, an output that would overwrite the model or the journal) is refused before it begins,
with exit code 2 and a message saying what is wrong. What cannot be known before (a disk that
fills up during the build) is handled where the files are written (:mod:`trt_otel.builder.saving`).

The model is read only from a regular file, and at most :data:`MAX_MODEL_BYTES`: ``/dev/zero``
would be read without end, and a FIFO would block the command before anything is shown.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trt_otel.core.files import (
    FileKindError,
    file_kind,
    open_regular_for_reading,
    regular_file_or_absent,
)

MAX_MODEL_BYTES = 2 * 1024**3
"""The largest ONNX file read (2 GiB): protobuf's own limit for one serialized message, so no
valid ONNX file is larger (bigger models keep their weights in external data files)."""


class PreflightError(Exception):
    """A build that must not start: a usage error (exit code 2)."""


def read_model(path: Path, *, max_bytes: int = MAX_MODEL_BYTES) -> bytes:
    """The model's bytes: only from a regular, non-empty file of at most ``max_bytes``."""
    try:
        # Opened without blocking and checked on its descriptor: a FIFO, a device or a
        # directory (swapped in after any check) is refused, never read.
        handle = open_regular_for_reading(path, "model")
    except FileNotFoundError:
        raise PreflightError(f"model not found: {path}") from None
    except FileKindError as error:
        if error.is_directory:
            raise PreflightError(f"model path is a directory: {path}") from None
        raise PreflightError(
            f"model {path} is not a regular file ({error.kind}); give the model's file"
        ) from None
    except OSError as error:
        raise PreflightError(f"cannot read model {path}: {error.strerror}") from None
    with handle:
        info = os.fstat(handle.fileno())
        if info.st_size > max_bytes:
            raise PreflightError(
                f"model {path} is {info.st_size:,} bytes, over the limit of {max_bytes:,} "
                "(an ONNX file cannot be larger; big models keep weights in external data)"
            )
        try:
            data = handle.read(max_bytes + 1)
        except OSError as error:
            raise PreflightError(f"cannot read model {path}: {error.strerror}") from None
    if len(data) > max_bytes:  # it grew while being read
        raise PreflightError(f"model {path} is over the limit of {max_bytes:,} bytes")
    if not data:
        raise PreflightError(f"model file is empty: {path}")
    return data


def check_writable_file(path: Path, option: str) -> None:
    """``path`` can be written atomically: its directory exists and takes a new file, and it
    is not a directory nor anything but a regular file (a device, a FIFO)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise PreflightError(f"{option} {path}: {error.strerror}") from None
    else:
        if stat.S_ISDIR(info.st_mode):
            raise PreflightError(f"{option} {path} is a directory; give a file name")
        if not stat.S_ISREG(info.st_mode):
            raise PreflightError(
                f"{option} {path} is not a regular file ({file_kind(info.st_mode)}); "
                "it would be replaced"
            )
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.exists():
        raise PreflightError(f"{option} {path}: directory {directory} does not exist")
    if not directory.is_dir():
        raise PreflightError(f"{option} {path}: {directory} is not a directory")
    try:
        # The write is a new file in that directory, renamed over the target: try exactly that
        # (permissions, ACLs, a read-only filesystem; root passes any access() test).
        descriptor, probe = tempfile.mkstemp(prefix=".trt-otel-check.", dir=directory)
    except OSError as error:
        raise PreflightError(
            f"{option} {path}: cannot write in {directory}: {error.strerror}"
        ) from None
    os.close(descriptor)
    os.unlink(probe)


def check_distinct(
    inputs: Sequence[tuple[str, Path | None]], outputs: Sequence[tuple[str, Path | None]]
) -> None:
    """No output is one of the inputs, nor another output (each would destroy the other)."""
    given_outputs = [(name, path) for name, path in outputs if path is not None]
    given_inputs = [(name, path) for name, path in inputs if path is not None]
    for index, (name, path) in enumerate(given_outputs):
        for other_name, other in given_inputs + given_outputs[index + 1 :]:
            if same_file(path, other):
                raise PreflightError(
                    f"{name} {path} is also the {other_name}: writing one would destroy the other"
                )


def check_journal_file(path: Path) -> None:
    """The journal is written in place, so it must be a regular file or not yet there (a named
    pipe would block the build before it starts, a device would swallow the record), and no
    other build may be writing it (each would cut the other's record)."""
    try:
        regular_file_or_absent(path, "--journal")
    except FileKindError as error:
        raise PreflightError(str(error)) from None
    from trt_otel.core.journal import journal_in_use  # the worker reads the model, not this

    writer = journal_in_use(path)
    if writer is not None:
        raise PreflightError(f"--journal {path} is already being written by {writer}")


def check_cancel_file(path: Path) -> None:
    """A cancel file must not exist when the build starts: left from an earlier run, it would
    cancel this build at once, and no one meant that."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise PreflightError(f"--cancel-file {path}: {error.strerror}") from None
    raise PreflightError(
        f"--cancel-file {path} already exists (left from an earlier build?); it would cancel "
        "this build at once: remove it, or give another path"
    )


def check_build_files(
    *,
    model: Path | None,
    engine: Path | None,
    journal: Path | None,
    timing_cache: Path | None,
    trace: Path | None = None,
    cancel_file: Path | None = None,
) -> None:
    """Every check of a build's files, before anything is opened or truncated."""
    check_distinct(
        inputs=[("model", model), ("--trace", trace)],
        outputs=[("-o", engine), ("--journal", journal), ("--timing-cache", timing_cache)],
    )
    if journal is not None:
        check_journal_file(journal)
    if engine is not None:
        check_writable_file(engine, "-o")
    if timing_cache is not None:
        check_writable_file(timing_cache, "--timing-cache")
    if cancel_file is not None:
        check_cancel_file(cancel_file)


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: by device and inode when both exist (hard links and
    symlinks alike), else by their real paths (symlinks and ``..`` resolved)."""
    try:
        return os.path.samefile(a, b)  # hard links and symlinks alike, when both exist
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
