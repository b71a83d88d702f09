"""A deadline for one outbound call: connect, headers and body together, however a peer answers.

A socket's timeout bounds each read, not the call: a peer that sends a byte every half second (a
Pushgateway, a collector or a proxy that drips its answer) holds a reader with a 5 s timeout for
as long as it drips. A :class:`Deadline` is a point in time (monotonic), the time left before it
(what a connect or a lookup of the call is given at most), and the sockets of the call it
guards: when the deadline passes, one watchman thread shuts them down, which ends whatever read,
write or TLS handshake is blocked on them, in whichever library. The call then fails with
:class:`DeadlineExceededError` (a ``TimeoutError``) saying how long it had.

Every call trt-otel makes to a peer is bounded by one: through :mod:`~trt_otel.core.outbound`
(http.client and urllib: the cancel URL, the Pushgateway, ``watch --url``, the fleet's calls)
or the OTLP exporters' HTTP session (:mod:`~trt_otel.views.otlp_http`), which finds the
deadline of the call it carries through :func:`current`. A library whose connections are out of
reach altogether (Ray's job client makes a session of its own for each request, with no timeout)
is called through :func:`call_within`, which stops waiting at the deadline. A name lookup is the
system resolver's, with its own timeouts.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar, cast

from trt_otel.core.durations import format_duration


class DeadlineExceededError(TimeoutError):
    """A call that did not complete before its deadline."""


class Deadline:
    """``timeout_s`` from now, for one call; a context manager that lets go of the call's
    sockets when it ends. Safe from any thread."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = max(timeout_s, 0.0)
        self.at = time.monotonic() + self.timeout_s
        self.expired = False
        """Set when the deadline passed with sockets guarded, and they were shut down: whatever
        the call read since may be cut short, so the call failed."""
        self._guarded: list[socket.socket] = []
        self._closed = False
        self._lock = threading.Lock()

    def left(self) -> float:
        """Seconds left before the deadline (0 once it passed)."""
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """Whether the deadline has passed, whoever noticed first: the watchman that shuts the
        call's sockets, or a read whose own timeout ran out at the same moment (before the
        watchman's thread had its turn)."""
        return self.expired or self.left() <= 0

    def check(self) -> float:
        """The seconds left; raises :class:`DeadlineExceededError` when there are none."""
        left = self.left()
        if left <= 0 or self.expired:
            raise self.exceeded()
        return left

    def exceeded(self) -> DeadlineExceededError:
        return DeadlineExceededError(f"no complete answer within {format_duration(self.timeout_s)}")

    def guard(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when the deadline passes (at once if it has). A duplicate of its
        descriptor is kept, so the guard holds when a library wraps the socket in TLS and lets
        go of the original: a shutdown acts on the connection, whichever descriptor names it."""
        try:
            duplicate = sock.dup()
        except OSError:
            return  # closed already: nothing to wait on
        with self._lock:
            if self._closed:
                duplicate.close()
                return
            self._guarded.append(duplicate)
        if self.left() <= 0:
            self._expire()
        else:
            _WATCHMAN.watch(self)

    def postpone(self, timeout_s: float) -> None:
        """The deadline is ``timeout_s`` from now (a stream that is alive as long as it sends
        something within that). A later time needs no word to the watchman, which looks again
        when it wakes at the earlier one."""
        earlier = self.at
        self.timeout_s = max(timeout_s, 0.0)
        self.at = time.monotonic() + self.timeout_s
        if self.at < earlier:
            _WATCHMAN.wake()

    def close(self) -> None:
        """The call ended: its sockets are no longer watched (harmless when called again)."""
        with self._lock:
            self._closed = True
            guarded, self._guarded = self._guarded, []
        for duplicate in guarded:
            duplicate.close()
        _WATCHMAN.forget(self)

    def _expire(self) -> None:
        """The watchman's: shut the call's sockets down."""
        with self._lock:
            if self._closed:
                return
            self.expired = True
            for duplicate in self._guarded:
                with contextlib.suppress(OSError):
                    duplicate.shutdown(socket.SHUT_RDWR)

    @contextlib.contextmanager
    def applied(self) -> Iterator[Deadline]:
        """This deadline is :func:`current` on this thread until the block ends: for a library
        that makes the call's connections out of reach of the caller (``requests``)."""
        stack = _current_stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.remove(self)

    def __enter__(self) -> Deadline:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


T = TypeVar("T")


def call_within(timeout_s: float, call: Callable[[], T], *, name: str) -> T:
    """``call()``'s result (or its exception), or :class:`DeadlineExceededError` once
    ``timeout_s`` has passed without one. The call runs on a daemon thread (``name``) that is
    left to end on its own when it overruns: its result is then dropped. For a library that
    gives no way to its sockets; the caller gets its answer on time, a stuck peer keeps only
    that thread."""
    done = threading.Event()
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:  # handed to the caller, whatever it is
            outcome.append((False, error))
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(max(timeout_s, 0.0)):
        raise DeadlineExceededError(f"no answer within {format_duration(timeout_s)}")
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return cast(T, value)


def current() -> Deadline | None:
    """The innermost deadline :meth:`Deadline.applied` on this thread, if any."""
    stack = _current_stack()
    return stack[-1] if stack else None


_LOCAL = threading.local()


def _current_stack() -> list[Deadline]:
    stack: list[Deadline] | None = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


class _Watchman:
    """One daemon thread that sleeps until the earliest deadline watched, and shuts the sockets
    of every deadline that has passed. It only ever waits: a call that ends in time costs it
    nothing but a wake-up."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._watched: set[Deadline] = set()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: Deadline) -> None:
        with self._condition:
            self._watched.add(deadline)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="trt-otel-deadlines", daemon=True
                )
                self._thread.start()
            self._condition.notify()

    def wake(self) -> None:
        with self._condition:
            self._condition.notify()

    def forget(self, deadline: Deadline) -> None:
        with self._condition:
            self._watched.discard(deadline)

    def _run(self) -> None:
        with self._condition:
            while True:
                now = time.monotonic()
                for deadline in [d for d in self._watched if d.at <= now]:
                    self._watched.discard(deadline)
                    deadline._expire()
                wait = min((d.at - now for d in self._watched), default=None)
                self._condition.wait(wait)

    def after_fork(self) -> None:
        """In a forked child: the parent's thread and lock are not this process's."""
        self._condition = threading.Condition()
        self._watched = set()
        self._thread = None


_WATCHMAN = _Watchman()
os.register_at_fork(after_in_child=_WATCHMAN.after_fork)
