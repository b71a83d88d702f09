"""The append-only event log: the single source of truth of a build.

One producer (:meth:`EventLog.append`, called by the build's monitor alone, which checks every
record against the protocol first) appends under one short lock, which assigns each event its
``seq`` and so fixes a single order; every event comes with the time and thread it was made at.
Inside that lock the log runs its *folds*: pure, O(1) projections such as
:class:`~trt_otel.core.state.BuildState` that must see every event before the next is appended.
Everything slow is a *follower*: it gets its own bounded queue and thread (see
:mod:`trt_otel.core.followers`), so a follower that raises or hangs costs the callback thread
nothing but a deque append.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.events import Event
from trt_otel.core.followers import Follower, FollowerWorker

_logger = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
Fold = Callable[[Event], None]

DEFAULT_RETAINED_EVENTS = 100_000

_names = threading.local()


def current_thread_name() -> str:
    """The calling thread's name, looked up once per thread (``current_thread()`` costs more
    than a callback can spare)."""
    try:
        name: str = _names.name
    except AttributeError:
        name = _names.name = threading.current_thread().name
    return name


class EventLog:
    """An ordered, thread-safe, append-only sequence of events.

    The newest ``retain`` events stay in memory (for followers that join late and for callers
    that want to look); the durable record is the journal follower. ``seq`` is contiguous from 0.
    """

    # Slots: read on every event (see BuildState's).
    __slots__ = (
        "_batch",
        "_consumers",
        "_folds",
        "_next_seq",
        "_recent",
        "_workers",
        "clock",
        "fold_errors",
        "lock",
    )

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK, retain: int = DEFAULT_RETAINED_EVENTS):
        self.clock = clock
        """The producer's clock (the log itself reads no time: every event comes stamped)."""
        self.lock = threading.Lock()
        """Held by :meth:`transaction`; the monitor's callbacks take it directly (a plain
        ``with`` costs less than a generator-based context manager on the hot path)."""
        self._next_seq = 0
        self._recent: deque[Event] = deque(maxlen=retain)
        # Copy-on-write tuples: the hot path iterates them without taking a second lock.
        self._folds: tuple[Fold, ...] = ()
        self._workers: tuple[FollowerWorker, ...] = ()
        self.fold_errors = 0
        self._consumers: tuple[Callable[[list[Event]], None], ...] = ()
        self._batch: list[Event] | None = None
        """While :meth:`batch` is open: the events appended so far, for the followers."""

    # -- producing -----------------------------------------------------------------------------

    def append(
        self,
        make: Callable[..., E],
        wall_ns: int,
        mono_ns: int,
        thread: str,
        /,
        *fields: Any,
        seq: int | None = None,
        **named: Any,
    ) -> E:
        """The log's one producer: number one event and record it, with the time and thread it
        was made at (data, never read here). ``make`` is an event class (or makes one):
        ``make(seq, wall_ns, mono_ns, thread, *fields, **named)``. The caller holds
        :attr:`lock`; :class:`~trt_otel.capture.monitor.BuildMonitor` is the only caller
        (``tests/test_layout.py``), which checks every callback against the protocol first.

        ``seq``: an event numbered by the log it was first recorded in (a build followed from
        elsewhere), which keeps it: it must not go back (a jump forward is events that log's
        reader lost, and this log continues from it).
        """
        if seq is not None:
            if seq < self._next_seq:
                raise ValueError(f"event seq {seq} goes back in the log, at {self._next_seq}")
            self._next_seq = seq
        if named:
            event = make(self._next_seq, wall_ns, mono_ns, thread, *fields, **named)
        else:  # a callback's event (most, by far): no keywords to pass on
            event = make(self._next_seq, wall_ns, mono_ns, thread, *fields)
        self._next_seq += 1
        # What follows is the log's publishing, written out here: it runs for every event of
        # a build, and a call more per event costs the supervisor a tenth of a second a
        # million events.
        self._recent.append(event)
        for fold in self._folds:
            try:
                fold(event)
            except Exception:
                self._failed("a projection failed on event %d", event.seq)
        batch = self._batch
        if batch is not None:
            batch.append(event)
            return event
        if self._consumers:
            self._consume([event])
        for worker in self._workers:
            worker.offer(event)
        return event

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Hold the log's lock so that a look at the folds and the appends that follow are one
        atomic step (the monitor checks the open phases, then records what it saw)."""
        with self.lock:
            yield

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the log's lock while many events are appended (a frame of callbacks made in a
        build's worker process): the folds see each event as it is appended, the followers get
        them all at once, with one queue operation each instead of one per event."""
        with self.lock:
            if self._batch is not None:  # already in one: it hands them over
                yield
                return
            batch: list[Event] = []
            self._batch = batch
            try:
                yield
            finally:
                self._batch = None
                if batch:
                    self._consume(batch)
                    for worker in self._workers:
                        worker.offer_many(batch)

    def _consume(self, batch: list[Event]) -> None:
        for consumer in self._consumers:
            try:
                consumer(batch)
            except Exception:
                self._failed("a consumer of the log's batches failed")

    def _failed(self, message: str, *arguments: object) -> None:
        """A fold, or what runs beside one, raised: our own code, whose bug must not reach
        TensorRT. Counted; the first is logged with its traceback."""
        self.fold_errors += 1
        if self.fold_errors == 1:
            _logger.exception(message, *arguments)

    # -- consuming -----------------------------------------------------------------------------

    def add_fold(self, fold: Fold, *, replay_retained: bool = True) -> None:
        """Register a synchronous fold. It runs under the log's lock on the appending thread, so
        it must be pure, O(1) and must not block. It first sees the retained events, unless
        ``replay_retained`` is False (a fold of one build in a log of several)."""
        with self.lock:
            if replay_retained:
                for event in self._recent:
                    fold(event)
            self._folds = (*self._folds, fold)

    def add_batch_consumer(self, consumer: Callable[[list[Event]], None]) -> None:
        """Hand ``consumer`` the events of each :meth:`batch` (an event appended alone, as a
        batch of one) once every fold has folded them, under the lock, on the appending
        thread, in the order the consumers were added. For work on a batch as a whole (a fold
        that tells its views at a batch's end) and for a consumer that only keeps the events
        (the HTTP view's feed, in a supervisor): where the events were just made it costs a
        fraction of what a follower's thread pays for them later, out of the cache. It must be
        quick and must not block; it sees no event appended before it was added."""
        with self.lock:
            self._consumers = (*self._consumers, consumer)

    def remove_fold(self, fold: Fold) -> None:
        """Stop running ``fold`` (a build's own fold, once that build has ended)."""
        with self.lock:
            self._folds = tuple(f for f in self._folds if f != fold)

    def follow(
        self,
        follower: Follower,
        *,
        capacity: int = 65_536,
        min_interval_s: float = 0.05,
        replay_retained: bool = True,
    ) -> FollowerWorker:
        """Feed ``follower`` every event from now on (and, by default, the retained ones first)
        on its own thread, through a bounded queue whose drops are counted."""
        worker = FollowerWorker(follower, capacity=capacity, min_interval_s=min_interval_s)
        with self.lock:
            if replay_retained:
                for event in self._recent:
                    worker.offer(event)
            self._workers = (*self._workers, worker)
        worker.start()
        return worker

    @property
    def workers(self) -> tuple[FollowerWorker, ...]:
        return self._workers

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next event will get (the number of events appended so far)."""
        return self._next_seq

    def recent(self, since: int = -1) -> list[Event]:
        """A copy of the retained events whose ``seq`` is above ``since``."""
        with self.lock:
            return [e for e in self._recent if e.seq > since]

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every follower has handled what was appended so far; True if all did."""
        return all(worker.flush(timeout_s) for worker in self._workers)

    def close(self, timeout_s: float = 5.0) -> bool:
        """Flush and shut every follower down (each within ``timeout_s``); True if all did.

        Calling it again is harmless.
        """
        with self.lock:
            workers, self._workers = self._workers, ()
        return all([worker.shutdown(timeout_s) for worker in workers])
