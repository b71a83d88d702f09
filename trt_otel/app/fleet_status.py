"""A fleet's build as one document: its journal folded as it grows, what the fleet knows of its
process (or its Ray job), and, while it runs, what its own HTTP view says of it.

The local fleet and Ray's both answer through here (:func:`journal_status`, :func:`wait_for`,
:func:`events_page`, :func:`would_it_fit`), so a status, a page of events or a wait reads the
same whichever fleet serves it. A journal is read from where the last read stopped
(:class:`JournalFold`): ``wait_build`` asks every 250 ms, and a journal can hold millions of
steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from msgspec.structs import replace

from trt_otel.app.engine_store import store_status
from trt_otel.app.fleet_documents import (
    ENDED,
    AttemptStatus,
    BuildStatus,
    CancelNote,
    EventsPage,
    FitAnswer,
    ForecastStatus,
    OpenPhase,
    WaitAnswer,
)
from trt_otel.app.fleet_requests import (
    MAX_DURATION_CHARS,
    MAX_PATH_CHARS,
    FleetError,
    check_text,
)
from trt_otel.app.session import exit_code_of
from trt_otel.capture.checked import CheckedEvents, read_journal
from trt_otel.control.deadline import would_fit
from trt_otel.core.attempts import attempt_of
from trt_otel.core.builds import PerBuild
from trt_otel.core.durations import DurationError, parse_positive_duration
from trt_otel.core.eta import History
from trt_otel.core.events import BuildFinished, BuildStarted, CancelRequested, Event
from trt_otel.core.files import open_regular_for_reading
from trt_otel.core.forecast import forecast_status
from trt_otel.core.journal_codec import JournalError, event_to_dict
from trt_otel.core.journal_reader import MAX_HEADER_BYTES, LineReader, parse_header
from trt_otel.core.state import BuildState
from trt_otel.views.status import Builder, Estimate, Projection

T = TypeVar("T")


def journal_status(
    state: BuildState, attempts: Sequence[AttemptStatus], /, **fleets: Any
) -> BuildStatus:
    """A build's status as its journal (folded into ``state``) tells it, with what the fleet
    knows of it (``fleets``: its id, kind, state, paths and the fleet's own fields)."""
    elapsed_s = None
    if state.start_mono_ns is not None and state.end_mono_ns is not None:
        elapsed_s = (state.end_mono_ns - state.start_mono_ns) / 1e9
    cancel = state.cancel
    return BuildStatus(
        build_id=state.build_id,
        last_seq=state.last_seq,
        progress=state.progress_ratio(),
        steps_completed=state.steps_completed_total,
        elapsed_s=elapsed_s,
        outcome=state.outcome.value if state.outcome is not None else None,
        exit_code=exit_code_of(state.outcome) if state.outcome is not None else None,
        detail=state.outcome_detail or None,
        cancel=CancelNote(cancel.reason, cancel.source) if cancel is not None else None,
        builder=_typed(state.activity.as_json(), Builder),
        forecast=_typed(forecast_status(state), ForecastStatus),
        store=store_status(state.attributes),
        attempts=list(attempts),
        **fleets,
    )


def with_view(status: BuildStatus, view: dict[str, Any]) -> BuildStatus:
    """``status`` with what the build's own HTTP view says of it while it runs (its estimates,
    its open phases, its GPU); the view's answer is checked for what it is, field by field."""
    steps = view.get("steps_completed")
    progress = _number(view.get("progress"))
    elapsed_s = _number(view.get("elapsed_s"))
    return msgspec.structs.replace(
        status,
        state="cancelling" if view.get("status") == "cancelling" else "running",
        progress=status.progress if progress is None else progress,
        steps_completed=steps if type(steps) is int else status.steps_completed,
        elapsed_s=status.elapsed_s if elapsed_s is None else elapsed_s,
        eta=_typed(view.get("eta"), Estimate),
        open_phases=_open_path(view.get("phases")),
        gpu=view.get("gpu") if isinstance(view.get("gpu"), dict) else None,
        builder=_typed(view.get("builder"), Builder) or status.builder,
        projection=_typed(view.get("projection"), Projection),
    )


def _typed(value: object, document: type[T]) -> T | None:
    """``value`` (a JSON object) as ``document``, or None where it is none or is not one."""
    if value is None:
        return None
    try:
        return msgspec.convert(value, document)
    except msgspec.ValidationError:
        return None


def _number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (a bool is no number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def events_page(events: Sequence[Event], since_seq: int, limit: int) -> EventsPage:
    """The events after ``since_seq``, ``limit`` of them at most, as journal records."""
    after = [e for e in events if e.seq > since_seq]
    chosen = after[:limit]
    return EventsPage(
        events=[event_to_dict(e) for e in chosen],
        next_seq=chosen[-1].seq if chosen else since_seq,
        more=len(after) > len(chosen),
    )


def wait_for(
    status_of: Callable[[], BuildStatus], until: str, timeout_s: float, *, poll_s: float
) -> WaitAnswer:
    """Until the build (``status_of``) progresses (a step, a phase, a cancel, its end) or ends
    (``until``), or ``timeout_s`` passes: what happened, and its status then."""
    if until not in ("progress", "end"):
        raise FleetError("until is 'progress' or 'end'")
    current = status_of()
    baseline = _progress_key(current)
    deadline = time.monotonic() + timeout_s
    while True:
        if current.state in ENDED:
            return WaitAnswer("ended", current)
        if until == "progress" and _progress_key(current) != baseline:
            return WaitAnswer("progressed", current)
        if time.monotonic() >= deadline:
            return WaitAnswer("timeout", current)
        time.sleep(poll_s)
        current = status_of()


def would_it_fit(
    model: str,
    deadline: str,
    history: str,
    model_path_of: Callable[[str], Path],
    inside: Callable[[str, Path], Path],
) -> FitAnswer:
    """MCP's ``will_it_fit`` for a fleet whose ``model_path_of`` and ``inside`` confine the
    model and the history folder: ``--deadline``'s own rule, from the journals of earlier
    builds, and nothing is built."""
    check_text("model", model, MAX_PATH_CHARS)
    check_text("deadline", deadline, MAX_DURATION_CHARS)
    check_text("history", history, MAX_PATH_CHARS)
    try:
        limit_s = parse_positive_duration(deadline)
    except DurationError as error:
        raise FleetError(f"deadline: {error}") from None
    model_path = model_path_of(model)
    folder = inside("history", Path(history).expanduser().absolute())
    if not folder.is_dir():
        raise FleetError(f"history is not a directory of journals: {folder}")
    try:
        with open_regular_for_reading(model_path, "model") as handle:
            hasher = hashlib.sha256()
            while chunk := handle.read(1 << 20):
                hasher.update(chunk)
            digest = hasher.hexdigest()
    except OSError as error:
        raise FleetError(f"model {model_path}: {error.strerror or error}") from None
    earlier = History.load(folder, attributes={"model.sha256": digest}, read=read_journal)
    fit = would_fit(earlier, limit_s)
    projection = fit.projection
    return FitAnswer(
        answer=fit.answer,
        reason=fit.reason,
        deadline_s=limit_s,
        builds=fit.builds,
        within=fit.within,
        journals_not_used=len(earlier.skipped),
        projection=_typed(dataclasses.asdict(projection), Projection) if projection else None,
    )


class JournalFold:
    """A build's journal folded as it grows: each call reads only what was added since the
    last (``wait_build`` asks for the status every 250 ms, and a journal can hold millions of
    steps). Starts again when the file is replaced or shrinks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._start()

    def _start(self) -> None:
        self._builds = PerBuild(lambda: BuildState(forget_closed=True))
        self.attempts: list[AttemptStatus] = []
        """A retry ladder's attempts so far (none outside one): each with how it ended."""
        self._reader = LineReader()
        self._checked: CheckedEvents | None = None
        """The header's reading of the events (None until the header is read)."""
        self._offset = 0
        self._identity: tuple[int, int] | None = None

    @property
    def state(self) -> BuildState:
        """The journal's latest build (a retry ladder's latest attempt)."""
        return self._builds.current

    def update(self) -> BuildState:
        """The state with every complete line of the journal folded in."""
        try:
            handle = open_regular_for_reading(self.path, "journal")
        except OSError:
            return self.state  # not written yet (or not a journal): what was read stands
        with handle:
            info = os.fstat(handle.fileno())
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                self._start()
                self._identity = identity
            handle.seek(self._offset)
            checked = self._checked
            if checked is None:
                first = handle.readline(MAX_HEADER_BYTES)
                if not first.endswith(b"\n"):
                    return self.state  # the header is still being written
                self._offset += len(first)
                try:
                    header = parse_header(first, self.path)
                except JournalError:
                    header = {}  # read as it was before: its lines will not be events
                checked = self._checked = CheckedEvents(header)
            while chunk := handle.read(1 << 20):
                self._offset += len(chunk)
                read = [item for item in self._reader.feed(chunk) if isinstance(item, Event)]
                for event in checked.feed(read):
                    self._builds.fold_for(event).apply(event)
                    self._follow_attempts(event)
        return self.state

    def _follow_attempts(self, event: Event) -> None:
        if isinstance(event, BuildStarted):
            attempt = attempt_of(event.attributes)
            if attempt is not None:
                self.attempts.append(
                    AttemptStatus(build_id=event.build_id, **dataclasses.asdict(attempt))
                )
        elif self.attempts and self.attempts[-1].build_id == self.state.build_id:
            latest = self.attempts[-1]
            if isinstance(event, CancelRequested):
                latest = replace(latest, cancel=CancelNote(event.reason, event.source))
            elif isinstance(event, BuildFinished):
                latest = replace(
                    latest,
                    outcome=event.outcome.value,
                    exit_code=exit_code_of(event.outcome),
                    detail=event.detail or None,
                )
            self.attempts[-1] = latest


def journal_events(path: Path) -> list[Event]:
    try:
        return read_journal(path).events
    except (OSError, JournalError):
        return []  # not written yet (or not at all)


def _open_path(phases: object) -> list[OpenPhase]:
    """The open phases of a ``/status`` tree, from the root to the innermost, each with its
    steps."""
    path: list[OpenPhase] = []
    level = phases
    while isinstance(level, list):
        open_ones = [p for p in level if isinstance(p, dict) and p.get("status") == "open"]
        if not open_ones:
            break
        phase = open_ones[-1]
        path.append(
            OpenPhase(
                str(phase.get("name")),
                f"{int(phase.get('last_step', -1)) + 1}/{phase.get('num_steps')}",
                _number(phase.get("elapsed_s")),
            )
        )
        level = phase.get("children")
    return path


def _progress_key(status: BuildStatus) -> tuple[object, ...]:
    return (status.state, status.steps_completed, status.last_seq, status.cancel is not None)
