"""How long is left: estimates that say when they do not know.

TensorRT's progress is bursty and not monotonic (a phase's step count is decided as it starts,
and the tactic timing that dominates a build is one step of "Building engine"), so a naive ETA
from the progress ratio lies. Three estimates are kept apart, each with its basis:

- **per phase**: time per step so far times the steps left; unknown before the first step;
- **progress**: ``elapsed * (1 - p) / p`` from the overall progress ratio; unknown while too
  little is done to extrapolate, and known to be rough;
- **history**: from journals of earlier builds of the same model (``--history DIR``): at each
  phase boundary this build has passed, how long those builds still took from the same boundary,
  scaled by how fast this build has been so far. Unknown without history, or when this build
  goes where none of them went.

The whole-build ETA is the history estimate where there is one, else the progress estimate.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from trt_otel.core.builds import builds_of
from trt_otel.core.durations import format_duration
from trt_otel.core.events import BuildStarted, Event, Outcome, PhaseFinished
from trt_otel.core.journal_codec import JournalError
from trt_otel.core.journal_reader import Journal, read_journal
from trt_otel.core.state import BuildState

BoundaryKey = tuple[tuple[str, ...], int]
"""A phase boundary: the path of names down to a finished phase, and which occurrence of that
path it was (TensorRT repeats phases, so "the 3rd 'Timing graph nodes' under ..." is one key)."""

START: BoundaryKey = ((), 0)
MIN_PROGRESS = 0.02
MIN_ELAPSED_S = 2.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """Seconds left, or None with the reason it is unknown."""

    seconds: float | None
    basis: str
    unknown: str | None = None


@dataclass(frozen=True, slots=True)
class BuildEta:
    build: Estimate
    progress: Estimate
    history: Estimate
    phases: dict[int, Estimate] = field(default_factory=dict)
    """Per open phase (by phase id)."""


def format_eta(value: Estimate) -> str:
    """``ETA 3m10s (history)``, or ``ETA unknown (no step yet)``."""
    if value.seconds is None:
        return f"ETA unknown ({value.unknown})"
    if value.basis == "finished":
        return "done"
    return f"ETA {format_duration(value.seconds)} ({value.basis})"


class BoundaryTracker:
    """Follows a build's phase boundaries (fold it after its BuildState)."""

    # Slots: read on every phase's end (see BuildState's).
    __slots__ = ("_paths", "boundaries", "counts", "keep_all", "last", "last_mono_ns")

    def __init__(self, *, keep_all: bool = True) -> None:
        self.counts: dict[tuple[str, ...], int] = {}
        self.last: BoundaryKey = START
        self.last_mono_ns: int | None = None
        self.keep_all = keep_all
        self.boundaries: dict[BoundaryKey, int] = {}
        """Elapsed ns at each boundary passed so far (only the last one unless ``keep_all``:
        a live build's estimates need no more, and a build passes one per phase)."""
        self._paths: dict[int, tuple[str, ...]] = {}
        """The path of each phase whose children have finished, while it is open: a parent's
        path is walked once, not once for each of its (maybe thousands of) children."""

    def apply(self, event: Event, state: BuildState) -> None:
        kind = type(event)
        if kind is not PhaseFinished and kind is not BuildStarted:
            return  # no boundary
        if kind is BuildStarted:  # a tracker follows one build (see trt_otel.core.builds)
            self.last, self.last_mono_ns = START, event.mono_ns
            self.boundaries[START] = 0
        else:
            assert isinstance(event, PhaseFinished)
            phase_id = state.latest_by_name.get(event.name)
            if phase_id is None or state.phases[phase_id].finish_mono_ns != event.mono_ns:
                return  # not a finish TensorRT's protocol allows: no boundary
            path = self._path_of(state, phase_id)
            occurrence = self.counts.get(path, 0)
            self.counts[path] = occurrence + 1
            self.last, self.last_mono_ns = (path, occurrence), event.mono_ns
            if state.start_mono_ns is not None:
                if not self.keep_all:
                    self.boundaries.clear()
                self.boundaries[self.last] = event.mono_ns - state.start_mono_ns

    def _path_of(self, state: BuildState, phase_id: int) -> tuple[str, ...]:
        """The path of a phase that just finished (it is never a parent again)."""
        self._paths.pop(phase_id, None)
        phase = state.phases[phase_id]
        parent_id = phase.parent_id
        if parent_id is None:
            return (phase.name,)
        parent_path = self._paths.get(parent_id)
        if parent_path is None:
            parent_path = self._paths[parent_id] = _path(state, parent_id)
        path = (*parent_path, phase.name)
        if len(path) > MAX_PATH_DEPTH:
            return (DEEPER, *path[-(MAX_PATH_DEPTH - 1) :])
        return path


MAX_PATH_DEPTH = 64
"""The most names a boundary's path holds: a phase nested deeper is known by its innermost
names after :data:`DEEPER`. Real builds nest a handful of levels; a journal nesting 100,000
would otherwise make the paths (and the time to walk them) quadratic in its depth."""
DEEPER = "…"


def _path(state: BuildState, phase_id: int | None) -> tuple[str, ...]:
    names: list[str] = []
    while phase_id is not None:
        if len(names) == MAX_PATH_DEPTH:
            return (DEEPER, *reversed(names[: MAX_PATH_DEPTH - 1]))
        phase = state.phases[phase_id]
        names.append(phase.name)
        phase_id = phase.parent_id
    return tuple(reversed(names))


@dataclass(frozen=True, slots=True)
class PastBuild:
    source: str
    total_s: float
    boundaries: dict[BoundaryKey, float]
    peak_rss_bytes: int | None = None
    """The builder's peak resident memory, where its process was sampled."""
    model_bytes: int | None = None
    """The size of its model's file (``model.bytes``), where it was recorded."""
    model_name: str = ""
    """Its model's file name, without the folder (``model.path``)."""
    backend: str = ""


@dataclass
class History:
    """Earlier builds of a model, read from their journals."""

    builds: list[PastBuild]
    skipped: list[str] = field(default_factory=list)
    """Why journals in the directory were not used."""
    others: list[PastBuild] = field(default_factory=list)
    """The finished, successful builds of other models (or options): what a forecast for a
    build never made before scales (:mod:`trt_otel.core.forecast`)."""

    @classmethod
    def load(
        cls,
        directory: Path,
        model_sha256: str | None = None,
        *,
        attributes: Mapping[str, Any] | None = None,
        read: Callable[[Path], Journal] = read_journal,
    ) -> History:
        """The builds of the journals (``*.jsonl``) in ``directory`` that are earlier builds of
        this one (:func:`same_build`: ``attributes`` are this build's, else only its model's
        ``model_sha256`` is known). Each is read only if it is a regular file (a named pipe, a
        device, a directory is skipped, and said so), a bounded piece at a time, by ``read``: the
        app passes :func:`trt_otel.capture.checked.read_journal`, which takes a C++ build's
        unchecked callbacks through the one way in (core cannot import it); by default, the
        journal's events as written."""
        this = dict(attributes or {})
        if model_sha256 is not None:
            this.setdefault("model.sha256", model_sha256)
        builds, skipped, others = [], [], []
        for path in sorted(directory.glob("*.jsonl")):
            try:
                journal = read(path)
            except JournalError as error:
                skipped.append(f"{path.name}: {error}")
                continue
            if any(problem.kind == "nul_prefix" for problem in journal.problems):
                skipped.append(f"{path.name}: truncated in place; its start is lost")
                continue
            past = past_build(journal.events, path.name)
            if past is None:
                skipped.append(f"{path.name}: not a finished, successful build")
            elif not same_build(_start_attributes(journal.events), this):
                skipped.append(f"{path.name}: another model")
                others.append(past)
            else:
                builds.append(past)
        return cls(builds, skipped, others)

    def peak_rss_range(self) -> tuple[int, int, int] | None:
        """(builds, lowest peak, highest peak) of the builds whose memory was sampled."""
        peaks = [b.peak_rss_bytes for b in self.builds if b.peak_rss_bytes is not None]
        return (len(peaks), min(peaks), max(peaks)) if peaks else None

    def remaining(self, key: BoundaryKey, elapsed_s: float) -> Estimate:
        """Seconds left after boundary ``key``, passed ``elapsed_s`` into this build."""
        if not self.builds:
            return Estimate(None, "history", "no earlier build of this model")
        spread = self.remaining_spread(key, elapsed_s)
        if spread is None:
            return Estimate(None, "history", "earlier builds did not pass this point")
        return Estimate(spread.median_s, "history")

    def remaining_spread(self, key: BoundaryKey, elapsed_s: float) -> Remaining | None:
        """What the earlier builds that passed boundary ``key`` still took from it, scaled to
        this build's pace (``elapsed_s`` at the boundary), or None when none passed it."""
        at = [(b.boundaries[key], b.total_s) for b in self.builds if key in b.boundaries]
        if not at:
            return None
        then = statistics.median(t for t, _ in at)
        # This machine may be faster or slower than the earlier ones: scale by how this build
        # compares so far, within reason (early boundaries say little).
        scale = min(4.0, max(0.25, elapsed_s / then)) if then > 1.0 else 1.0
        left = [total - t for t, total in at]
        return Remaining(
            len(at),
            min(left) * scale,
            statistics.median(left) * scale,
            max(left) * scale,
            scale,
        )

    def totals(self) -> tuple[float, float, float] | None:
        """(fastest, median, slowest) of the earlier builds' durations, or None."""
        if not self.builds:
            return None
        totals = [b.total_s for b in self.builds]
        return min(totals), statistics.median(totals), max(totals)


@dataclass(frozen=True, slots=True)
class Remaining:
    """What earlier builds still took from one boundary, in this build's pace (seconds)."""

    builds: int
    fastest_s: float
    median_s: float
    slowest_s: float
    scale: float
    """This build's pace against theirs so far (2.0: it took twice as long to get here)."""


def same_build(earlier: Mapping[str, Any], this: Mapping[str, Any]) -> bool:
    """Whether a build whose ``build_start`` attributes are ``earlier`` is an earlier build of
    the one with ``this``: by ``fingerprint`` (what decides the engine) when both builds have
    one, else by the model's ``model.sha256`` (any build, when this one names no model). The
    one rule every use of history goes by."""
    earlier_print, this_print = earlier.get("fingerprint"), this.get("fingerprint")
    if earlier_print is not None and this_print is not None:
        return bool(earlier_print == this_print)
    model = this.get("model.sha256")
    return model is None or earlier.get("model.sha256") == model


def _start_attributes(events: Sequence[Event]) -> Mapping[str, Any]:
    for event in events:
        if isinstance(event, BuildStarted):
            return event.attributes
    return {}


def model_size(attributes: Mapping[str, Any]) -> int | None:
    """A build's model's size in bytes (``model.bytes``), where its record holds a true one."""
    size = attributes.get("model.bytes")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def model_file_name(attributes: Mapping[str, Any]) -> str:
    """A build's model's file name, without its folder (``model.path``); empty without one."""
    return PurePath(str(attributes.get("model.path", ""))).name


def past_build(events: Sequence[Event], source: str) -> PastBuild | None:
    """A journal's last build's boundaries, if it finished with success; else None."""
    builds = builds_of(events)
    state, tracker = BuildState(), BoundaryTracker()
    for event in builds[-1] if builds else ():
        state.apply(event)
        tracker.apply(event, state)
    if state.outcome is not Outcome.SUCCESS or state.start_mono_ns is None:
        return None
    assert state.end_mono_ns is not None
    return PastBuild(
        source,
        (state.end_mono_ns - state.start_mono_ns) / 1e9,
        {key: ns / 1e9 for key, ns in tracker.boundaries.items()},
        state.activity.peak_rss_bytes,
        model_bytes=model_size(state.attributes),
        model_name=model_file_name(state.attributes),
        backend=str(state.attributes.get("trt.backend", "")),
    )


def estimate(
    state: BuildState, tracker: BoundaryTracker, now_mono_ns: int, history: History | None
) -> BuildEta:
    """Every estimate for ``state`` at ``now_mono_ns``."""
    if state.outcome is not None:
        done = Estimate(0.0, "finished")
        return BuildEta(done, done, done)
    if state.start_mono_ns is None:
        waiting = Estimate(None, "progress", "the build has not started")
        return BuildEta(waiting, waiting, Estimate(None, "history", "the build has not started"))
    elapsed_s = (now_mono_ns - state.start_mono_ns) / 1e9
    progress = _from_progress(state.progress_ratio(), elapsed_s)
    if history is None:
        from_history = Estimate(None, "history", "no history given (--history DIR)")
    else:
        boundary_s = tracker.boundaries.get(tracker.last, 0) / 1e9
        from_history = history.remaining(tracker.last, boundary_s)
        if from_history.seconds is not None:
            since_boundary = elapsed_s - boundary_s
            from_history = Estimate(max(0.0, from_history.seconds - since_boundary), "history")
    build = from_history if from_history.seconds is not None else progress
    phases = {
        phase_id: _phase_estimate(state, phase_id, now_mono_ns)
        for phase_id in state.open_by_name.values()
    }
    return BuildEta(build, progress, from_history, phases)


def _from_progress(ratio: float, elapsed_s: float) -> Estimate:
    if ratio >= 1.0:
        return Estimate(0.0, "progress")
    if ratio < MIN_PROGRESS or elapsed_s < MIN_ELAPSED_S:
        return Estimate(None, "progress", "too little done to extrapolate")
    return Estimate(elapsed_s * (1.0 - ratio) / ratio, "progress")


def _phase_estimate(state: BuildState, phase_id: int, now_mono_ns: int) -> Estimate:
    phase = state.phases[phase_id]
    done = phase.last_step + 1
    if done <= 0:
        return Estimate(None, "steps", "no step yet")
    per_step = (now_mono_ns - phase.start_mono_ns) / 1e9 / done
    return Estimate(per_step * max(0, phase.num_steps - done), "steps")
