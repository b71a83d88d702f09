"""A fleet's build as one document (app/fleet_status.py): from its journal, folded as it grows
and started again when the file is replaced, and, while it runs, from its own HTTP view's
``/status``, read field by field."""

from __future__ import annotations

import os
from pathlib import Path

from trt_otel import BuildMonitor, JournalWriter, ManualClock
from trt_otel.app.fleet_documents import OpenPhase
from trt_otel.app.fleet_status import JournalFold, journal_status, with_view


def journal_of(path: Path, *, phases: int, took_s: float = 0.0) -> str:
    """A finished build's journal at ``path``, with ``phases`` phases, ``took_s`` long on its
    clock; its build id."""
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.log.follow(JournalWriter(path))
    monitor.start()
    for index in range(phases):
        monitor.phase_start(f"phase {index}", None, 1)
        monitor.step_complete(f"phase {index}", 0)
        monitor.phase_finish(f"phase {index}")
    clock.advance(took_s)
    monitor.end()
    monitor.close()
    return monitor.state.build_id or ""


def test_a_finished_builds_status_says_how_long_it_took(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal_of(journal, phases=1, took_s=12.5)
    fold = JournalFold(journal)
    state = fold.update()
    status = journal_status(
        state, fold.attempts, id="0123456789ab", kind="demo", state="finished", model=None,
        engine=None, journal=str(journal),
    )  # fmt: skip
    assert (status.outcome, status.exit_code, status.elapsed_s) == ("success", 0, 12.5)


def test_a_journal_replaced_by_another_is_folded_afresh(tmp_path: Path) -> None:
    """A retried build's journal written anew (another file renamed over it), larger than the
    first: its fold starts again rather than read on from where the first one's ended."""
    journal = tmp_path / "journal.jsonl"
    journal_of(journal, phases=1)
    fold = JournalFold(journal)
    fold.update()
    other = tmp_path / "other.jsonl"
    second = journal_of(other, phases=5)
    os.replace(other, journal)
    state = fold.update()
    assert state.build_id == second
    assert state.outcome is not None and state.steps_completed_total == 5


def test_the_open_phases_are_read_from_the_builds_view() -> None:
    """From the root to the innermost open phase, each with its steps done of its steps."""
    journal = Path("unused.jsonl")
    status = journal_status(
        JournalFold(journal).state, [], id="0123456789ab", kind="demo", state="running",
        model=None, engine=None, journal=str(journal),
    )  # fmt: skip
    view = {
        "status": "running",
        "steps_completed": 7,
        "phases": [
            {"name": "done", "status": "finished", "last_step": 0, "num_steps": 1},
            {
                "name": "Building engine",
                "status": "open",
                "last_step": 2,
                "num_steps": 10,
                "elapsed_s": 4.5,
                "children": [
                    {"name": "Tactics", "status": "open", "last_step": -1, "num_steps": 3,
                     "elapsed_s": "soon"},
                ],
            },
        ],
    }  # fmt: skip
    seen = with_view(status, view)
    assert seen.open_phases == [
        OpenPhase("Building engine", "3/10", 4.5),
        OpenPhase("Tactics", "0/3", None),  # what is no number is not shown as one
    ]
    assert (seen.state, seen.steps_completed) == ("running", 7)
