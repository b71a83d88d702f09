"""Ctrl-C while the ``trt-otel`` command starts: one line and exit 130, never a traceback.

The package's ``__init__`` answers Ctrl-C with a handler of its own from its first lines when the
process is the command (not a program or a test that imports ``trt_otel``), since the command's
modules take a moment to import and Python's own handler would end it with a traceback through
whatever was loading. Once the command's imports are done, :func:`startup_done` puts a handler
that raises ``KeyboardInterrupt`` as Python's does in its place, and the command's own handling
takes over.

That handler also remembers the Ctrl-C, because a ``KeyboardInterrupt`` can be lost: raised while
Python runs code whose exceptions it only prints (a weakref callback, such as the one that lets
an import's module lock go as a module finishes importing, or a ``__del__``), it never reaches
the command, which would build on as if no Ctrl-C had come (seen about once in 700 Ctrl-Cs at
random moments of a demo's start). A build's own handling takes the remembered one as it takes
over (:func:`take_lost_interrupt`), as if it had come then; a command with no build to stop ends
its work, then exits as interrupted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

STARTUP_GUARD = ("trt_otel", "_interrupted_starting")
"""The guard's module and name: how it is told from a handler someone else chose."""


class _Interrupts:
    """Whether :func:`_interrupt` raised a ``KeyboardInterrupt`` no build's handling has taken
    yet. Set by a signal handler (on the main thread, between two bytecodes): no lock."""

    raised = False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C once the command has started: a ``KeyboardInterrupt``, as Python's own handler
    raises, remembered in case Python drops it (see the module's docstring)."""
    _Interrupts.raised = True
    raise KeyboardInterrupt


def startup_done() -> None:
    """The command's imports are done: a ``KeyboardInterrupt`` for Ctrl-C from here on (as
    Python's own handler raises, remembered), if the guard was in place."""
    handler = signal.getsignal(signal.SIGINT)
    if (getattr(handler, "__module__", None), getattr(handler, "__qualname__", None)) == (
        STARTUP_GUARD
    ):
        signal.signal(signal.SIGINT, _interrupt)


def take_lost_interrupt() -> bool:
    """Whether a Ctrl-C came since the command started that nothing acted on, forgetting it.
    Asked where a build's own handling takes over: a ``KeyboardInterrupt`` that reached the
    command would have ended it before then, so one still remembered there was lost."""
    raised, _Interrupts.raised = _Interrupts.raised, False
    return raised


@contextlib.contextmanager
def native_import() -> Iterator[None]:
    """Ctrl-C held while native extensions initialise (onnx's, TensorRT's, numpy's), and
    delivered to whoever handled it before once they have: a KeyboardInterrupt raised inside a
    pybind11 module's initialisation crashes the interpreter (SIGSEGV) instead of unwinding.
    Only the main thread handles signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[FrameType | None] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(frame)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            _deliver(previous, received[0])


def _deliver(handler: object, frame: FrameType | None) -> None:
    """The held Ctrl-C, as ``handler`` would have taken it."""
    if callable(handler):
        handler(signal.SIGINT, frame)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signal.SIGINT)
