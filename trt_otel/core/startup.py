"""Ctrl-C while the ``trt-otel`` command starts: one line and exit 130, never a traceback.

The package's ``__init__`` answers Ctrl-C with a handler of its own from its first lines when the
process is the command (not a program or a test that imports ``trt_otel``), since the command's
modules take a moment to import and Python's own handler would end it with a traceback through
whatever was loading. Once the command's imports are done, :func:`startup_done` puts Python's
handler back, and the command's own handling takes over.
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


def startup_done() -> None:
    """The command's imports are done: Python's own handler back, if the guard was in place."""
    handler = signal.getsignal(signal.SIGINT)
    if (getattr(handler, "__module__", None), getattr(handler, "__qualname__", None)) == (
        STARTUP_GUARD
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
