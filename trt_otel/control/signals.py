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


TIME_LIMIT_SIGNAL = signal.SIGUSR1
"""A scheduler's warning that the job's time is nearly up (SLURM's ``--signal=USR1@N``, or
``B:USR1@N`` to the batch shell alone): a build stops gracefully, as a timeout. Left to its
default action it would kill the build with no end in its journal."""


@contextlib.contextmanager
def handling_interrupts(
    handler: Handler, signals: tuple[signal.Signals, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """``handler`` takes ``signals`` (SIGINT, SIGTERM and SIGHUP) until the block ends; then the
    handlers that were there before are put back, however it ends."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
