"""Ctrl-C while native extensions initialise: a KeyboardInterrupt raised inside a pybind11
module's initialisation (onnx's, TensorRT's) crashes the interpreter with SIGSEGV, so it is held
until the import is over, then delivered to the handler there was before."""

from __future__ import annotations

import os
import signal
from types import FrameType

import pytest

from trt_otel.core.startup import native_import


def test_a_ctrl_c_inside_is_held_and_raised_once_it_is_over() -> None:
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own
    try:
        held_then_raised()
    finally:
        signal.signal(signal.SIGINT, previous)


def held_then_raised() -> None:
    reached_the_end = False
    # Python's own handler was in place: the held Ctrl-C raises on the way out.
    with pytest.raises(KeyboardInterrupt), native_import():
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the main thread, here
        reached_the_end = True
    assert reached_the_end, "the interrupt was raised inside the import"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handler_there_was_before_gets_the_held_ctrl_c() -> None:
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with native_import():
            os.kill(os.getpid(), signal.SIGINT)
            assert seen == []
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_a_ctrl_c_nothing_is_delivered() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with native_import():
            pass
        assert seen == []
    finally:
        signal.signal(signal.SIGINT, previous)
