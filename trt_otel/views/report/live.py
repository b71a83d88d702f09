"""The timeline of a build as it runs, for the HTTP view's ``/timeline.svg``: the report's view
(:class:`~trt_otel.views.report.model.BuildRecorder`) of the build's own read model, and the
report's drawing, so the live page and the report of the journal show one picture, and the page
folds nothing of its own.

Told of the events on the read model's thread; drawn on an HTTP thread, at most once a second
(a page polls it; a build can have a million events).
"""

from __future__ import annotations

from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.events import BuildFinished, BuildStarted, Event, StepCompleted
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.report.model import BuildRecorder

REDRAW_S = 1.0


class LiveTimeline(BuildRecorder):
    """A subscriber of the read model: the latest build of its log, drawn on demand.

    The recorder itself, not a wrapper of one: a build tells it of hundreds of thousands of
    phases, each once, under the recorder's lock, which a drawing thread takes too (before the
    model's lock, which the model's thread never holds while it tells)."""

    name = "timeline"

    def __init__(self, model: ReadModel, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(model)
        self._clock = clock
        self._seen: tuple[int, int] | None = None
        """(a recent event's ``mono_ns``, this process's clock when it came): the build's clock
        now is this process's, offset by them. Taken at a batch's end and at the events other
        than a phase's start or finish, not at every event."""
        self._drawn: tuple[int, str] | None = None
        model.subscribe(self)

    def _noted(self, event: Event, kind: type[Event]) -> None:
        if kind is BuildStarted or kind is BuildFinished or self._seen is None:
            self._drawn = None  # a start or an end is drawn at once
            self._seen = (event.mono_ns, self._clock.mono_ns())
        super()._noted(event, kind)

    def on_steps(self, last: StepCompleted) -> None:
        with self.lock:
            self._seen = (last.mono_ns, self._clock.mono_ns())

    def svg(self) -> str:
        """The timeline so far, up to now on the build's clock (its process may be another
        host's: the time since its last event is counted here)."""
        now = self._clock.mono_ns()
        with self.lock:
            drawn = self._drawn
            if drawn is not None and now - drawn[0] < REDRAW_S * 1e9:
                return drawn[1]
            # The drawing's module (eleven dataclasses, each made by compiling its methods) is
            # imported when a page first asks for the picture, not by every HTTP view.
            from trt_otel.views.report.html import timeline_svg

            build_now = None if self._seen is None else self._seen[0] + now - self._seen[1]
            with self.model.reading():
                report = self.report(build_now)
            picture = timeline_svg(report)
            self._drawn = (now, picture)
            return picture
