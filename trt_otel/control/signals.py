"""Signal handlers held for the length of a ``with`` block."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType

from trt_otel.control.defaults import STOP_RESERVE_S
from trt_otel.core.startup import take_lost_interrupt

Handler = Callable[[int, FrameType | None], None]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, and the requests to stop: SIGTERM, and SIGHUP (a terminal or SSH session that went
away, a service manager's reload), which would otherwise kill the build at once, with no end
in its journal. A handler treats SIGHUP as SIGTERM."""


TIME_LIMIT_SIGNAL = signal.SIGUSR1
"""A scheduler's warning that the job's time is nearly up (SLURM's ``--signal=USR1@N``, or
``B:USR1@N`` to the batch shell alone): a build stops gracefully, as a timeout. Left to its
default action it would kill the build with no end in its journal."""
TIME_LIMIT_REASON = "the job's time limit is near (SIGUSR1, the scheduler's warning)"
"""The cancel's reason on :data:`TIME_LIMIT_SIGNAL` (a timeout)."""


class StopClock:
    """When a signal asked the build to stop, and what is left of its stop budget
    (``--stop-budget``): what waits after the build (the HTTP view's and the scrape endpoint's
    lingers for a last reader) waits only as long as the budget allows, so that a scheduler's
    kill never lands while trt-otel is still winding down."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.asked_mono: float | None = None
        """``time.monotonic()`` when the first stop signal came (set by a handler: no lock)."""

    def asked(self) -> None:
        """A signal asked the build to stop, now (the first one counts)."""
        if self.asked_mono is None:
            self.asked_mono = time.monotonic()

    def allows(self, wanted_s: float) -> float:
        """``wanted_s`` of waiting, or what the stop budget leaves of it (less the reserve for
        ending the journal and the process): all of it where no signal asked for a stop."""
        if self.asked_mono is None:
            return wanted_s
        left_s = self.budget_s - (time.monotonic() - self.asked_mono) - STOP_RESERVE_S
        return max(0.0, min(wanted_s, left_s))


@contextlib.contextmanager
def handling_interrupts(
    handler: Handler, signals: tuple[signal.Signals, ...] = STOP_SIGNALS
) -> Iterator[None]:
    """``handler`` takes ``signals`` (SIGINT, SIGTERM and SIGHUP) until the block ends; then the
    handlers that were there before are put back, however it ends. A Ctrl-C that came before,
    since the command started, and was lost on its way (see :mod:`trt_otel.core.startup`) is
    handed to ``handler`` at once."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        if signal.SIGINT in signals and take_lost_interrupt():
            handler(signal.SIGINT, None)
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
