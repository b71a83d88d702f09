"""What reaches the operator's terminal: text made safe to show, and a stream that a closed pipe
cannot break.

- :func:`printable` escapes control characters (ESC, newlines, ...) in text that came from
  outside (a cancel reason from the HTTP view or a cancel URL), so it cannot move the cursor,
  recolour or clear the screen, or forge lines. The journal keeps such text verbatim.
- :func:`say` and :func:`warn` are trt-otel's one way to speak to the operator: a whole line on
  stderr in one write (so it stays whole among a program's own lines on the same stream), with
  its control characters escaped: what they say often holds a path, a URL or an answer from
  outside (``journal: PATH``, a cancel URL's error), and a line is one line.
- :class:`PipeSafeStream` wraps stderr: when its reader goes away (``trt-otel demo 2>&1 | head``)
  the first failed write turns every later one into nothing, so the build's outcome, exit code
  and cleanup are those of a build with a terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any, TextIO


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\n``)."""
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() or unicodedata.category(char) == "Zs" else repr(char)[1:-1]
        for char in text
    )


MAX_SAID_CHARS = 4_096
"""The longest line said to the operator: longer ones (a phase name from a crafted journal) are
cut, saying by how much."""


def say(message: str, *, tagged: bool = False) -> None:
    """One line for the operator on stderr; ``tagged``: prefixed ``trt-otel:``, where it stands
    among another program's output (``trt-otel run``). Control characters in ``message`` are
    escaped (:func:`printable`)."""
    if len(message) > MAX_SAID_CHARS:  # a crafted name must not flood the terminal or the log
        cut = len(message) - MAX_SAID_CHARS
        message = f"{message[:MAX_SAID_CHARS]}… ({cut:,} more characters)"
    line = printable(message)
    sys.stderr.write(f"trt-otel: {line}\n" if tagged else f"{line}\n")
    sys.stderr.flush()


_WARNING_LISTENERS: tuple[Callable[[str], None], ...] = ()
"""Who else hears trt-otel's warnings (the OTLP log export): a tuple replaced, never changed,
so :func:`warn` reads it without a lock."""


def warn(message: str) -> None:
    """A warning line: something did not work, and the build goes on. The listeners of
    :func:`warnings_heard_by` hear it too; one that fails is ignored."""
    say(f"warning: {message}", tagged=True)
    for listener in _WARNING_LISTENERS:
        with contextlib.suppress(Exception):
            listener(message)


@contextlib.contextmanager
def warnings_heard_by(listener: Callable[[str], None]) -> Iterator[None]:
    """``listener`` is told each warning, for the duration (from any thread)."""
    global _WARNING_LISTENERS  # noqa: PLW0603 - replaced whole: readers need no lock
    _WARNING_LISTENERS = (*_WARNING_LISTENERS, listener)
    try:
        yield
    finally:
        _WARNING_LISTENERS = tuple(x for x in _WARNING_LISTENERS if x is not listener)


class PipeSafeStream:
    """A text stream whose writes never raise BrokenPipeError: after the first, it writes to
    ``os.devnull`` (also at the descriptor, so the interpreter's last flush is quiet too)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._break()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._break()

    def _break(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def pipe_safe_stderr() -> Iterator[PipeSafeStream]:
    """``sys.stderr`` made pipe-safe for the duration."""
    previous = sys.stderr
    safe = previous if isinstance(previous, PipeSafeStream) else PipeSafeStream(previous)
    sys.stderr = safe
    try:
        yield safe
    finally:
        sys.stderr = previous
