"""A session's part of the engine store (``--engine-store``): before the build, its key's lock
taken and its entry looked up (a hit is served to ``-o`` at once); after a successful build,
its engine stored. A hit is still a build of its own: it has a journal, a span and metrics, and
says what it saved; a miss says why it was built.

What the build record says (``build_start``'s attributes, so the span, ``/status``, the report
and ``diff`` have them): ``trt.store.hit`` (true or false), ``trt.store.key``, and on a hit
``trt.store.saved_s`` (the median of the builds that made the engine), on a miss
``trt.store.miss_reason``. A store that cannot be used (not a folder, not writable, full) never
fails a build: it is said once, and the build goes on without it.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import statistics
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import msgspec

from trt_otel.app.config import StoreConfig, UsageError
from trt_otel.builder.build import BuildJob, BuildResult
from trt_otel.builder.provenance import output_attributes
from trt_otel.builder.store import (
    NO_ENGINE_YET,
    EngineStore,
    StoreError,
    miss_reason,
    store_key,
)
from trt_otel.capture.gpu import GPU_IDENTITY, NvmlUnavailableError, identify_gpu, selected_gpu
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.capture.supervisor import StopNow
from trt_otel.control.signals import STOP_SIGNALS, TIME_LIMIT_SIGNAL, handling_interrupts
from trt_otel.core.durations import format_duration
from trt_otel.core.eta import PastBuild
from trt_otel.core.events import Outcome
from trt_otel.views.terminal import say, warn

STORE_HIT = "trt.store.hit"
STORE_KEY = "trt.store.key"
STORE_SAVED_S = "trt.store.saved_s"
STORE_MISS_REASON = "trt.store.miss_reason"


@dataclass(slots=True)
class StoreVisit:
    """A build's visit to the store: its key (whose lock it holds), and the engine served."""

    store: EngineStore
    key: str
    served: bytes | None
    saved_s: float = 0.0

    def record_served(self, monitor: BuildMonitor, job: BuildJob) -> BuildResult:
        """The served engine, as the build's output and end."""
        assert self.served is not None and job.engine_path is not None
        monitor.record_output(output_attributes(self.served, job.engine_path))
        detail = f"served from the engine store (its builds took {format_duration(self.saved_s)})"
        monitor.end(Outcome.SUCCESS, detail)
        return BuildResult(Outcome.SUCCESS, detail, job.engine_path, len(self.served))

    def keep(self, monitor: BuildMonitor, result: BuildResult | None, job: BuildJob) -> None:
        """Store the engine of a successful build (a failed, cancelled or interrupted one is
        never stored); a store that cannot take it is said, and the build stays a success."""
        state = monitor.state
        if result is None or result.outcome is not Outcome.SUCCESS or job.engine_path is None:
            return
        if state.start_mono_ns is None or state.end_mono_ns is None:
            return
        try:
            self.store.put(
                self.key,
                state.attributes,
                job.engine_path,
                build_s=(state.end_mono_ns - state.start_mono_ns) / 1e9,
                build_id=monitor.build_id,
                peak_rss_bytes=state.activity.peak_rss_bytes,
            )
        except OSError as error:
            warn(f"store: the engine was not stored: {error.strerror or error}")
            return
        say(f"store: engine stored as {self.key[:12]}.. in {self.store.root}")


def stored_builds(visit: StoreVisit | None) -> tuple[list[PastBuild], list[PastBuild]]:
    """What the store's records say of earlier builds, for a forecast: those of this build's
    key (an entry whose engine was found bad is rebuilt), and those of every other key. Records
    are data from others: only what they are checked to be is used."""
    if visit is None:
        return [], []
    same: list[PastBuild] = []
    others: list[PastBuild] = []
    for entry in visit.store.entries():
        record = entry.record
        builds = [t for t in record.build_s if math.isfinite(t) and t > 0]
        if not builds:
            continue
        peak = record.peak_rss_bytes if record.peak_rss_bytes > 0 else None
        size = record.model_bytes if record.model_bytes > 0 else None
        backend = record.inputs.get("trt.backend", "")
        name, key = record.model_name, record.key[:12]
        if record.key == visit.key:
            same += [PastBuild(key, t, {}, peak, size, name, backend) for t in builds]
        else:  # one for each engine: the median of the builds that made it
            others.append(PastBuild(key, statistics.median(builds), {}, peak, size, name, backend))
    return same, others


@contextlib.contextmanager
def _stopped_while_waiting() -> Iterator[None]:
    """A stop asked for while the build waits for its key (another process builds the same
    engine): nothing was started, so nothing is left to end; it is said, and the command exits
    as for any stop (SIGTERM, SIGHUP or a time-limit warning: 3; Ctrl-C: 130), rather than dying
    of the signal."""

    def stop(signum: int, frame: FrameType | None) -> None:
        # Raised in the wait's own system call, the only thing the main thread does here.
        raise KeyboardInterrupt if signum == signal.SIGINT else StopNow(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread alone: its owner handles them
        return
    try:
        with handling_interrupts(stop, (*STOP_SIGNALS, TIME_LIMIT_SIGNAL)):
            yield
    except KeyboardInterrupt as stopped:
        name = str(stopped) or "Ctrl-C"
        say(f"store: stopped ({name}) while waiting for this engine's build elsewhere: not built")
        raise


def unknown_gpu(attributes: dict[str, Any]) -> str | None:
    """Why a TensorRT build's key cannot name its GPU, or None: a TensorRT engine runs only on
    the GPU model it was built for, so its key names the GPU. Where the build's record does not
    (``--no-gpu``), the GPU is asked once through NVML and added to ``attributes``; where NVML
    cannot say, an engine stored or served here could be another GPU's."""
    if attributes.get("trt.backend") != "tensorrt" or all(k in attributes for k in GPU_IDENTITY):
        return None
    try:
        attributes.update(identify_gpu(selected_gpu()))
    except NvmlUnavailableError as error:
        return (
            "a TensorRT engine runs only on the GPU model it was built for, and this build's "
            f"GPU cannot be named here ({error})"
        )
    return None


def visit_store(
    stack: contextlib.ExitStack[Any],
    config: StoreConfig,
    job: BuildJob,
    attributes: dict[str, Any],
) -> StoreVisit | None:
    """Open the store, hold the build's key on ``stack`` (waiting for a build of the same key
    elsewhere to end), and serve its engine where it is stored; the build's record says which.
    None: no store asked for, or one that cannot be used (said)."""
    if config.directory is None:
        return None
    if job.engine_path is None:
        raise UsageError("--engine-store needs --output: the engine it serves or stores")
    unknown = unknown_gpu(attributes)
    if unknown is not None:
        warn(f"store: not used: {unknown}")
        return None
    try:
        store = EngineStore(config.directory, max_bytes=config.max_bytes)
        key = store_key(attributes)
        holder = f"pid {os.getpid()} on {socket.gethostname()}"
        with _stopped_while_waiting():
            stack.enter_context(store.building(key, holder=holder, say=say))
        entry = store.lookup(key, warn=warn)
        served = store.serve(entry, job.engine_path, warn=warn) if entry is not None else None
    except (StoreError, OSError) as error:
        warn(f"store: not used: {error}")
        return None
    attributes[STORE_KEY] = key
    attributes[STORE_HIT] = served is not None
    if entry is not None and served is not None:
        attributes[STORE_SAVED_S] = round(entry.record.saves_s, 3)
        say(f"store: served {key[:12]}.. (built in {format_duration(entry.record.saves_s)})")
        return StoreVisit(store, key, served, entry.record.saves_s)
    nearest = store.nearest(attributes)
    reason = miss_reason(nearest, attributes)
    attributes[STORE_MISS_REASON] = reason
    say(f"rebuilding: {reason}" if nearest is not None else f"store: {reason}: building")
    return StoreVisit(store, key, None)


MAX_REASONS_SHOWN = 3
MAX_REASON_CHARS = 500
"""The longest miss reason a status document holds (a journal's, so any length)."""


class StoreStatus(msgspec.Struct, frozen=True):
    """What the engine store did for a build (``--engine-store``), as its status document
    (fleet and MCP) has it."""

    served: bool
    """Whether its engine came from the store, without a build."""
    saved_s: float | None
    miss_reason: str | None
    """Why it was built, not served (``options: +optimization_level 1``)."""


def store_status(attributes: Mapping[str, Any]) -> StoreStatus | None:
    """What the store did for a build: None for a build without a store. From a journal, so
    checked for what it is."""
    hit = attributes.get(STORE_HIT)
    if not isinstance(hit, bool):
        return None
    reason = attributes.get(STORE_MISS_REASON)
    saved = attributes.get(STORE_SAVED_S)
    return StoreStatus(
        served=hit,
        saved_s=saved if isinstance(saved, int | float) and not isinstance(saved, bool) else None,
        miss_reason=reason[:MAX_REASON_CHARS] if isinstance(reason, str) and not hit else None,
    )


def engines_summary(stores: Iterable[StoreStatus | None]) -> str | None:
    """One line for a run of many builds: ``engines: 3 served, 1 rebuilt (options:
    +optimization_level 1), 2 built``, the reasons for rebuilding most frequent first; None
    where no build used the store."""
    used = [store for store in stores if store is not None]
    if not used:
        return None
    served = sum(1 for store in used if store.served)
    reasons = Counter(
        str(store.miss_reason)
        for store in used
        if not store.served and store.miss_reason not in (None, NO_ENGINE_YET)
    )
    built = len(used) - served - reasons.total()
    parts = [f"{served} served"]
    if reasons:
        shown = [reason for reason, _ in reasons.most_common(MAX_REASONS_SHOWN)]
        more = len(reasons) - len(shown)
        said = "; ".join(shown) + (f"; {more} more" if more else "")
        parts.append(f"{reasons.total()} rebuilt ({said})")
    if built:
        parts.append(f"{built} built")
    return "engines: " + ", ".join(parts)
