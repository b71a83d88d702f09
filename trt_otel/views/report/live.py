"""The timeline of a build as it runs, for the HTTP view's ``/timeline.svg``: the report's view
(:class:`~trt_otel.views.report.model.BuildRecorder`) of the build's own read model, and the
report's drawing, so the live page and the report of the journal show one picture, and the page
folds nothing of its own.

Told of the events on the read model's thread; drawn on an HTTP thread, at most once a second
(a page polls it; a build can have a million events).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.events import BuildFinished, BuildStarted, Event, StepCompleted
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import Phase
from trt_otel.views.report.html import timeline_svg
from trt_otel.views.report.model import BuildRecorder

REDRAW_S = 1.0


class LiveTimeline:
    """A subscriber of the read model: the latest build of its log, drawn on demand."""

    name = "timeline"

    def __init__(self, model: ReadModel, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._model = model
        # Taken by the model's thread while it tells the recorder, and by a drawing thread
        # (before the model's lock, which the model's thread never holds while it tells).
        self._lock = threading.Lock()
        self._recorder = BuildRecorder(model)  # told by this timeline, under its lock
        self._record = self._recorder.on_event
        self._seen: tuple[int, int] | None = None
        """(a recent event's ``mono_ns``, this process's clock when it came): the build's clock
        now is this process's, offset by them. Taken at a batch's end, not at every event."""
        self._drawn: tuple[int, str] | None = None
        model.subscribe(self)

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        kind = type(event)
        with self._lock:
            if kind is BuildStarted or kind is BuildFinished or self._seen is None:
                self._drawn = None  # a start or an end is drawn at once
                self._seen = (event.mono_ns, self._clock.mono_ns())
            self._record(event, closed)

    def on_steps(self, last: StepCompleted) -> None:
        with self._lock:
            self._seen = (last.mono_ns, self._clock.mono_ns())

    def close(self) -> None:
        """Nothing to release."""

    def svg(self) -> str:
        """The timeline so far, up to now on the build's clock (its process may be another
        host's: the time since its last event is counted here)."""
        now = self._clock.mono_ns()
        with self._lock:
            drawn = self._drawn
            if drawn is not None and now - drawn[0] < REDRAW_S * 1e9:
                return drawn[1]
            build_now = None if self._seen is None else self._seen[0] + now - self._seen[1]
            with self._model.reading():
                report = self._recorder.report(build_now)
            picture = timeline_svg(report)
            self._drawn = (now, picture)
            return picture
