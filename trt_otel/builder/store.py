"""A content-addressed store of engines (``--engine-store DIR``): a build whose key is stored is
served, not built, and a build that had to run says why the stored one would not do.

The key is the SHA-256 of what decides the engine and where it may run (:func:`store_key`): the
model's bytes, the backend and its exact version, the GPU's compute capability (and, for
TensorRT, the GPU's model), and every builder option but where the timing cache lies. The timing
cache is not in the key: it decides which tactics the builder times and chooses, so two builds
with different caches may differ in speed, never in what the engine computes or where it runs,
and a cache that only grows would otherwise make every build a miss.

Layout, under ``DIR/v1/``: ``entries/KEY/engine`` and ``entries/KEY/record.json`` (the record
written last: an entry without one is not there), and ``locks/KEY.lock``, held (``flock``) by the
build of that key while it runs, so that two builds of one key, in two processes or on two hosts
of a shared folder, build once: the second waits, says for whom, and is served. A lock's holder
that dies releases it with its descriptors (no stale lock to recover). Every entry is data from
elsewhere: its record is bounded and decoded with every field's type checked, and its engine is
served only when its size and SHA-256 are the record's; one that is not is reported, removed and
built again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from trt_otel.builder.provenance import FINGERPRINT_KEYS, fingerprint_inputs
from trt_otel.core.changes import attribute_change
from trt_otel.core.eta import model_file_name, model_size
from trt_otel.core.files import write_atomically
from trt_otel.core.version import __version__

FORMAT = "v1"
MAX_RECORD_BYTES = 256 * 1024
"""A record is a few KiB; anything longer is not one of ours."""
MAX_BUILDS_KEPT = 10
"""How many build durations an entry keeps (the time a hit saves is their median)."""
GPU_MODEL = "gpu.name"


class StoreError(Exception):
    """The store cannot be used (a folder that is not one, not writable): the build goes on
    without it, after one warning."""


class StoreRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What the store knows of an entry (``record.json``)."""

    key: str
    inputs: dict[str, str]
    """The attributes that decided the engine (:func:`key_inputs`)."""
    engine_sha256: str
    engine_bytes: int
    build_s: list[float]
    """How long the builds that made it took (the latest :data:`MAX_BUILDS_KEPT`)."""
    model_name: str = ""
    created: float = 0.0
    host: str = ""
    build_id: str = ""
    trt_otel_version: str = ""
    model_bytes: int = 0
    """The size of its model's file (0: not recorded, as by an earlier trt-otel)."""
    peak_rss_bytes: int = 0
    """The highest peak of its builder's memory among the builds that made it (0: not sampled)."""

    @property
    def saves_s(self) -> float:
        """What serving it saves: the median of the builds that made it."""
        return statistics.median(self.build_s) if self.build_s else 0.0


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored engine, checked: its record, and where its engine lies."""

    record: StoreRecord
    folder: Path

    @property
    def engine(self) -> Path:
        return self.folder / "engine"


def key_inputs(attributes: Mapping[str, Any]) -> dict[str, str]:
    """What decides a build's engine and where it may run: the fingerprint's inputs, and for
    TensorRT, whose engines run on the GPU model they were built on (trt-otel's builder options
    make no hardware-compatible one), the GPU's model."""
    inputs = fingerprint_inputs(attributes)
    if attributes.get("trt.backend") == "tensorrt" and GPU_MODEL in attributes:
        inputs[GPU_MODEL] = str(attributes[GPU_MODEL])
    return dict(sorted(inputs.items()))


def store_key(attributes: Mapping[str, Any]) -> str:
    """The SHA-256 (hex) of :func:`key_inputs`, as canonical JSON."""
    canonical = json.dumps(key_inputs(attributes), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _is_key(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class EngineStore:
    """The store in ``root`` (created where it is not there, its parent must be)."""

    def __init__(self, root: Path, *, max_bytes: int | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._entries = root / FORMAT / "entries"
        self._locks = root / FORMAT / "locks"
        try:
            if root.exists() and not root.is_dir():
                raise StoreError(f"engine store {root} is not a folder")
            if not root.parent.is_dir():
                raise StoreError(f"engine store {root}: no folder {root.parent}")
            self._entries.mkdir(parents=True, exist_ok=True)
            self._locks.mkdir(exist_ok=True)
        except OSError as error:
            raise StoreError(f"engine store {root}: {error.strerror or error}") from None

    # -- one key -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def building(self, key: str, *, holder: str, say: Callable[[str], None]) -> Iterator[None]:
        """Hold ``key``'s lock while its build runs: another build of the key waits here (and
        says for whom) until this one has stored its engine or given up."""
        path = self._locks / f"{key}.lock"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"store: waiting for {_holder_of(descriptor)}, which builds this engine")
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, holder.encode("utf-8", "replace")[:200], 0)
            yield
        finally:
            os.close(descriptor)  # the lock goes with it

    def lookup(self, key: str, *, warn: Callable[[str], None]) -> Entry | None:
        """The entry of ``key``, checked (its record's, its engine's size); None where there is
        none. One that is damaged is reported, removed and None."""
        folder = self._entries / key
        record_path = folder / "record.json"
        if not record_path.exists():
            return None
        problem = None
        try:
            record = _read_record(record_path)
            if record.key != key:
                problem = f"its record names another key ({record.key[:12]}..)"
            elif (folder / "engine").stat().st_size != record.engine_bytes:
                problem = "its engine is not the size its record says (truncated?)"
        except (OSError, ValueError, msgspec.ValidationError, msgspec.DecodeError) as error:
            problem = f"its record cannot be read ({error})"
        if problem is not None:
            warn(f"store: the entry {key[:12]}.. is damaged: {problem}; building it again")
            self._remove(folder)
            return None
        return Entry(record, folder)

    def serve(self, entry: Entry, output: Path, *, warn: Callable[[str], None]) -> bytes | None:
        """The entry's engine written to ``output`` (atomically) once its SHA-256 is its
        record's; None (the entry removed, with a warning) where it is not."""
        try:
            data = entry.engine.read_bytes()
        except OSError as error:
            warn(f"store: cannot read {entry.engine}: {error.strerror or error}; building")
            return None
        if hashlib.sha256(data).hexdigest() != entry.record.engine_sha256:
            warn(
                f"store: the engine of {entry.record.key[:12]}.. does not match its SHA-256 "
                "(corrupt): removed, building it again"
            )
            self._remove(entry.folder)
            return None
        write_atomically(output, data)
        with contextlib.suppress(OSError):
            os.utime(entry.folder)  # used now: the last to be evicted
        return data

    def put(
        self,
        key: str,
        attributes: Mapping[str, Any],
        engine: Path,
        *,
        build_s: float,
        build_id: str,
        peak_rss_bytes: int | None = None,
    ) -> Entry:
        """Store the engine a successful build wrote to ``engine``, the record last."""
        data = engine.read_bytes()
        folder = self._entries / key
        earlier: list[float] = []
        peak = peak_rss_bytes or 0
        with contextlib.suppress(OSError, ValueError, msgspec.MsgspecError):
            before = _read_record(folder / "record.json")
            earlier, peak = before.build_s, max(peak, before.peak_rss_bytes)
        folder.mkdir(exist_ok=True)
        write_atomically(folder / "engine", data)
        record = StoreRecord(
            key=key,
            inputs=key_inputs(attributes),
            engine_sha256=hashlib.sha256(data).hexdigest(),
            engine_bytes=len(data),
            build_s=[*earlier, round(build_s, 3)][-MAX_BUILDS_KEPT:],
            model_name=model_file_name(attributes),
            created=time.time(),
            host=socket.gethostname(),
            build_id=build_id,
            trt_otel_version=__version__,
            model_bytes=model_size(attributes) or 0,
            peak_rss_bytes=peak,
        )
        write_atomically(folder / "record.json", msgspec.json.encode(record))
        if self.max_bytes is not None:
            self.prune(self.max_bytes, keep=key)
        return Entry(record, folder)

    # -- the whole store ---------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Every readable entry, the most recently used first."""
        found = []
        try:
            folders = [f for f in self._entries.iterdir() if _is_key(f.name) and f.is_dir()]
        except OSError:
            return []
        for folder in folders:
            with contextlib.suppress(OSError, ValueError, msgspec.MsgspecError):
                found.append(Entry(_read_record(folder / "record.json"), folder))
        return sorted(found, key=_last_used, reverse=True)

    def nearest(self, attributes: Mapping[str, Any]) -> StoreRecord | None:
        """The stored build most like this one: of the same model bytes, else of the same
        model's name, the one whose inputs differ least."""
        inputs = key_inputs(attributes)
        name = model_file_name(attributes)
        same_model = [
            e.record
            for e in self.entries()
            if e.record.inputs.get("model.sha256") == inputs.get("model.sha256")
        ]
        candidates = same_model or [e.record for e in self.entries() if e.record.model_name == name]
        if not candidates:
            return None
        return min(candidates, key=lambda record: len(differences(record.inputs, inputs)))

    def verify(self) -> list[str]:
        """What is wrong with each entry (its record, its engine's digest), checked in full."""
        problems = []
        for folder in sorted(self._entries.iterdir()):
            if not (_is_key(folder.name) and folder.is_dir()):
                continue
            try:
                record = _read_record(folder / "record.json")
                digest = hashlib.sha256((folder / "engine").read_bytes()).hexdigest()
            except (OSError, ValueError, msgspec.MsgspecError) as error:
                problems.append(f"{folder.name[:12]}..: cannot be read ({error})")
                continue
            if record.key != folder.name:
                problems.append(f"{folder.name[:12]}..: its record names another key")
            elif digest != record.engine_sha256:
                problems.append(f"{folder.name[:12]}..: its engine does not match its SHA-256")
        return problems

    def size(self) -> int:
        return sum(entry.record.engine_bytes for entry in self.entries())

    def prune(self, max_bytes: int, *, keep: str | None = None) -> list[Entry]:
        """Remove the least recently used entries until the engines fit ``max_bytes`` (never
        ``keep``, the one just stored); the entries removed."""
        entries = self.entries()
        total = sum(entry.record.engine_bytes for entry in entries)
        removed = []
        for entry in reversed(entries):  # the least recently used first
            if total <= max_bytes:
                break
            if entry.record.key == keep:
                continue
            self._remove(entry.folder)
            total -= entry.record.engine_bytes
            removed.append(entry)
        return removed

    def _remove(self, folder: Path) -> None:
        # The record first: an entry without one is not there, whatever is left of it.
        with contextlib.suppress(OSError):
            (folder / "record.json").unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def _read_record(path: Path) -> StoreRecord:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(path, flags)
    with os.fdopen(descriptor, "rb") as handle:
        if not os.path.isfile(path):
            raise ValueError("not a regular file")
        data = handle.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"over {MAX_RECORD_BYTES:,} bytes")
    return msgspec.json.decode(data, type=StoreRecord)


def _last_used(entry: Entry) -> float:
    try:
        return entry.folder.stat().st_mtime
    except OSError:
        return 0.0


def _holder_of(descriptor: int) -> str:
    try:
        said = os.pread(descriptor, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        said = ""
    return said or "another build"


# -- why a build was not served ---------------------------------------------------------------


def differences(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """What differs between two builds' inputs, most decisive first: the model, the backend
    and its version, the GPU, then the options one by one."""
    keys = [k for k in dict.fromkeys([*before, *after]) if before.get(k) != after.get(k)]
    decisive = [k for k in (*FINGERPRINT_KEYS, GPU_MODEL) if k in keys]
    rest = sorted(k for k in keys if k not in decisive)
    backend = after.get("trt.backend") or before.get("trt.backend") or "the backend"
    return [_change(k, before.get(k), after.get(k), backend) for k in [*decisive, *rest]]


def _change(key: str, before: str | None, after: str | None, backend: str) -> str:
    if key == "model.sha256":
        return f"the model changed (sha256 {(before or '?')[:8]}.. -> {(after or '?')[:8]}..)"
    if key == "trt.version":
        return f"{backend} {before} -> {after}"
    return attribute_change(key, before, after)


NO_ENGINE_YET = "no engine of this model in the store yet"
"""The miss reason of a build with nothing near it in the store: built, not rebuilt."""


def miss_reason(nearest: StoreRecord | None, attributes: Mapping[str, Any]) -> str:
    """Why a build of ``attributes`` was not served, in one line."""
    if nearest is None:
        return NO_ENGINE_YET
    changes = differences(nearest.inputs, key_inputs(attributes))
    if not changes:  # same inputs, another key: a store of an older trt-otel
        return "the stored engine of these inputs is of another key"
    return "; ".join(changes)
