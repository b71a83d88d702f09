"""Signal handlers held for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType

Handler = Callable[[int, FrameType | None], None]


@contextlib.contextmanager
def handling_interrupts(handler: Handler) -> Iterator[None]:
    """``handler`` takes SIGINT and SIGTERM until the block ends; then the handlers that were
    there before are put back, however it ends."""
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
