"""``trt-otel watch``: follow a build running elsewhere, through its HTTP event stream or its
journal as it grows, with the same terminal view as the build's own.

Both sources yield the build's events in order; they are fed to the same console followers the
build uses, so the picture is the build's. A dropped connection is resumed from the last event
seen (``Last-Event-ID``), so nothing is missed nor shown twice.

``http.client`` (and the ssl and email modules it brings) is imported where a URL is followed:
the command line imports this module, and a build pays for every import before it starts.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trt_otel.capture.checked import CheckedEvents
from trt_otel.capture.liveness import DEFAULT_LOST_AFTER_S, Liveness
from trt_otel.core.attempts import Attempt, attempt_of
from trt_otel.core.deadlines import Deadline
from trt_otel.core.durations import format_duration
from trt_otel.core.events import BuildFinished, BuildStarted, Event
from trt_otel.core.files import open_regular_for_reading
from trt_otel.core.journal_codec import CorruptLineError, JournalError, decode_event
from trt_otel.core.journal_reader import MAX_HEADER_BYTES, JournalProblem, LineReader, parse_header
from trt_otel.core.urls import shown

if TYPE_CHECKING:
    import http.client

Sink = Callable[[Sequence[Event]], None]
Warn = Callable[[str], None]


class WatchError(Exception):
    """The build cannot be followed (unreachable, not a trt-otel endpoint, not a journal)."""


def events_url(url: str) -> str:
    """``http://host:port`` or ``.../events``: the event stream's URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - read for its check of the port
    except ValueError as error:  # "http://[::1": an unclosed IPv6 address, a bad port
        raise WatchError(f"{url!r} is not a valid URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise WatchError(f"{url!r} is not an http:// or https:// URL")
    path = parts.path.rstrip("/")
    if not path.endswith("/events"):
        path += "/events"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def follow_url(
    url: str,
    sink: Sink,
    *,
    warn: Warn,
    retry_for_s: float = 30.0,
    read_timeout_s: float = 60.0,
) -> BuildFinished | None:
    """Feed ``sink`` every event of the build at ``url`` until its end; returns the end (None
    when the stream closed for good without one). A server that does not answer within
    ``retry_for_s`` (one that accepts the connection and says nothing, or a byte at a time) is
    no connection: the build is lost after ``retry_for_s``, as with one that refuses."""
    import http.client

    target = events_url(url)
    last_seq = -1
    failing_since: float | None = None
    connected_once = False
    while True:
        try:
            for batch in _stream(target, last_seq, read_timeout_s, answer_within_s=retry_for_s):
                connected_once = True
                failing_since = None
                sink(batch)
                last_seq = batch[-1].seq
                if isinstance(batch[-1], BuildFinished):
                    return batch[-1]
            # The server ended the stream without the build's end: it is going away.
            if not connected_once:
                raise WatchError(f"{target} sent no events")
            failing_since = failing_since or time.monotonic()
        except (OSError, http.client.HTTPException) as error:
            if not connected_once:
                raise WatchError(f"cannot follow {target}: {error}") from None
            if failing_since is None:
                # Silent: lost since its last sign of life, not since the silence was noticed.
                failing_since = error.since if isinstance(error, _SilentError) else time.monotonic()
                warn(f"lost {target} ({error}); resuming after event {last_seq}")
        if time.monotonic() - failing_since > retry_for_s:
            return None
        time.sleep(0.5)


MAX_SSE_LINE = 1 << 20
"""The longest line of an event stream read (an event's JSON is far shorter)."""


class _SilentError(OSError):
    """A server that did not answer in time; ``since``: its last sign of life (monotonic)."""

    def __init__(self, message: str, since: float) -> None:
        super().__init__(message)
        self.since = since


def _silent(deadline: Deadline) -> _SilentError:
    """The error of a connection that was silent until its deadline: since its last sign of
    life (the deadline's start, postponed by each line)."""
    since = deadline.at - deadline.timeout_s
    said = format_duration(time.monotonic() - since)
    return _SilentError(f"no answer for {said} (it accepted the connection)", since)


def _stream(
    url: str, after_seq: int, read_timeout_s: float, *, answer_within_s: float
) -> Iterator[list[Event]]:
    """Batches of events from one connection to an SSE stream. The server has
    ``answer_within_s`` to accept the connection and send its answer's head, however slowly it
    trickles, then ``read_timeout_s`` for each line (it sends a keepalive every 15 s): one
    deadline (:mod:`~trt_otel.core.deadlines`), postponed by each line."""
    import http.client

    from trt_otel.core import outbound

    with Deadline(answer_within_s) as deadline:
        connection = outbound.connection(url, deadline)
        try:
            yield from _frames(connection, url, after_seq, read_timeout_s, deadline)
        except (OSError, http.client.HTTPException, WatchError):  # a head cut short: not its own
            # passed(), not expired: the socket's own timeout may run out before the watchman
            # has had its turn to shut it down.
            if deadline.passed():
                raise _silent(deadline) from None
            raise
        finally:
            connection.close()
        if deadline.expired:  # the shut-down connection read as the stream's end
            raise _silent(deadline)


def _frames(
    connection: http.client.HTTPConnection,
    url: str,
    after_seq: int,
    read_timeout_s: float,
    deadline: Deadline,
) -> Iterator[list[Event]]:
    """The answer to one request, as batches of events; each line is a sign of life."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = {"Accept": "text/event-stream"}
    if after_seq >= 0:
        headers["Last-Event-ID"] = str(after_seq)
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    if response.status != 200:
        raise WatchError(f"{shown(url)} answered HTTP {response.status}")
    if not response.getheader("Content-Type", "").startswith("text/event-stream"):
        raise WatchError(f"{shown(url)} is not an event stream")
    deadline.postpone(read_timeout_s)
    if connection.sock is not None:
        connection.sock.settimeout(read_timeout_s)
    data: list[str] = []
    while True:
        raw = response.readline(MAX_SSE_LINE)
        if not raw:
            break
        if len(raw) >= MAX_SSE_LINE and not raw.endswith(b"\n"):
            # Alive but not trt-otel's stream: its lines are one event's JSON each.
            raise WatchError(
                f"{shown(url)} sent a line over {MAX_SSE_LINE:,} bytes: not an event stream"
            )
        deadline.postpone(read_timeout_s)
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line:
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value.removeprefix(" "))
            continue
        # A blank line dispatches the frame (event lines only carry the type, also in data).
        if data:
            event = _event_from_frame("\n".join(data))
            data = []
            if event is not None and event.seq > after_seq:
                after_seq = event.seq
                yield [event]


def _event_from_frame(data: str) -> Event | None:
    """The event in an SSE frame's data; None for a notice (a gap) or a frame not understood."""
    try:
        return decode_event(data)
    except CorruptLineError:
        return None


class BuildLostError(WatchError):
    """The followed build's journal has no end, and its writer is gone (or silent too long)."""


def follow_journal(
    path: Path,
    sink: Sink,
    *,
    warn: Warn,
    poll_s: float = 0.2,
    lost_after_s: float = DEFAULT_LOST_AFTER_S,
    ending: threading.Event | None = None,
) -> BuildFinished | None:
    """Feed ``sink`` the events of the journal at ``path`` as it grows, until the build's end,
    as trt-otel takes them (:mod:`~trt_otel.capture.checked`).

    The end of a retry ladder's attempt that may have another after it (:mod:`attempts`) is not
    yet the end: the next attempt is followed in the same journal, and that end is returned once
    the writer goes away without starting one.

    A journal that stops growing is followed while its writer shows signs of life (a silent
    build is not a lost one); :class:`BuildLostError` says when it has none (:mod:`liveness`).
    Once ``ending`` is set, the caller has stopped the writer itself and appends the build's end
    in its place: a dead writer is then expected, and the end is awaited (for ``lost_after_s``).
    """
    try:
        # Closed below, kept open while it grows; only a regular file (a named pipe would block).
        handle = open_regular_for_reading(path, "journal")
    except OSError as error:
        raise JournalError(f"cannot read journal {str(path)!r}: {error.strerror}") from None
    with handle:
        first = _complete_line(handle, poll_s)
        header = parse_header(first, path)
        liveness = Liveness(path, header, lost_after_s)
        reader = LineReader()  # the reader replay uses, fed as the file grows
        checked = CheckedEvents(header)  # a C++ build's callbacks: through the one way in
        quiet_since = time.monotonic()
        noticed = False
        attempt: Attempt | None = None
        retried: BuildFinished | None = None
        """A ladder's attempt's end, while the next attempt may still start."""
        while True:
            chunk = handle.read(1 << 20)
            if not chunk:
                lost = liveness.lost()
                if lost is not None and retried is not None:
                    return retried  # the ladder ended without another attempt
                if lost is not None and ending is not None and ending.is_set():
                    if time.monotonic() - quiet_since > lost_after_s:
                        raise BuildLostError(f"{lost}, and no end was appended in its place")
                elif lost is not None:
                    raise BuildLostError(lost)
                if not noticed and time.monotonic() - quiet_since > lost_after_s:
                    noticed = True
                    warn(
                        f"{path}: no event for {format_duration(lost_after_s)}, but its writer "
                        "is alive (TensorRT is silent); still following"
                    )
                time.sleep(poll_s)
                continue
            liveness.grew()
            quiet_since, noticed = time.monotonic(), False
            batch: list[Event] = []
            for item in reader.feed(chunk):
                if isinstance(item, JournalProblem):
                    warn(f"{path}: {item}")
                else:
                    batch.append(item)
            batch = checked.feed(batch)
            if batch:
                sink(batch)
                for event in batch:
                    if isinstance(event, BuildStarted):
                        attempt, retried = attempt_of(event.attributes), None
                    elif isinstance(event, BuildFinished):
                        stopping = ending is not None and ending.is_set()
                        if attempt is None or attempt.number == attempt.of or stopping:
                            return event
                        retried = event


def _complete_line(handle: object, poll_s: float) -> bytes:
    """The journal's first line, waiting for a writer that has only just created the file."""
    read = handle.readline  # type: ignore[attr-defined]
    line: bytes = read(MAX_HEADER_BYTES)
    deadline = time.monotonic() + 10.0
    while not line.endswith(b"\n") and len(line) < MAX_HEADER_BYTES and time.monotonic() < deadline:
        time.sleep(poll_s)
        line += read(MAX_HEADER_BYTES - len(line))
    return line
