"""What the tests on TensorRT-RTX's real builder share: the module (or a skip saying why there
is none), generated models, a real build held inside its silent step, and an independent plain
monitor to compare trt-otel's record with.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trt_otel import read_journal
from trt_otel.builder.onnx_models import conv_net_bytes, residual_net_bytes
from trt_otel.core.events import (
    BuildFinished,
    Event,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from waiting import wait_for_text

SILENT_BLOCKS = 600
"""Residual blocks of the silent-window tests' model: a few seconds inside one step of
"Determining refit engines" (1,500 blocks give ~20-30 s)."""

HELD_BLOCKS = 300
"""Residual blocks of a model whose build a test holds in its silent step
(:func:`held_in_silent_step`): the step lasts about 2.5 s on a quiet machine (a 600-block
build: 8 s of CPU, 5 s of it silent), some twenty times what the hold takes to land."""

SILENT_PHASE = "Determining refit engines"
"""The phase of TensorRT-RTX's silent window: one step of it holds most of a deep model's build,
without a callback."""

Callback = tuple[Any, ...]


def import_rtx() -> Any:
    """``tensorrt_rtx``, or a skip that says why it is missing (the only reason to skip)."""
    try:
        return importlib.import_module("tensorrt_rtx")
    except ImportError as error:
        pytest.skip(
            f"TensorRT-RTX does not import here ({error}); it installs with the dev extra on "
            f"Linux and Windows x86-64 (this is {platform.system()} {platform.machine()})"
        )


def shapes(text: str) -> tuple[tuple[int, ...], ...]:
    """``input:MIN,OPT,MAX`` to the three shapes."""
    return tuple(tuple(int(d) for d in s.split("x")) for s in text.split(":")[1].split(","))


def write_conv(path: Path, layers: int = 8) -> Path:
    path.write_bytes(conv_net_bytes(layers))
    return path


def write_residual(path: Path, blocks: int = SILENT_BLOCKS) -> Path:
    path.write_bytes(residual_net_bytes(blocks))
    return path


@contextlib.contextmanager
def held_in_silent_step(journal: Path, timeout_s: float = 120) -> Iterator[int]:
    """The real build writing ``journal``, held inside TensorRT-RTX's silent step for as long as
    the block lasts: its builder's process stopped (SIGSTOP) once the journal shows the silent
    phase begun, continued (SIGCONT) at the end. Yields the builder's pid.

    A builder inside that step makes no callback whether it computes or is stopped, and
    trt-otel keeps watching it either way (its sampler says ``stopped``). Held, the window lasts
    as long as the test needs to look at it, whatever the machine's load, and costs no core:
    a test whose window was the builder's own work needed a model 4 to 10 times as large, that
    burned a core for 20 s and more, and still ran short on a loaded machine."""
    wait_for_text(journal, f'"name":"{SILENT_PHASE}"'.encode(), timeout_s)
    events = read_journal(journal).events
    samples = [e for e in events if isinstance(e, ProcessSample)]
    assert samples, f"{journal}: the builder's process was never sampled"
    pid = samples[0].pid
    ended = f"{journal}: the build ended before it was held"
    # A build that has ended may have left its pid to another process: never stop that one.
    assert not any(isinstance(e, BuildFinished) for e in events), ended
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        raise AssertionError(ended) from None
    try:
        wait_for_text(journal, b'"status":"stopped"')  # trt-otel saw its builder stopped
        events = read_journal(journal).events
        assert any(isinstance(e, ProcessSample) and e.status == "stopped" for e in events)
        stepped = [e for e in events if isinstance(e, StepCompleted) and e.name == SILENT_PHASE]
        assert not stepped, "the silent step ended before the builder was held"
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@dataclass
class PlainBuild:
    """A build of a model with nothing of trt-otel's in it: TensorRT-RTX's own classes and a
    bare ``IProgressMonitor`` that lists its callbacks."""

    callbacks: list[Callback] = field(default_factory=list)
    engine: bytes | None = None


def configured_build(
    trt: Any, logger: Any, model: bytes, shape_text: str, profiles: int
) -> tuple[Any, Any, Any]:
    """A builder, the parsed network and a config with ``profiles`` optimization profiles of
    ``shape_text``, through the builder library's own API (the real one or the simulator)."""
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    assert trt.OnnxParser(network, logger).parse(model, "model.onnx")
    config = builder.create_builder_config()
    for _ in range(profiles):
        profile = builder.create_optimization_profile()
        profile.set_shape("input", *shapes(shape_text))
        config.add_optimization_profile(profile)
    return builder, network, config


def plain_build(rtx: Any, model: bytes, shape_text: str, profiles: int = 1) -> PlainBuild:
    result = PlainBuild()

    class Plain(rtx.IProgressMonitor):  # type: ignore[misc]
        def __init__(self) -> None:
            rtx.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            result.callbacks.append(("phase_start", phase_name, parent_phase, num_steps))

        def step_complete(self, phase_name: str, step: int) -> bool:
            result.callbacks.append(("step_complete", phase_name, step))
            return True

        def phase_finish(self, phase_name: str) -> None:
            result.callbacks.append(("phase_finish", phase_name))

    builder, network, config = configured_build(
        rtx, rtx.Logger(rtx.Logger.ERROR), model, shape_text, profiles
    )
    monitor = Plain()
    config.progress_monitor = monitor
    engine = builder.build_serialized_network(network, config)
    result.engine = None if engine is None else memoryview(engine).tobytes()
    return result


def callbacks_of(events: list[Event]) -> list[Callback]:
    """The callbacks a trt-otel record holds, in the plain monitor's form."""
    calls: list[Callback] = []
    for event in events:
        if isinstance(event, PhaseStarted):
            calls.append(("phase_start", event.name, event.parent, event.num_steps))
        elif isinstance(event, StepCompleted):
            calls.append(("step_complete", event.name, event.step))
        elif isinstance(event, PhaseFinished):
            calls.append(("phase_finish", event.name))
    return calls
