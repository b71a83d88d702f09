"""Signal handlers held for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

Handler = Callable[[int, FrameType | None], None]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, and the requests to stop: SIGTERM, and SIGHUP (a terminal or SSH session that went
away, a service manager's reload), which would otherwise kill the build at once, with no end
in its journal. A handler treats SIGHUP as SIGTERM."""


@contextlib.contextmanager
def handling_interrupts(handler: Handler) -> Iterator[None]:
    """``handler`` takes SIGINT, SIGTERM and SIGHUP until the block ends; then the handlers
    that were there before are put back, however it ends."""
    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
