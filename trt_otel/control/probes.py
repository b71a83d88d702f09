"""The policies that ask the world outside the build: a cancel file, a cancel URL.

Asking may block (a FIFO, a hung network mount, a server that drips its answer), so each asks on
a thread of its own (:class:`Polled`), and the runner only reads its latest answer: a probe that
hangs delays no other policy, and is said to be stuck. What comes back is untrusted: a file is
checked for what it is before it is opened and read bounded, an answer's body is bounded, and a
reason is its first line, cut.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
import time
from pathlib import Path

from trt_otel.control.policies import MAX_REASON, BuildView, Decision, Policy, PolicyHealth
from trt_otel.control.registry import (
    CancelFileConfig,
    CancelUrlConfig,
    PolicyContext,
    required,
)
from trt_otel.core.durations import format_duration
from trt_otel.core.events import CancelSource
from trt_otel.core.urls import shown

MAX_FLAG_BODY = 64 * 1024
"""Bytes read from a cancel URL's answer; a longer answer is an error, not a flag."""


class Polled(Policy):
    """A policy that asks the outside world (a file, a URL), on a thread of its own.

    :meth:`probe` may block: a FIFO, a hung network mount, a server that drips its answer. So it
    runs every ``interval_s`` on this policy's own thread, and :meth:`check` only reads the
    latest answer from memory: a probe that blocks delays no other policy. A probe that has not
    answered ``stuck_after_s`` after it began is an error (counted, and reported by the runner
    as a stuck policy), once per ``stuck_after_s`` it stays stuck; ``failures_to_close`` errors
    in a row decide (fail-closed) when the policy is built so.
    """

    stuck_hint = ""
    """What a stuck probe is most likely waiting for, for the message."""

    def __init__(
        self,
        *,
        interval_s: float,
        stuck_after_s: float,
        fail_closed: bool = False,
        failures_to_close: int = 3,
    ) -> None:
        self.interval_s = interval_s
        self.stuck_after_s = stuck_after_s
        self.fail_closed = fail_closed
        self.failures_to_close = failures_to_close
        self.polls = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self._answer: Decision | None = None
        self._lock = threading.Lock()
        self._probe_began: float | None = None
        self._overruns_counted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"trt-otel-policy-{self.source}", daemon=True
        )

    def probe(self) -> Decision | None:
        """Ask the outside world once (may block; raise for an error)."""
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # Never joined: a probe stuck in a system call cannot be interrupted, and its daemon
        # thread must not hold up the end of the build.
        self._stop.set()

    def check(self, view: BuildView) -> Decision | None:
        self._count_overrun()
        with self._lock:
            answer, errors = self._answer, self.consecutive_errors
        if answer is not None:
            return answer
        if self.fail_closed and errors >= self.failures_to_close:
            return Decision(
                f"{self.describe()} failed {errors} times in a row ({self.last_error}); "
                "failing closed",
                self.source,
            )
        return None

    def stuck_for_s(self) -> float | None:
        """How long the probe under way has been running, once that is past its limit."""
        began = self._probe_began
        if began is None:
            return None
        elapsed = time.monotonic() - began
        return elapsed if elapsed >= self.stuck_after_s else None

    def poll_once(self) -> None:
        """One probe, on the calling thread; updates the answer or the error counts."""
        with self._lock:
            self.polls += 1
            self._probe_began = time.monotonic()
            self._overruns_counted = 0
        try:
            answer = self.probe()
        except Exception as error:  # the probe's errors are this policy's to count
            self._finish_probe(None, _error_text(error))
        else:
            self._finish_probe(answer, None)

    def _finish_probe(self, answer: Decision | None, error: str | None) -> None:
        with self._lock:
            overran = self._overruns_counted > 0
            self._probe_began = None
            if error is None:
                self.consecutive_errors = 0
                self._answer = answer
            elif not overran:  # an overrun already counted this probe's failure
                self._failed_locked(error)

    def _count_overrun(self) -> None:
        stuck_s = self.stuck_for_s()
        if stuck_s is None:
            return
        with self._lock:
            due = int(stuck_s // self.stuck_after_s)
            if self._probe_began is None or due <= self._overruns_counted:
                return
            self._overruns_counted = due
            hint = f" ({self.stuck_hint})" if self.stuck_hint else ""
            self._failed_locked(f"no answer for {format_duration(stuck_s)}{hint}")

    def _failed_locked(self, error: str) -> None:
        self.errors += 1
        self.consecutive_errors += 1
        self.last_error = error

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def health(self) -> PolicyHealth:
        self._count_overrun()
        return PolicyHealth(
            self.describe(), self.source, self.errors, self.last_error, self.stuck_for_s()
        )


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


class CancelFile(Polled):
    """Stop the build when ``path`` exists. Its first line, if any, is the reason.

    Existence is the signal, so the path is only ``stat``-ed; the reason is read without
    blocking, and only from a regular file (a FIFO or a device at the path is a signal with no
    reason). A hung mount blocks the ``stat`` on this policy's own thread: it is reported as
    stuck, and the other policies keep deciding.
    """

    source = CancelSource.FILE

    def __init__(
        self, path: str | Path, *, interval_s: float = 0.1, stuck_after_s: float = 2.0
    ) -> None:
        self.path = Path(path)
        self.stuck_hint = f"is {self.path} on a hung mount?"
        super().__init__(interval_s=interval_s, stuck_after_s=stuck_after_s)

    def describe(self) -> str:
        return f"file({self.path})"

    def probe(self) -> Decision | None:
        try:
            os.lstat(self.path)  # any entry is the signal: a dangling link or a loop too
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            info = os.stat(self.path)
        except OSError as error:
            what = "a symlink loop" if error.errno == errno.ELOOP else "a dangling symlink"
            return Decision(f"cancel file {self.path} appeared ({what})", self.source)
        reason = read_reason(self.path) if stat.S_ISREG(info.st_mode) else ""
        return Decision(reason or f"cancel file {self.path} appeared", self.source)


def read_reason(path: Path) -> str:
    """The first line of the regular file at ``path``, read without blocking ('' if none)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return ""  # it exists (unreadable, or gone again): the signal holds, with no reason
    try:
        # The path may have been swapped for a FIFO since the stat: read only a regular file.
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return ""
        first = os.read(descriptor, 4 * MAX_REASON).split(b"\n", 1)[0]
    except OSError:
        return ""
    finally:
        os.close(descriptor)
    return first.decode("utf-8", "replace").strip()[:MAX_REASON]


class FlagError(ValueError):
    """A cancel URL's answer that is not a flag."""


def parse_flag(status: int, body: bytes) -> tuple[bool, str | None]:
    """Read a cancel URL's answer: ``(cancel, reason)``. Raises FlagError for anything else.

    The answer format (documented in the README):

    - ``204 No Content``: keep building;
    - ``200`` with a JSON object ``{"cancel": true|false, "reason": "..."}`` (reason optional),
      a JSON ``true``/``false``, or the plain text ``true``/``false``/``1``/``0``/``yes``/``no``
      (case and surrounding whitespace ignored);
    - anything else (another status, a body over 64 KiB, other text) is an error.
    """
    if status == 204:
        return False, None
    if status != 200:
        raise FlagError(f"HTTP status {status}")
    if len(body) > MAX_FLAG_BODY:
        raise FlagError(f"an answer over {MAX_FLAG_BODY // 1024} KiB")
    text = body.decode("utf-8", "replace").strip()
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() in words:
        return words[text.lower()], None
    try:
        value = json.loads(text)
    except ValueError:
        raise FlagError(f"not a flag: {text[:60]!r}") from None
    if isinstance(value, bool):
        return value, None
    if isinstance(value, dict) and isinstance(value.get("cancel"), bool):
        reason = value.get("reason")
        return value["cancel"], str(reason)[:MAX_REASON] if reason else None
    raise FlagError(f"not a flag: {text[:60]!r}")


class CancelUrl(Polled):
    """Stop the build when a URL says so, polled every ``interval_s`` on a thread of its own.

    One poll (connect, headers and body together) gets ``request_timeout_s`` at most: a server
    that answers slowly, or drips its answer byte by byte, is an error like an unreachable one.
    Errors are counted and shown, and by default mean "keep building" (fail-open): a flaky flag
    server should not kill hours of work. With ``fail_closed``, ``failures_to_close`` errors in
    a row stop the build.
    """

    source = CancelSource.HTTP
    stuck_hint = "a name lookup or a connection that hangs?"

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 5.0,
        request_timeout_s: float = 2.0,
        fail_closed: bool = False,
        failures_to_close: int = 3,
    ) -> None:
        self.url = url
        self.request_timeout_s = min(request_timeout_s, max(interval_s, 0.1))
        super().__init__(
            interval_s=interval_s,
            # The poll gives up at its own deadline; this only catches what no socket timeout
            # covers (a name lookup that hangs), a little later.
            stuck_after_s=self.request_timeout_s + 0.5,
            fail_closed=fail_closed,
            failures_to_close=failures_to_close,
        )

    def describe(self) -> str:
        mode = ", fail-closed" if self.fail_closed else ""
        return f"url({shown(self.url)}{mode})"

    def probe(self) -> Decision | None:
        import http.client

        try:
            status, body = fetch(self.url, self.request_timeout_s, MAX_FLAG_BODY + 1)
        except http.client.HTTPException as error:
            if isinstance(error, ConnectionError):  # went away: no text of the server's
                raise
            # Its text is the server's (a status line up to 64 KiB, ESC and all): quoted and
            # cut, as an answer that is no flag is.
            raise FlagError(f"not an HTTP answer: {str(error)[:60]!r}") from None
        cancel, reason = parse_flag(status, body)
        return (
            Decision(reason or f"cancel URL {shown(self.url)} said so", self.source)
            if cancel
            else None
        )


def fetch(url: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
    """``GET url``: its status and at most ``max_bytes`` of its body, all within ``timeout_s``
    (connect, TLS, headers and body: :mod:`~trt_otel.core.outbound`), straight to the server
    (no proxy). A redirect is not followed: it is a :class:`FlagError` naming its target.
    """
    import urllib.request

    from trt_otel.core import outbound  # with --cancel-url alone: http.client, ssl, email
    from trt_otel.core.deadlines import Deadline

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with Deadline(timeout_s) as deadline:
        answer = outbound.call(request, deadline, max_bytes=max_bytes, proxies=False)
    redirect = answer.redirect()
    if redirect is not None:
        raise FlagError(
            f"HTTP status {redirect}: a cancel URL is not redirected; give the URL it names"
        )
    return answer.status, answer.body


def make_cancel_file(config: CancelFileConfig, context: PolicyContext) -> Policy:
    return CancelFile(required(config.cancel_file))


def make_cancel_url(config: CancelUrlConfig, context: PolicyContext) -> Policy:
    return CancelUrl(
        required(config.cancel_url),
        interval_s=config.cancel_url_interval_s,
        fail_closed=config.cancel_url_fail_closed,
    )
