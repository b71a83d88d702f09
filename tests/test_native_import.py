"""Ctrl-C while native extensions initialise: a KeyboardInterrupt raised inside a pybind11
module's initialisation (onnx's, TensorRT's) crashes the interpreter with SIGSEGV, so it is held
until the import is over, then delivered to the handler there was before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


WATCH_NATIVE_IMPORTS = """
import importlib.machinery, signal, sys

outside = []


class Watch:
    # Told of every module imported for the first time, before it is loaded.
    def find_spec(self, name, path, target=None):
        handler = signal.getsignal(signal.SIGINT)
        if getattr(handler, "__qualname__", "") != "native_import.<locals>.hold":
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            origin = (spec.origin or "") if spec is not None else ""
            if "-packages" in origin and origin.endswith((".so", ".pyd")):
                outside.append(name)
        return None


sys.meta_path.insert(0, Watch())
from trt_otel.builder.onnx_models import (
    conv_net_bytes, demo_model_bytes, generate_demo_model_bytes, residual_net_bytes
)

demo_model_bytes(), generate_demo_model_bytes(), conv_net_bytes(), residual_net_bytes(2)
print(outside)
"""


@pytest.mark.e2e
def test_the_models_native_modules_are_all_imported_with_ctrl_c_held() -> None:
    """Each third-party native module the models' writers load (numpy's, numpy.random's that
    numpy imports only when it is first used, onnx's) is loaded inside :func:`native_import`:
    a Ctrl-C inside numpy.random's Cython initialisation was swallowed there, and the demo then
    built to its end as if none had come. In a fresh interpreter, where none is loaded yet."""
    done = subprocess.run(
        [sys.executable, "-c", WATCH_NATIVE_IMPORTS],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"loaded with Ctrl-C not held: {done.stdout}"


HELD_WHERE_PYTHONS_DEFAULT_WAS = """
import os, signal
signal.signal(signal.SIGINT, signal.SIG_DFL)
from trt_otel.core.startup import native_import
with native_import():
    os.kill(os.getpid(), signal.SIGINT)
    print("held", flush=True)
print("lost", flush=True)
"""


@pytest.mark.e2e
def test_a_ctrl_c_held_where_no_handler_was_set_ends_the_process_as_it_would_have() -> None:
    """Where the handler before was the system's default (SIG_DFL), the held Ctrl-C is sent
    again on the way out, and the process ends of it, as it would have without the hold."""
    done = subprocess.run(
        [sys.executable, "-c", HELD_WHERE_PYTHONS_DEFAULT_WAS],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == -signal.SIGINT, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "held\n"
