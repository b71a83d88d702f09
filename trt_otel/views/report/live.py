"""The timeline of a build as it runs, for the HTTP view's ``/timeline.svg``: the same fold
(:class:`~trt_otel.views.report.model.BuildRecorder`) and the same drawing as ``trt-otel report``,
so the live page and the report of the journal show one picture.

Fed by the HTTP view's event feed, on its follower thread; drawn on an HTTP thread, at most once
a second (a page polls it; a build can have a million events).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from trt_otel.core.builds import PerBuild
from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.events import BuildFinished, BuildStarted, Event
from trt_otel.views.report.html import timeline_svg
from trt_otel.views.report.model import BuildRecorder

REDRAW_S = 1.0


class LiveTimeline:
    """The latest build of a log, folded as it comes, drawn on demand."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._builds = PerBuild(BuildRecorder)
        self._seen: tuple[int, int] | None = None
        """(the last event's ``mono_ns``, this process's clock when it came)."""
        self._drawn: tuple[int, str] | None = None

    def handle(self, events: Sequence[Event]) -> None:
        """Fold a batch in (a log of several builds: the latest build is drawn)."""
        if not events:
            return
        with self._lock:
            fold_for = self._builds.fold_for
            for event in events:
                kind = type(event)
                if kind is BuildStarted or kind is BuildFinished:
                    self._drawn = None  # a start or an end is drawn at once
                fold_for(event).apply(event)
            self._seen = (events[-1].mono_ns, self._clock.mono_ns())

    def svg(self) -> str:
        """The timeline so far, up to now on the build's clock (its process may be another
        host's: the time since its last event is counted here)."""
        now = self._clock.mono_ns()
        with self._lock:
            drawn = self._drawn
            if drawn is not None and now - drawn[0] < REDRAW_S * 1e9:
                return drawn[1]
            build_now = None if self._seen is None else self._seen[0] + now - self._seen[1]
            picture = timeline_svg(self._builds.current.report(build_now))
            self._drawn = (now, picture)
            return picture
