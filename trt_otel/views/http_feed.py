"""The HTTP view's feed of the event log: the newest events, as Server-Sent Events frames to any
thread that asks.

It follows the log (on the appending thread with each batch where the build is folded there,
else on a thread of its own); a client's thread reads the frames after the ``seq`` it last saw
(``Last-Event-ID``, ``?since=N``) without taking the log's lock, so a client that joins late or
reconnects misses nothing and gets nothing twice, and a slow one only waits on its own socket. A
frame's ``id:`` is its event's ``seq``, its data the event's journal line.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from trt_otel.core.events import BuildFinished, Event
from trt_otel.core.journal_codec import encode_event

RETAINED_FRAMES = 100_000
"""The newest events a feed keeps for its clients (older ones are dropped, and said)."""
MAX_FRAMES_PER_READ = 8192
"""Frames one read hands a client: a late client catches up in pieces."""


class EventFeed:
    """The server's follower: the newest events, as SSE frames to any thread that asks.

    A frame is encoded when a client reads it, not when its event arrives: a build makes
    millions of events, and most builds are never streamed.
    """

    name = "http"

    def __init__(
        self,
        retain: int = RETAINED_FRAMES,
        *,
        ends_with_build: bool = True,
    ) -> None:
        self._retain = retain
        self._ends_with_build = ends_with_build
        """False for a log of several builds (``trt-otel run``): the stream ends when the log
        does."""
        self._events: list[Event] = []
        self._first_seq = 0
        """``seq`` of ``_events[0]``."""
        self._changed = threading.Condition()
        self.ended = False
        self.closed = False

    def handle(self, events: Sequence[Event]) -> None:
        with self._changed:
            if not self._events and events:
                self._first_seq = events[0].seq
            self._events.extend(events)
            # Trim in steps of a tenth, so the memory held stays near the bound (a bigger
            # step would make it swing) while trimming stays rare.
            if len(self._events) > self._retain + self._retain // 10:
                drop = len(self._events) - self._retain
                del self._events[:drop]
                self._first_seq += drop
            if self._ends_with_build and BuildFinished in map(type, events):
                self.ended = True
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def frames_after(
        self, seq: int, timeout_s: float, limit: int = MAX_FRAMES_PER_READ
    ) -> tuple[int, list[bytes], bool]:
        """Frames of events after ``seq`` (waiting up to ``timeout_s`` for one, at most
        ``limit``): the first seq they start at, the frames, and whether the stream is over
        (build ended, all sent)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._next_index(seq) < len(self._events) or (self.closed or self.ended),
                timeout=timeout_s,
            )
            start = max(0, self._next_index(seq))
            events = self._events[start : start + limit]
            over = (self.ended or self.closed) and start + len(events) >= len(self._events)
            first = self._first_seq + start
        return first, [_frame(event) for event in events], over

    def _next_index(self, seq: int) -> int:
        return seq + 1 - self._first_seq


def _frame(event: Event) -> bytes:
    # The data is the journal's line, encoded by the journal's codec (JSON has no raw newline).
    return f"id: {event.seq}\nevent: {event.type}\ndata: ".encode() + encode_event(event) + b"\n\n"
