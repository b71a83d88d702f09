"""The journal: a round trip equals the live log; torn, corrupt and foreign files are reported."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli import CLI, MID_BUILD
from journals import fold
from trt_otel import BuildMonitor, JournalError, JournalWriter, Outcome, read_journal
from trt_otel.app.cli import main
from trt_otel.builder.simulator import Driver, generate_plan, load_trace
from trt_otel.capture.watch import follow_journal
from trt_otel.core.events import (
    EVENT_TYPES,
    Anomaly,
    AnomalyKind,
    BuildFinished,
    BuildOutput,
    BuildStarted,
    CancelRequested,
    Event,
    GpuSample,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from trt_otel.core.journal import journal_in_use
from trt_otel.core.journal_codec import (
    FORMAT_VERSION,
    CorruptLineError,
    decode_event,
    encode_events,
)
from waiting import wait_for_text


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


def test_round_trip_equals_the_live_log(tmp_path: Path) -> None:
    path = tmp_path / "build.jsonl"
    monitor = record(path)
    journal = read_journal(path)
    assert journal.problems == []
    assert journal.header["version"] == 1
    assert journal.events == monitor.log.recent()
    replayed = fold(journal.events)
    live = monitor.state
    assert replayed.outcome is live.outcome is Outcome.SUCCESS
    assert replayed.phases == live.phases
    assert replayed.roots == live.roots
    assert replayed.steps_completed_total == live.steps_completed_total
    assert replayed.attributes == {"model.path": "demo.onnx"}


def test_a_cancelled_build_round_trips_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "cancelled.jsonl"
    monitor = record(path, cancel_at=200)
    replayed = fold(read_journal(path).events)
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


def test_a_whole_last_line_without_its_newline_is_an_event_not_torn(tmp_path: Path) -> None:
    path = tmp_path / "unterminated.jsonl"
    record(path)
    data = path.read_bytes()
    assert data.endswith(b"\n")
    path.write_bytes(data[:-1])  # the writer stopped just before the newline
    journal = read_journal(path)
    assert journal.problems == []
    assert len(journal.events) == data.count(b"\n") - 1


def test_a_corrupt_last_line_with_its_newline_is_corrupt_not_torn(tmp_path: Path) -> None:
    path = tmp_path / "corrupt-end.jsonl"
    record(path)
    path.write_bytes(path.read_bytes() + b"{not json\n")
    journal = read_journal(path)
    assert [p.kind for p in journal.problems] == ["corrupt_line"]


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
        # Not a version a newer trt-otel would read either: no "upgrade" advice.
        (b'{"format": "trt-otel-journal", "version": "1"}\n', "version is '1', not a whole"),
        (b'{"format": "trt-otel-journal", "version": null}\n', "version is 'None', not a whole"),
        (b'{"format": "trt-otel-journal", "version": 0}\n', "version is '0', not a whole"),
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


def test_the_journal_is_flushed_at_phase_boundaries_while_the_writer_is_alive(
    tmp_path: Path,
) -> None:
    """A reader (``watch``, a person) sees every phase boundary as it happens, without waiting
    for the writer to close; steps alone may wait for the next boundary."""
    monitor = BuildMonitor()
    writer = JournalWriter(tmp_path / "live.jsonl")
    monitor.phase_start("Building engine", None, 6)
    monitor.step_complete("Building engine", 0)
    monitor.phase_start("Timing tactics", "Building engine", 2)
    started = monitor.log.recent()
    writer.handle(started)
    assert [e.seq for e in read_journal(writer.path).events] == [e.seq for e in started]
    monitor.step_complete("Timing tactics", 0)
    monitor.phase_finish("Timing tactics")
    finished = monitor.log.recent(started[-1].seq)
    writer.handle(finished)
    assert len(read_journal(writer.path).events) == len(started) + len(finished)
    monitor.cancel("enough")
    writer.handle(monitor.log.recent(finished[-1].seq))
    assert read_journal(writer.path).events[-1].type == "cancel"
    writer.close()


@pytest.mark.e2e
def test_a_build_killed_mid_write_leaves_a_usable_prefix(tmp_path: Path) -> None:
    path = tmp_path / "killed.jsonl"
    command = [*CLI, "demo", "--speed", "0", "--no-progress"]
    process = subprocess.Popen(
        [*command, "--silence", "10m", "--journal", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_text(path, MID_BUILD, timeout_s=30)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(10)
    journal = read_journal(path)
    assert len(journal.events) > 50
    assert {p.kind for p in journal.problems} <= {"torn_tail"}
    assert [e.seq for e in journal.events] == list(range(len(journal.events)))
    state = fold(journal.events)
    assert state.outcome is None and state.open_by_name  # killed mid-build, phases open


# -- the codec: every field's type checked, one reader for replay, watch and demo --trace -------


def every_event_type() -> list[Event]:
    stamp: dict[str, Any] = {"wall_ns": 1_700_000_000_000_000_000, "mono_ns": 5, "thread": "b"}
    return [
        BuildStarted(
            seq=0, build_id="b1", attributes={"model.path": "m.onnx", "n": [1, 2]}, **stamp
        ),
        PhaseStarted(seq=1, name="Building engine", parent=None, num_steps=6, **stamp),
        StepCompleted(seq=2, name="Building engine", step=0, **stamp),
        Anomaly(seq=3, kind=AnomalyKind.STEP_OUT_OF_RANGE, detail="7 of 6", phase="x", **stamp),
        LogMessage(seq=4, severity="WARNING", message="é ünïcode\n", **stamp),
        GpuSample(seq=5, index=0, memory_used_bytes=2**40, utilization=0.5, **stamp),
        ProcessSample(
            seq=6,
            pid=4242,
            status="stopped",
            cpu_seconds=1.5,
            cpu_percent=0.0,
            rss_bytes=2**30,
            available_bytes=2**34,
            **stamp,
        ),
        CancelRequested(seq=7, reason="enough", source="file", timeout=True, policy="p", **stamp),
        PhaseFinished(seq=8, name="Building engine", **stamp),
        BuildOutput(seq=9, attributes={"engine.sha256": "e" * 64, "engine.bytes": 3}, **stamp),
        BuildFinished(seq=10, outcome=Outcome.TIMEOUT, detail="d", error_type="E", **stamp),
    ]


def test_every_event_type_round_trips_through_the_codec() -> None:
    events = every_event_type()
    assert {type(e) for e in events} == set(EVENT_TYPES.values())
    lines = encode_events(events).splitlines()
    assert [decode_event(line) for line in lines] == events
    assert [json.loads(line)["type"] for line in lines] == [e.type for e in events]
    for cls in EVENT_TYPES.values():  # the journal's tag is the class's documented type
        assert cls.__struct_config__.tag == cls.type


def test_a_line_may_hold_keys_in_any_order_and_keys_from_a_newer_writer() -> None:
    line = '{"name": "a", "step": 2, "future": {"x": 1}, "seq": 4, "type": "step", '
    line += '"wall_ns": 1, "mono_ns": 2, "thread": "t"}'
    assert decode_event(line) == StepCompleted(
        seq=4, wall_ns=1, mono_ns=2, thread="t", name="a", step=2
    )


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"step": "3"}, "$.step"),
        ({"step": 3.0}, "$.step"),
        ({"step": True}, "$.step"),
        ({"seq": None}, "$.seq"),
        ({"name": 5}, "$.name"),
        ({"wall_ns": 1e400}, "$.wall_ns"),
    ],
)
def test_a_mistyped_field_is_a_corrupt_line(change: dict[str, object], where: str) -> None:
    record = {"type": "step", "seq": 4, "wall_ns": 1, "mono_ns": 2, "thread": "t", "name": "a"}
    record["step"] = 3
    record.update(change)
    text = json.dumps(record).replace("Infinity", "1e400")
    with pytest.raises(CorruptLineError, match=re.escape(where)) as error:
        decode_event(text)
    assert error.value.kind == "corrupt_line"


def test_an_unknown_enumeration_value_is_a_corrupt_line() -> None:
    line = '{"type": "build_end", "seq": 1, "wall_ns": 1, "mono_ns": 2, "thread": "t", '
    with pytest.raises(CorruptLineError, match=re.escape("$.outcome")):
        decode_event(line + '"outcome": "exploded"}')


def damaged(tmp_path: Path, edit: Callable[[list[bytes]], None]) -> tuple[Path, BuildMonitor]:
    """A journal of a build, edited by ``edit``; and the monitor that recorded the build."""
    path = tmp_path / "build.jsonl"
    monitor = record(path)
    lines = path.read_bytes().splitlines(keepends=True)
    edit(lines)
    path.write_bytes(b"".join(lines))
    return path, monitor


def test_replay_reports_a_mistyped_line_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def mistype(lines: list[bytes]) -> None:
        index = next(i for i, line in enumerate(lines) if b'"type":"step"' in line)
        lines[index] = re.sub(rb'"step":(\d+)', rb'"step":"\1"', lines[index])

    path, _ = damaged(tmp_path, mistype)
    journal = read_journal(path)
    assert [p.kind for p in journal.problems] == ["corrupt_line"]
    assert "Expected `int`, got `str` - at `$.step`" in journal.problems[0].message
    assert main(["replay", str(path)]) == 0
    err = capsys.readouterr().err
    assert "corrupt line" in err and "Traceback" not in err


def test_a_line_of_deeply_nested_brackets_is_a_corrupt_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000

    def insert(lines: list[bytes]) -> None:
        start = next(i for i, line in enumerate(lines) if b'"type":"build_start"' in line)
        # Inside a field that takes any JSON, and as a line of its own.
        lines[start] = lines[start].replace(b'"attributes":{', b'"attributes":{"d":' + deep + b",")
        lines[start + 3] = deep + b"\n"
        problem_lines.extend([start + 1, start + 4])

    problem_lines: list[int] = []
    path, _ = damaged(tmp_path, insert)
    journal = read_journal(path)
    assert [(p.kind, p.line) for p in journal.problems] == [
        ("corrupt_line", problem_lines[0]),
        ("corrupt_line", problem_lines[1]),
    ]
    assert "nested too deeply" in journal.problems[0].message
    assert main(["replay", str(path)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_duplicated_line_is_reported_and_counted_once(tmp_path: Path) -> None:
    def duplicate(lines: list[bytes]) -> None:
        index = next(i for i, line in enumerate(lines) if b'"type":"step"' in line)
        lines.insert(index + 1, lines[index])
        lines.insert(index + 5, lines[index + 2])

    path, live = damaged(tmp_path, duplicate)
    journal = read_journal(path)
    assert [p.kind for p in journal.problems] == ["seq_repeat", "seq_repeat"]
    assert "a repeated line" in journal.problems[0].message
    assert journal.events == live.log.recent()
    replayed = fold(journal.events)
    assert replayed.steps_completed_total == live.state.steps_completed_total


def test_a_duplicated_first_event_is_a_repeated_line_not_the_start_of_another_build(
    tmp_path: Path,
) -> None:
    """A ``seq`` of 0 starts another build's sequence, unless it is the very event read
    first, written again: then it is a repeated line, skipped and said."""

    def duplicate_first(lines: list[bytes]) -> None:
        assert json.loads(lines[1])["seq"] == 0
        lines.insert(2, lines[1])

    path, live = damaged(tmp_path, duplicate_first)
    journal = read_journal(path)
    assert [p.kind for p in journal.problems] == ["seq_repeat"]
    assert journal.problems[0].line == 3
    assert journal.events == live.log.recent()


def test_several_builds_in_one_journal_each_have_their_own_sequence(tmp_path: Path) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    record(first)
    record(second)
    both = tmp_path / "both.jsonl"
    both.write_bytes(first.read_bytes() + b"".join(second.read_bytes().splitlines(True)[1:]))
    journal = read_journal(both)
    assert journal.problems == []
    assert len(journal.events) == len(read_journal(first).events) * 2


def test_watch_and_replay_read_lines_the_same_way(tmp_path: Path) -> None:
    def damage(lines: list[bytes]) -> None:
        index = next(i for i, line in enumerate(lines) if b'"type":"step"' in line)
        lines.insert(index + 1, lines[index])
        lines[index + 4] = lines[index + 4].replace(b'"step":', b'"step":"x","_":')

    path, _ = damaged(tmp_path, damage)
    seen: list[Event] = []
    warnings: list[str] = []
    end = follow_journal(path, seen.extend, warn=warnings.append, poll_s=0.01)
    assert end is not None and end.outcome is Outcome.SUCCESS
    journal = read_journal(path)
    assert seen == journal.events
    assert warnings == [f"{path}: {p}" for p in journal.problems]
    assert [p.kind for p in journal.problems] == ["seq_repeat", "corrupt_line"]


@pytest.mark.parametrize(
    "content",
    [
        bytes(range(256)) * 4,
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
        b'{"cb": "step_complete", "phase_name": "a", "step": "3"}\n',
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
    ],
)
def test_demo_refuses_a_trace_that_is_not_one_with_exit_2(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(content)
    assert main(["demo", "--speed", "0", "--no-progress", "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "not a trace callback" in err and "Traceback" not in err


def test_an_attribute_that_is_not_json_is_written_as_its_text(tmp_path: Path) -> None:
    path = tmp_path / "build.jsonl"
    monitor = BuildMonitor(attributes={"model.path": Path("/models/m.onnx"), "n": 3})
    monitor.log.follow(JournalWriter(path))
    monitor.start()
    monitor.end()
    assert monitor.close(10)
    journal = read_journal(path)
    assert journal.problems == []
    assert fold(journal.events).attributes == {"model.path": "/models/m.onnx", "n": 3}


@pytest.mark.parametrize(
    ("ahead", "arrive", "dropped"),
    [(7, 11, 0), (7, 11, 10), (512, 100, 0), (5, 5, 3), (1, 3, 0), (7, 14, 0), (7, 14, 7)],
)
def test_lines_encoded_ahead_are_written_once_in_order_whatever_reaches_the_writer(
    tmp_path: Path, ahead: int, arrive: int, dropped: int
) -> None:
    """A supervisor encodes each frame's lines as its events are made; the journal's thread
    writes them when the events reach it, in whatever batches they come, after the oldest
    were dropped from a full queue or not: each event's line once, in order."""
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(3))
    monitor.end()
    events = monitor.log.recent()
    path = tmp_path / "ahead.jsonl"
    writer = JournalWriter(path)
    for start in range(0, len(events), ahead):
        writer.encode_ahead(events[start : start + ahead])
    delivered = events[dropped:]
    for start in range(0, len(delivered), arrive):
        writer.handle(delivered[start : start + arrive])
    writer.close()
    lines = path.read_bytes().split(b"\n", 1)[1]  # after the header
    assert lines == encode_events(delivered)
    assert writer.lines_written == len(delivered)
    if arrive % ahead == 0 and dropped % ahead == 0:  # as a supervisor's frames arrive
        assert writer.lines_encoded_ahead == len(delivered), "every line was encoded ahead"


def test_lines_encoded_ahead_are_not_written_across_a_gap_in_what_arrives(tmp_path: Path) -> None:
    """The queue dropped two events in the middle of a chunk encoded ahead: the chunk is not
    the next events any more, so what arrives is encoded as it is (the dropped stay dropped)."""
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(3))
    monitor.end()
    events = monitor.log.recent()
    assert len(events) >= 40
    path = tmp_path / "gap.jsonl"
    writer = JournalWriter(path)
    for start in range(0, 40, 10):
        writer.encode_ahead(events[start : start + 10])
    delivered = events[:10] + events[12:]
    writer.handle(delivered)
    writer.close()
    lines = path.read_bytes().split(b"\n", 1)[1]
    assert lines == encode_events(delivered)
    assert [e.seq for e in read_journal(path).events] == [e.seq for e in delivered]


def test_a_journal_one_version_ahead_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "next.jsonl"
    header = {"format": "trt-otel-journal", "version": FORMAT_VERSION + 1}
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(JournalError, match="upgrade trt-otel"):
        read_journal(path)


def test_a_journal_written_over_a_longer_one_holds_only_the_new_build(tmp_path: Path) -> None:
    """The path of an earlier, longer journal: the new journal replaces it whole, with no tail
    of the old one after the new build's end."""
    path = tmp_path / "build.jsonl"
    record(path)
    longer = path.stat().st_size
    short = BuildMonitor()
    short.log.follow(JournalWriter(path))
    short.start()
    short.end()
    assert short.close(10)
    assert path.stat().st_size < longer
    journal = read_journal(path)
    assert journal.problems == []
    assert journal.events == short.log.recent()


def test_blank_space_after_the_last_newline_is_no_torn_line(tmp_path: Path) -> None:
    """A journal that ends in blanks after its last newline: nothing is torn, nothing lost."""
    path = tmp_path / "padded.jsonl"
    record(path)
    data = path.read_bytes()
    path.write_bytes(data + b"  \t")
    journal = read_journal(path)
    assert journal.problems == []
    assert len(journal.events) == data.count(b"\n") - 1


def test_the_writer_a_busy_journal_names_is_cut_to_a_line(tmp_path: Path) -> None:
    """The header of a journal someone else writes is that writer's text: its host is cut."""
    path = tmp_path / "busy.jsonl"
    header = {"format": "trt-otel-journal", "version": 1, "writer_pid": 4242,
              "writer_host": "h" * 5000}  # fmt: skip
    path.write_bytes(json.dumps(header).encode() + b"\n")
    with path.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        said = journal_in_use(path)
    assert said == f"trt-otel pid 4242 on host {'h' * 64} (give each build its own journal)"


def test_a_new_journal_opened_to_append_starts_with_its_header(tmp_path: Path) -> None:
    """``append`` goes on after what a journal holds; a journal that holds nothing yet (a
    retried build's first journal) is still given its header, so it reads as a journal."""
    path = tmp_path / "build.jsonl"
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(path, append=True))
    monitor.start()
    monitor.end()
    assert monitor.close(10)
    journal = read_journal(path)
    assert journal.header["format"] == "trt-otel-journal"
    assert journal.problems == []
    assert journal.events == monitor.log.recent()


def test_a_journal_opened_to_append_goes_on_under_its_one_header(tmp_path: Path) -> None:
    """A retried build's next attempt appends to the journal its first attempt wrote: its
    events follow the first attempt's, under the header the journal started with (no second
    header in the middle, which a reader would take for a corrupt line)."""
    path = tmp_path / "build.jsonl"
    first = record(path)
    header = path.read_bytes().split(b"\n", 1)[0]
    again = BuildMonitor()
    again.log.follow(JournalWriter(path, append=True))
    again.start()
    again.end()
    assert again.close(10)
    lines = path.read_bytes().splitlines()
    assert lines[0] == header
    headers = [n for n, line in enumerate(lines) if "format" in json.loads(line)]
    assert headers == [0], "one header, on line 1"
    journal = read_journal(path)
    assert journal.problems == []
    assert journal.events == [*first.log.recent(), *again.log.recent()]
