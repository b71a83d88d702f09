"""The live view and the plain lines make a real TensorRT-RTX silent window visible: that
TensorRT is silent, inside which phase, and for how long. Checked on a journal recorded from a
real build (``tests/data/``, no builder needed): its longest silence is the one step of
"Determining refit engines".
"""

from __future__ import annotations

import io
import itertools
import time
from pathlib import Path

from rich.console import Console

from trt_otel import read_journal
from trt_otel.core.events import Event, PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.console import PlainLines, render_build

DATA = Path(__file__).parent / "data"
SUCCESS = DATA / "rtx-residual400-success.jsonl"
SILENT_PHASE = "Determining refit engines"


def recorded(path: Path) -> list[Event]:
    journal = read_journal(path)
    assert not journal.problems
    return journal.events


def before_the_silence(events: list[Event]) -> list[Event]:
    """The events up to the longest time between two callbacks (read here, independently of
    the console): the build as it stood when TensorRT went silent."""
    callbacks = [
        (i, e) for i, e in enumerate(events)
        if isinstance(e, PhaseStarted | StepCompleted | PhaseFinished)
    ]  # fmt: skip
    gap_s, index = max(
        ((b.mono_ns - a.mono_ns) / 1e9, j) for (_, a), (j, b) in itertools.pairwise(callbacks)
    )
    ended_by = events[index]
    assert isinstance(ended_by, StepCompleted) and ended_by.name == SILENT_PHASE
    assert gap_s > 1.0, "the recorded build has a real silent window"
    return events[:index]


def test_the_live_view_says_the_real_silent_step_and_how_long() -> None:
    model = ReadModel()
    model.handle(before_the_silence(recorded(SUCCESS)))

    def header(silent_s: float) -> str:
        console = Console(file=io.StringIO(), width=200, color_system=None)
        console.print(render_build(model, silent_s=silent_s))
        return console.file.getvalue().splitlines()[0]  # type: ignore[attr-defined, no-any-return]

    assert header(42).endswith(f"silent for 42.0s in {SILENT_PHASE}")
    assert "silent" not in header(1)


def test_plain_lines_keep_a_heartbeat_through_the_real_silent_step() -> None:
    model, stream = ReadModel(), io.StringIO()
    lines = PlainLines(model, stream, heartbeat_s=0.2)
    model.subscribe(lines)
    model.handle(before_the_silence(recorded(SUCCESS)))
    deadline = time.monotonic() + 10
    while "… silent for" not in stream.getvalue():
        assert time.monotonic() < deadline, "no heartbeat while TensorRT was silent"
        time.sleep(0.05)
    model.close()
    beat = next(line for line in stream.getvalue().splitlines() if "… silent for" in line)
    assert f" in {SILENT_PHASE} (" in beat
