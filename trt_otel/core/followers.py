"""Followers: the slow consumers of the event log, each isolated on its own thread.

A follower (journal, console, exporters, HTTP) receives events in order, in batches, on a named
daemon thread of its own. Between it and the callback thread stands a bounded deque: offering an
event is an O(1) append, never a wait. When the deque is full the oldest queued event is dropped
and counted, so a follower that hangs loses data visibly instead of stalling TensorRT; one that
raises is reported once and counted, and keeps receiving events.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from trt_otel.core.events import Event

_logger = logging.getLogger(__name__)


class Follower(Protocol):
    """A consumer of events. ``handle`` and ``close`` run on the follower's own thread."""

    @property
    def name(self) -> str:
        """A short name for logs and health metrics (``journal``, ``console``, ``otlp``)."""
        ...

    def handle(self, events: Sequence[Event]) -> None:
        """Consume a batch of events, in ``seq`` order. May be slow; may raise."""
        ...

    def close(self) -> None:
        """Release resources after the last batch. Called once, on the follower's thread."""
        ...


@dataclass(frozen=True, slots=True)
class FollowerHealth:
    """How a follower is doing, for metrics and the end-of-build summary."""

    name: str
    handled: int
    dropped: int
    errors: int
    queued: int
    last_error: str | None
    failed_events: int = 0
    """Events in the batches whose handling raised (they may not have been recorded)."""

    @property
    def lost(self) -> int:
        """Events that may be missing from what this follower made of the log."""
        return self.dropped + self.failed_events


class FollowerWorker:
    """Runs one follower: a bounded queue, a thread, drop and error counters."""

    def __init__(self, follower: Follower, *, capacity: int, min_interval_s: float) -> None:
        if capacity < 1:
            raise ValueError("a follower's queue needs room for at least one event")
        self.follower = follower
        self._capacity = capacity
        self._min_interval_s = min_interval_s
        self._queue: deque[Event] = deque()
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._progress = threading.Condition()
        self._offered = 0
        self._handled = 0
        self._dropped = 0
        self._errors = 0
        self._failed_events = 0
        self._last_error: str | None = None
        self._flush_waiters = 0
        self._stopping = False
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"trt-otel-{follower.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    # -- producer side (the appending thread, under the log's lock) -----------------------------

    def offer(self, event: Event) -> None:
        """Queue one event without waiting. Hot path: an append and, rarely, a wake-up."""
        if self._stopping:
            self._dropped += 1
            return
        queue = self._queue
        if len(queue) >= self._capacity:
            try:
                queue.popleft()
                self._dropped += 1
            except IndexError:  # the worker emptied it meanwhile
                pass
        queue.append(event)
        self._offered += 1
        if not self._wake.is_set():
            self._wake.set()

    def offer_many(self, events: list[Event]) -> None:
        """Queue a batch of events without waiting (:meth:`offer`, one deque extend)."""
        if self._stopping:
            self._dropped += len(events)
            return
        queue = self._queue
        queue.extend(events)
        self._offered += len(events)
        excess = len(queue) - self._capacity
        while excess > 0:  # the oldest go first, as with one event at a time
            try:
                queue.popleft()
                self._dropped += 1
            except IndexError:  # the worker emptied it meanwhile
                break
            excess -= 1
        if not self._wake.is_set():
            self._wake.set()

    # -- worker thread -------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._drain()
            if self._stopping and not self._queue:
                break
            if self._flush_waiters == 0 and not self._stopping and self._min_interval_s > 0:
                # Batch bursts: TensorRT can make thousands of callbacks a second, and each
                # wake-up of this thread competes with them for the GIL.
                self._hurry.wait(self._min_interval_s)
                self._hurry.clear()
        self._close_follower()

    def _drain(self) -> None:
        queue = self._queue
        # What is queued now, taken from the left in C (the producer appends on the right
        # meanwhile; an event is never None, so the sentinel never ends it early).
        batch: list[Event] = list(islice(iter(queue.popleft, None), len(queue)))
        if not batch:
            return
        try:
            self.follower.handle(batch)
        except Exception as error:  # isolate the follower: report once, count, carry on
            self._failed_events += len(batch)
            self._record_error(error)
        with self._progress:
            self._handled += len(batch)
            self._progress.notify_all()

    def _record_error(self, error: BaseException) -> None:
        self._errors += 1
        self._last_error = f"{type(error).__name__}: {error}"
        if self._errors == 1:
            _logger.warning(
                "trt-otel %s failed (%s); the build goes on, further errors are only counted",
                self.follower.name,
                self._last_error,
            )

    def _close_follower(self) -> None:
        try:
            self.follower.close()
        except Exception as error:
            self._record_error(error)
        with self._progress:
            self._closed = True
            self._progress.notify_all()

    # -- control -------------------------------------------------------------------------------

    def flush(self, timeout_s: float) -> bool:
        """Wait until every event offered so far was handled or dropped; False on timeout."""
        target = self._offered
        with self._progress:
            self._flush_waiters += 1
        try:
            self._hurry.set()
            self._wake.set()
            with self._progress:
                return self._progress.wait_for(
                    lambda: self._closed or self._handled + self._dropped >= target,
                    timeout=timeout_s,
                )
        finally:
            with self._progress:
                self._flush_waiters -= 1

    def shutdown(self, timeout_s: float) -> bool:
        """Handle what is queued, close the follower and stop the thread; False if it did not
        finish in time (a hung follower is abandoned: its thread is a daemon)."""
        self._stopping = True
        self._hurry.set()
        self._wake.set()
        if self._thread.is_alive() or not self._closed:
            self._thread.join(timeout_s)
        return self._closed

    @property
    def queued(self) -> int:
        """Events waiting in this follower's queue (cheaper than :meth:`health`)."""
        return len(self._queue)

    @property
    def handled(self) -> int:
        """Events this follower has handled so far."""
        return self._handled

    def health(self) -> FollowerHealth:
        return FollowerHealth(
            name=self.follower.name,
            handled=self._handled,
            dropped=self._dropped,
            errors=self._errors,
            queued=len(self._queue),
            last_error=self._last_error,
            failed_events=self._failed_events,
        )
