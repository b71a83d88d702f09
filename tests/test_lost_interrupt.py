"""A Ctrl-C the command's handler raised where Python drops exceptions (a weakref callback, as
an import lets its module lock go; a ``__del__``) is not lost: a build's own handling takes it
as it takes over, as if it had come then. Seen lost about once in 700 Ctrl-Cs at random moments
of a demo's start: the demo built on to its end and exited 0."""

from __future__ import annotations

import os
import signal
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

import trt_otel
from trt_otel.app.cli import main
from trt_otel.app.session import EXIT_INTERRUPTED
from trt_otel.control.signals import handling_interrupts
from trt_otel.core.startup import startup_done, take_lost_interrupt

DATA = Path(__file__).parent / "data"


@pytest.fixture
def command_handler() -> Iterator[None]:
    """SIGINT as the command has it once started: the start-up guard, then startup_done()."""
    previous = signal.signal(signal.SIGINT, trt_otel._interrupted_starting)
    take_lost_interrupt()  # none left over from elsewhere in this process
    try:
        startup_done()
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        take_lost_interrupt()


class Thing:
    """Something to be let go of."""


def ctrl_c_handled_here() -> None:
    """A real SIGINT to this process, its handler run in this code: between two of the
    bytecodes that follow."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000_000):
        pass


def ctrl_c_inside_a_weakref_callback(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """A real SIGINT to this process, handled while Python runs a weakref callback; what
    Python then dropped."""
    dropped: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: dropped.append(raised.exc_value))

    def callback(_: object) -> None:
        ctrl_c_handled_here()

    thing = Thing()
    watcher = weakref.ref(thing, callback)
    del thing  # the callback runs now, and the KeyboardInterrupt raised in it is dropped
    assert watcher() is None
    return dropped


def test_a_ctrl_c_python_dropped_is_taken_by_the_builds_handling_once(
    command_handler: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dropped = ctrl_c_inside_a_weakref_callback(monkeypatch)
    assert [type(error) for error in dropped] == [KeyboardInterrupt], "Python dropped it"
    taken: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        taken.append(signum)

    with handling_interrupts(handler, (signal.SIGINT,)):
        assert taken == [signal.SIGINT], "taken as the build's handling took over"
    with handling_interrupts(handler, (signal.SIGINT,)):
        pass
    assert taken == [signal.SIGINT], "and only once"


def test_without_a_ctrl_c_the_builds_handling_is_told_of_none(command_handler: None) -> None:
    taken: list[int] = []
    with handling_interrupts(lambda signum, frame: taken.append(signum), (signal.SIGINT,)):
        pass
    assert taken == []


def test_a_ctrl_c_that_reached_the_command_raises_as_pythons_handler_does(
    command_handler: None,
) -> None:
    with pytest.raises(KeyboardInterrupt):
        ctrl_c_handled_here()


def test_a_command_that_went_on_after_a_dropped_ctrl_c_still_exits_as_interrupted(
    command_handler: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """No build's handling to take it (a report): the command ends its work, then says it was
    interrupted, with the exit of a Ctrl-C."""
    ctrl_c_inside_a_weakref_callback(monkeypatch)
    page = tmp_path / "report.html"
    code = main(["report", str(DATA / "rtx-conv8-success.jsonl"), "-o", str(page)])
    assert (code, capsys.readouterr().err.strip().splitlines()[-1]) == (
        EXIT_INTERRUPTED,
        "trt-otel: interrupted",
    )
    assert page.exists()
    assert main(["report", str(DATA / "rtx-conv8-success.jsonl"), "-o", str(page)]) == 0
