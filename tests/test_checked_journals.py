"""A journal whose callbacks were recorded unchecked (the C++ monitor's: ``"checked": false`` in
its header) is read through the one way in: the anomalies, the phases' closing and the ``seq``
numbering are those Python's monitor records for the same callbacks. A journal checked when it
was written (Python's, and the C++ monitor's of before) is read as it is: nothing is checked
twice. These need no compiler; tests/test_cpp.py holds the same of the real C++ monitor."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import msgspec
import pytest

from cli import CLI
from journals import unchecked
from trt_otel import BuildMonitor, JournalWriter, read_journal
from trt_otel.app.fleet_status import JournalFold
from trt_otel.app.reporting import build_reports
from trt_otel.capture.checked import CheckedEvents
from trt_otel.capture.watch import follow_journal
from trt_otel.core import journal_codec as codec
from trt_otel.core import journal_reader as raw
from trt_otel.core.events import Anomaly, Event
from trt_otel.core.log import EventLog

BREAKS: list[tuple[str, str, str | None, int]] = [
    ("phase_start", "Building engine", None, 4),
    ("step_complete", "Ghost", None, 0),  # a step of a phase that is not open
    ("phase_start", "Timing tactics", "Nowhere", 3),  # an unknown parent
    ("phase_start", "Timing tactics", "Building engine", 3),  # reused while open
    ("step_complete", "Timing tactics", None, 2),
    ("step_complete", "Timing tactics", None, 1),  # not increasing
    ("phase_start", "Inner", "Timing tactics", 0),  # num_steps 0
    ("phase_finish", "Building engine", None, 0),  # finished with open children
]


def play(monitor: BuildMonitor) -> None:
    monitor.log_message("warning", "before the first callback")
    for kind, name, parent, number in BREAKS:
        if kind == "phase_start":
            monitor.phase_start(name, parent, number)
        elif kind == "step_complete":
            monitor.step_complete(name, number)
        else:
            monitor.phase_finish(name)
    monitor.cancel("stop", source="file", policy="file(stop)")
    monitor.step_complete("Building engine", 3)  # not open any more
    monitor.end()
    monitor.phase_finish("Building engine")  # after the end


def pythons_events() -> list[Event]:
    """What Python's monitor records for the callbacks of :func:`play`."""
    monitor = BuildMonitor(backend="none", attributes={"model.path": "m.onnx"})
    play(monitor)
    return monitor.log.recent()


def write(path: Path, events: list[Event], **header: object) -> Path:
    first = {"format": "trt-otel-journal", "version": 1, "producer": "test", **header}
    path.write_bytes(json.dumps(first).encode() + b"\n" + codec.encode_events(events))
    return path


def test_unchecked_callbacks_are_read_as_pythons_monitor_records_them(tmp_path: Path) -> None:
    python = pythons_events()
    assert sum(isinstance(event, Anomaly) for event in python) == 9
    journal = write(tmp_path / "cpp.jsonl", unchecked(python), checked=False)

    assert not any(isinstance(event, Anomaly) for event in raw.read_journal(journal).events)
    read = read_journal(journal)
    assert read.problems == []
    # Every field, times and threads included: the events are the very ones Python recorded.
    assert read.events == python


def test_only_the_first_recorded_cancel_is_taken(tmp_path: Path) -> None:
    python = pythons_events()
    events = unchecked(python)
    cancel = next(event for event in events if event.type == "cancel")
    again = msgspec.structs.replace(cancel, reason="asked twice")
    at = events.index(cancel) + 1
    twice = [*events[:at], again, *events[at:]]
    twice = [msgspec.structs.replace(event, seq=seq) for seq, event in enumerate(twice)]
    journal = write(tmp_path / "cpp.jsonl", twice, checked=False)
    assert read_journal(journal).events == python


def test_a_report_counts_the_anomalies_of_an_unchecked_journal(tmp_path: Path) -> None:
    journal = write(tmp_path / "cpp.jsonl", unchecked(pythons_events()), checked=False)
    (report,) = build_reports([journal], quiet=True)
    assert sum(report.anomalies.values()) == 9


def test_ctrl_c_while_a_journal_is_read_interrupts_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a cancel of the build: the build was over, only its reading is stopped."""
    journal = write(tmp_path / "cpp.jsonl", unchecked(pythons_events()), checked=False)
    take = BuildMonitor._take_locked

    def interrupted(self: BuildMonitor, record: tuple[object, ...]) -> BaseException | None:
        if record[0] == "phase_finish":
            return KeyboardInterrupt()  # what _take_locked hands back when Ctrl-C lands in it
        return take(self, record)

    monkeypatch.setattr(BuildMonitor, "_take_locked", interrupted)
    with pytest.raises(KeyboardInterrupt):
        read_journal(journal)


def test_a_follower_fed_a_line_at_a_time_gets_the_same_events(tmp_path: Path) -> None:
    python = pythons_events()
    checked = CheckedEvents({"checked": False})
    fed = [event for one in unchecked(python) for event in checked.feed([one])]
    assert fed == python

    journal = write(tmp_path / "cpp.jsonl", unchecked(python), checked=False)
    followed: list[Event] = []
    follow_journal(journal, followed.extend, warn=pytest.fail, lost_after_s=5)
    assert followed == python


def test_each_build_of_a_batch_is_checked_against_its_own_phases(tmp_path: Path) -> None:
    """Two builds of one log (as ``trt-otel run`` records them), read in one batch: the second
    build's callbacks are checked against its own phases, not those the first left open."""
    log = EventLog()
    first = BuildMonitor(log=log, backend="none")
    first.phase_start("Building engine", None, 2)  # left open: the build stopped there
    log.remove_fold(first.state.apply)
    second = BuildMonitor(log=log, backend="none")
    second.start()
    second.step_complete("Building engine", 0)  # not a phase of this build
    python = log.recent()
    assert [event.type for event in python].count("anomaly") == 1

    assert CheckedEvents({"checked": False}).feed(unchecked(python)) == python
    journal = write(tmp_path / "cpp.jsonl", unchecked(python), checked=False)
    assert read_journal(journal).events == python


def test_the_fleets_status_folds_a_growing_unchecked_journal_checked(tmp_path: Path) -> None:
    python = pythons_events()
    journal = write(tmp_path / "cpp.jsonl", [], checked=False)
    fold = JournalFold(journal)
    lines = codec.encode_events(unchecked(python)).splitlines(keepends=True)
    for line in lines:  # the journal grows a line at a time between two looks
        with open(journal, "ab") as handle:
            handle.write(line)
        state = fold.update()
    assert sum(state.anomalies.values()) == 9
    assert state.outcome is not None and state.outcome.value == "cancellation"


@pytest.mark.e2e
@pytest.mark.parametrize("header", ["written by Python", "without the field"])
def test_a_checked_journal_is_not_checked_twice(tmp_path: Path, header: str) -> None:
    path = tmp_path / "python.jsonl"
    monitor = BuildMonitor(backend="none")
    writer = JournalWriter(path)
    monitor.log.follow(writer)
    play(monitor)
    monitor.close()  # closes the writer, its follower
    if header == "without the field":  # a journal of before the field (the C++ monitor's too)
        lines = path.read_bytes().split(b"\n", 1)
        first = json.loads(lines[0])
        assert first.pop("checked") is True
        path.write_bytes(json.dumps(first).encode() + b"\n" + lines[1])

    python = monitor.log.recent()
    assert read_journal(path).events == python
    done = subprocess.run(
        [*CLI, "replay", str(path)],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "9 protocol anomalies" in done.stdout, done.stdout + done.stderr


@pytest.mark.e2e
def test_a_header_whose_checked_is_not_a_boolean_is_refused_in_one_line(tmp_path: Path) -> None:
    journal = write(tmp_path / "odd.jsonl", unchecked(pythons_events()), checked="no")
    with pytest.raises(codec.JournalError, match="'checked' is 'no', not true or false"):
        read_journal(journal)
    done = subprocess.run(
        [*CLI, "replay", str(journal)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
