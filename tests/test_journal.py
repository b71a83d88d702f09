"""The journal: a round trip equals the live log; torn, corrupt and foreign files are reported."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trt_otel import BuildMonitor, JournalError, JournalWriter, Outcome, read_journal
from trt_otel.simulator import Driver, generate_plan, load_trace
from trt_otel.state import BuildState


def record(path: Path, *, cancel_at: int | None = None) -> BuildMonitor:
    monitor = BuildMonitor(attributes={"model.path": "demo.onnx"})
    monitor.log.follow(JournalWriter(path))
    monitor.log_message("INFO", "parsed")
    plan = generate_plan(13)
    if cancel_at is not None:
        plan = plan[:cancel_at]
        monitor.start()
        monitor.cancel("enough", source="test")
    result = Driver(speed=0).run(monitor, plan)
    monitor.end_with_result(b"engine" if result.completed else None)
    assert monitor.close(10)
    return monitor


def fold(events: list[object]) -> BuildState:
    state = BuildState()
    for event in events:
        state.apply(event)  # type: ignore[arg-type]
    return state


def test_round_trip_equals_the_live_log(tmp_path: Path) -> None:
    path = tmp_path / "build.jsonl"
    monitor = record(path)
    journal = read_journal(path)
    assert journal.problems == []
    assert journal.header["version"] == 1
    assert journal.events == monitor.log.recent()
    replayed = fold(journal.events)  # type: ignore[arg-type]
    live = monitor.state
    assert replayed.outcome is live.outcome is Outcome.SUCCESS
    assert replayed.phases == live.phases
    assert replayed.roots == live.roots
    assert replayed.steps_completed_total == live.steps_completed_total
    assert replayed.attributes == {"model.path": "demo.onnx"}


def test_a_cancelled_build_round_trips_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "cancelled.jsonl"
    monitor = record(path, cancel_at=200)
    replayed = fold(read_journal(path).events)  # type: ignore[arg-type]
    assert replayed.outcome is Outcome.CANCELLATION
    assert replayed.cancel is not None and replayed.cancel.reason == "enough"
    assert replayed.phases == monitor.state.phases


def test_a_torn_last_line_is_reported_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "torn.jsonl"
    record(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 25])  # cut the last event mid-line
    journal = read_journal(path)
    assert [p.kind for p in journal.problems] == ["torn_tail"]
    lines = data.count(b"\n")
    assert journal.problems[0].line == lines
    assert len(journal.events) == lines - 2  # header and the torn event are not events
    assert [e.seq for e in journal.events] == list(range(len(journal.events)))


def test_corrupt_lines_unknown_types_and_gaps_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "damaged.jsonl"
    record(path)
    lines = path.read_text().splitlines(keepends=True)
    lines[5] = "{not json\n"
    lines[8] = json.dumps({"seq": 7, "type": "from_the_future", "wall_ns": 1}) + "\n"
    del lines[20:23]
    path.write_text("".join(lines))
    journal = read_journal(path)
    kinds = [(p.kind, p.line) for p in journal.problems]
    assert kinds == [("corrupt_line", 6), ("unknown_type", 9), ("seq_gap", 21)]
    assert "3 events missing" in journal.problems[2].message
    assert all(str(p).startswith(f"line {p.line}: ") for p in journal.problems)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a trt-otel journal"),
        (b'{"cb": "phase_start"}\n', "not a trt-otel journal"),
        (b'{"format": "trt-otel-journal", "version": 99}\n', "upgrade trt-otel"),
    ],
)
def test_files_that_are_not_readable_journals_fail_clearly(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(content)
    with pytest.raises(JournalError, match=message):
        read_journal(path)


def test_a_missing_journal_fails_clearly(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="cannot read journal"):
        read_journal(tmp_path / "nope.jsonl")


def test_an_unwritable_journal_path_fails_before_the_build(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        JournalWriter(blocker / "journal.jsonl")


def test_a_journal_replays_as_a_trace_with_its_own_timing(tmp_path: Path) -> None:
    path = tmp_path / "build.jsonl"
    monitor = record(path)
    callbacks = load_trace(path)
    replay = BuildMonitor()
    assert Driver(speed=0).run(replay, callbacks).completed
    assert replay.state.phases_started_total == monitor.state.phases_started_total
    assert all(c.delay_s is not None and c.delay_s >= 0 for c in callbacks)


def test_a_build_killed_mid_write_leaves_a_usable_prefix(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    command = [sys.executable, "-m", "trt_otel.cli", "demo", "--speed", "4", "--no-progress"]
    process = subprocess.Popen(
        [*command, "--journal", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 20_000):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    journal = read_journal(path)
    assert len(journal.events) > 50
    assert {p.kind for p in journal.problems} <= {"torn_tail"}
    assert [e.seq for e in journal.events] == list(range(len(journal.events)))
    state = fold(journal.events)  # type: ignore[arg-type]
    assert state.outcome is None and state.open_by_name  # killed mid-build, phases open
