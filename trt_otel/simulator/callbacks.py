"""A build's callbacks as data: what the simulator replays, read from traces and journals.

Two formats are read: the recorded TensorRT traces (one ``{"cb": "phase_start" | "step_complete"
| "phase_finish", ...}`` object per line, no timestamps) and trt-otel's own journal, whose
monotonic timestamps become the delays between callbacks.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trt_otel.events import PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.journal import is_journal_header, read_journal

CallbackKind = Literal["phase_start", "step_complete", "phase_finish"]


class TraceError(ValueError):
    """A trace file that cannot be replayed."""


@dataclass(frozen=True, slots=True)
class Callback:
    """One call TensorRT makes on its progress monitor.

    ``delay_s`` is the builder's work before this call (``None``: let the time model decide).
    """

    kind: CallbackKind
    name: str
    parent: str | None = None
    num_steps: int = 0
    step: int = 0
    delay_s: float | None = None


def load_trace(path: str | os.PathLike[str]) -> list[Callback]:
    """The callbacks of a recorded trace or a trt-otel journal (told apart by the first line)."""
    where = Path(path)
    try:
        with open(where, encoding="utf-8") as handle:
            first = handle.readline()
    except OSError as error:
        raise TraceError(f"cannot read trace {os.fspath(path)!r}: {error.strerror}") from None
    try:
        head = json.loads(first) if first.strip() else None
    except ValueError:
        head = None
    if is_journal_header(head):
        return _callbacks_of_journal(where)
    return _callbacks_of_trace(where)


def _callbacks_of_trace(path: Path) -> list[Callback]:
    callbacks: list[Callback] = []
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                kind = record["cb"]
                name = record["phase_name"]
                if kind == "phase_start":
                    callbacks.append(
                        Callback(
                            "phase_start",
                            name,
                            parent=record["parent_phase"],
                            num_steps=int(record["num_steps"]),
                        )
                    )
                elif kind == "step_complete":
                    callbacks.append(Callback("step_complete", name, step=int(record["step"])))
                elif kind == "phase_finish":
                    callbacks.append(Callback("phase_finish", name))
                else:
                    raise ValueError(f"unknown callback {kind!r}")
            except (ValueError, KeyError, TypeError) as error:
                raise TraceError(f"{path}:{line_no}: not a trace callback ({error})") from None
    if not callbacks:
        raise TraceError(f"{path}: no callbacks in this trace")
    return callbacks


def _callbacks_of_journal(path: Path) -> list[Callback]:
    journal = read_journal(path)
    callbacks: list[Callback] = []
    previous_ns: int | None = None
    for event in journal.events:
        if not isinstance(event, PhaseStarted | StepCompleted | PhaseFinished):
            continue
        delay_s = 0.0 if previous_ns is None else max(0, event.mono_ns - previous_ns) / 1e9
        previous_ns = event.mono_ns
        if isinstance(event, PhaseStarted):
            callbacks.append(
                Callback("phase_start", event.name, event.parent, event.num_steps, delay_s=delay_s)
            )
        elif isinstance(event, StepCompleted):
            callbacks.append(
                Callback("step_complete", event.name, step=event.step, delay_s=delay_s)
            )
        else:
            callbacks.append(Callback("phase_finish", event.name, delay_s=delay_s))
    if not callbacks:
        raise TraceError(f"{path}: the journal holds no callbacks")
    return callbacks
