"""The C++ monitor (cpp/include/trt_otel/progress_monitor.h) compiled against NVIDIA's own
TensorRT headers, driven the way TensorRT calls it, and its journal read back by trt-otel.

The test driver (cpp/tests/driver.cpp) calls the monitor through ``nvinfer1::IProgressMonitor``
and unwinds like TensorRT when a step is refused. Its journals must read as a Python build's:
the same events (types, fields, seq) for the same callbacks, hence the same state and spans.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from conftest import REPO_ROOT, reference_tree, trace_params
from cpp_toolchain import (
    CPP,
    TENSORRT_INCLUDE,
    WARNINGS,
    build_program,
    built_once,
    cmake_launcher,
    compile_driver,
    cuda_include,
    header_version,
    include_flags,
    missing_toolchain,
    toolchain_step,
)
from journals import cancel_record, fold, read_clean, spans_of, unchecked
from otlp_receiver import ReceivedSpan, otlp_receiver
from prometheus_server import free_port
from trt_otel import BuildMonitor, JournalWriter, Outcome, read_journal
from trt_otel.app.remote import control_line
from trt_otel.builder.simulator import Driver, load_trace
from trt_otel.core import journal as raw_journal
from trt_otel.core import journal_reader as raw_reader
from trt_otel.core.events import (
    Anomaly,
    BuildFinished,
    BuildStarted,
    CancelRequested,
    Event,
    LogMessage,
    PhaseFinished,
    PhaseStarted,
    StepCompleted,
)
from trt_otel.core.journal_codec import encode_events, event_to_dict
from trt_otel.views.spans import SpanRecord
from waiting import holds_open, wait_for_file, wait_for_text, wait_until

STRICT = [
    *WARNINGS,
    *("-Wconversion", "-Wsign-conversion", "-Wold-style-cast", "-Wuseless-cast"),
    *("-Wnon-virtual-dtor", "-Woverloaded-virtual", "-Wnull-dereference", "-Wdouble-promotion"),
    *("-Wformat=2", "-Wcast-align", "-Wduplicated-cond", "-Wlogical-op"),
]
"""What strict C++ projects turn on: the header is included as their own code (not -isystem)."""


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(missing_toolchain() is not None, reason=str(missing_toolchain())),
    # On one worker: the driver's variants (compiled by a session fixture) are built once a run.
    pytest.mark.xdist_group("cpp"),
]


@pytest.fixture(scope="session")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Compiles each variant of the driver once per session, when first asked for."""
    return built_once(compile_driver, tmp_path_factory.mktemp("cpp"))


@pytest.fixture(scope="session")
def driver(drivers: Callable[[str], Path]) -> Path:
    return drivers("plain")


@dataclass
class Run:
    summary: dict[str, Any]
    stderr: str


def run_driver(binary: Path, mode: str, timeout_s: float = 120, **options: object) -> Run:
    command = [str(binary), mode, *(f"{key}={value}" for key, value in options.items())]
    environment = {
        **os.environ,
        "ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "TSAN_OPTIONS": "halt_on_error=1",
    }
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=environment, check=False
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr}"
    return Run(json.loads(done.stdout.strip().splitlines()[-1]), done.stderr)


def comparable(event: Event) -> dict[str, Any]:
    """An event as the journal holds it, less what differs between two runs (times, thread)."""
    record = event_to_dict(event)
    for key in ("wall_ns", "mono_ns", "thread"):
        record.pop(key)
    return record


def python_events(
    started: BuildStarted, play: Callable[[BuildMonitor], bool], end: bool = True
) -> list[Event]:
    """The events Python's monitor records for the same callbacks, same build id and attributes."""
    monitor = BuildMonitor(build_id=started.build_id, attributes=started.attributes)
    completed = play(monitor)
    if end:
        monitor.end_with_result(b"engine" if completed else None)
    return list(monitor.log.recent())


def same_lines(journal_path: Path, python: list[Event]) -> None:
    """The C++ journal's lines are the bytes Python's writer writes, times and thread aside."""
    stamp = re.compile(rb'"wall_ns":\d+,"mono_ns":\d+,"thread":"[^"]*"')

    def normal(lines: list[bytes]) -> list[bytes]:
        return [stamp.sub(b'"wall_ns":0,"mono_ns":0,"thread":""', line) for line in lines]

    cpp_lines = journal_path.read_bytes().splitlines()[1:]
    assert normal(cpp_lines) == normal(encode_events(python).splitlines())


def span_shape(spans: list[SpanRecord]) -> list[tuple[object, ...]]:
    """Spans less their times: name, ids, parent, attributes, events (names and attributes)."""
    return [
        (
            s.name,
            s.trace_id,
            s.span_id,
            s.parent_span_id,
            s.attributes,
            [(e.name, e.attributes) for e in s.events],
            s.error,
        )
        for s in spans
    ]


# -- compiling -------------------------------------------------------------------------------------


def test_header_compiles_cleanly_against_nvidias_headers(tmp_path: Path) -> None:
    """Warnings are errors, strict ones included; two translation units including it link
    (header-only, no ODR clash); the monitor is an nvinfer1::IProgressMonitor and the logger an
    ILogger."""
    units = []
    for index in range(2):
        unit = tmp_path / f"unit{index}.cpp"
        unit.write_text(
            "#include <trt_otel/progress_monitor.h>\n"
            "#include <type_traits>\n"
            "static_assert(std::is_base_of_v<nvinfer1::IProgressMonitor, "
            "trt_otel::ProgressMonitor>);\n"
            "static_assert(std::is_base_of_v<nvinfer1::ILogger, trt_otel::Logger>);\n"
            + (
                "int other();\nint main() { trt_otel::ProgressMonitor m; trt_otel::Logger l(m);\n"
                '  l.log(nvinfer1::ILogger::Severity::kWARNING, "w"); m.end(true);\n'
                "  return other(); }\n"
                if index == 0
                else "int other() { trt_otel::ProgressMonitor m; return m.cancelled() ? 1 : 0; }\n"
            )
        )
        units.append(str(unit))
    binary = tmp_path / "two_units"
    done = subprocess.run(
        ["g++", "-std=c++17", *STRICT, *include_flags(), *units, "-o", str(binary), "-pthread"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert subprocess.run([str(binary)], timeout=30, check=False).returncode == 0


def test_readme_example_compiles_in_ten_lines(tmp_path: Path) -> None:
    """The C++ section's example, inside a function given TensorRT's builder, network and
    config, compiles cleanly as it stands in docs/cpp.md."""
    readme = (REPO_ROOT / "docs" / "cpp.md").read_text(encoding="utf-8")
    section = readme.split("## Using the monitor from C++", 1)[1]
    example = section.split("```cpp\n", 1)[1].split("```", 1)[0]
    lines = [line for line in example.splitlines() if line.strip()]
    assert lines[0] == "#include <trt_otel/progress_monitor.h>"
    assert len(lines) <= 10
    body = "\n".join(lines[1:])
    unit = tmp_path / "example.cpp"
    unit.write_text(
        f"{lines[0]}\n#include <memory>\n"
        "void build(nvinfer1::IBuilder* builder, nvinfer1::INetworkDefinition* network,\n"
        f"           nvinfer1::IBuilderConfig* config) {{\n{body}\n}}\n"
    )
    done = subprocess.run(
        [
            "g++",
            "-std=c++17",
            *WARNINGS,
            *include_flags(),
            "-c",
            str(unit),
            "-o",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr


# -- the journal of recorded TensorRT builds -------------------------------------------------------


@pytest.mark.parametrize("trace", trace_params())
def test_replayed_trace_journal_gives_the_traces_phase_tree(
    driver: Path, trace: Path, tmp_path: Path
) -> None:
    journal_path = tmp_path / "build.jsonl"
    run = run_driver(driver, "trace", trace=trace, journal=journal_path, model="/models/mnist.onnx")
    assert run.summary["completed"] and run.summary["events_lost"] == 0

    journal = read_clean(journal_path)
    assert journal.header["format"] == "trt-otel-journal" and journal.header["version"] == 1
    state = fold(journal.events)
    assert state.outcome is Outcome.SUCCESS
    assert not state.anomalies
    steps: dict[int, list[int]] = collections.defaultdict(list)
    open_ids: dict[str, int] = {}
    for event in journal.events:
        record = event_to_dict(event)
        if event.type == "phase_start":
            open_ids[record["name"]] = event.seq
        elif event.type == "step":
            steps[open_ids[record["name"]]].append(record["step"])

    def shape(phase_id: int) -> tuple[object, ...]:
        phase = state.phases[phase_id]
        return (
            phase.name,
            phase.num_steps,
            tuple(steps[phase_id]),
            tuple(shape(child) for child in phase.children),
        )

    assert [shape(root) for root in state.roots] == [r.shape() for r in reference_tree(trace)]

    # `trt-otel replay` reads it without a complaint and draws that tree.
    done = subprocess.run(
        [*CLI, "replay", str(journal_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "line " not in done.stderr
    assert "build success" in done.stdout and "Determining refit engines" in done.stdout


@pytest.mark.parametrize("trace", trace_params())
def test_cpp_journal_holds_the_events_and_spans_of_pythons_monitor(
    driver: Path, trace: Path, tmp_path: Path
) -> None:
    """The same callbacks give the same events (all fields but times and thread) and so the
    same spans as Python's BuildMonitor, given the same build id and attributes."""
    journal_path = tmp_path / "build.jsonl"
    run_driver(driver, "trace", trace=trace, journal=journal_path, model="/models/mnist.onnx")
    cpp = read_clean(journal_path).events
    started = cpp[0]
    assert isinstance(started, BuildStarted)
    assert len(started.build_id) == 32 and int(started.build_id, 16) > 0
    assert started.attributes["model.path"] == "/models/mnist.onnx"
    # The driver links no TensorRT library: no runtime to name, only the headers' version.
    assert started.attributes["trt.header_version"] == header_version()
    assert not {"trt.backend", "trt.version", "trt.library"} & set(started.attributes)

    def play(monitor: BuildMonitor) -> bool:
        return Driver(speed=0).run(monitor, load_trace(trace)).completed

    python = python_events(started, play)
    assert [comparable(e) for e in cpp] == [comparable(e) for e in python]
    same_lines(journal_path, python)
    cpp_spans = spans_of(cpp)
    assert len(cpp_spans) == sum(1 for e in cpp if e.type == "phase_start") + 1
    assert span_shape(cpp_spans) == span_shape(spans_of(python))


PROTOCOL_BREAKS: list[tuple[str, str, str | None, int]] = [
    # (callback, phase, parent, num_steps or step)
    ("phase_start", "Building engine", None, 4),
    ("step_complete", "Ghost", None, 0),  # step for a phase that is not open
    ("phase_finish", "Ghost", None, 0),  # finish of a phase that is not open
    ("phase_start", "Timing tactics", "Nowhere", 3),  # unknown parent
    ("phase_start", "Child", "Building engine", 0),  # num_steps 0: invalid
    ("step_complete", "Child", None, 5),  # out of range
    ("phase_start", "Timing tactics", "Building engine", 3),  # reused while open
    ("step_complete", "Timing tactics", None, 2),
    ("step_complete", "Timing tactics", None, 1),  # not increasing
    ("phase_start", "Inner", "Timing tactics", 2),
    ("phase_start", "Innermost", "Inner", 2),
    ("step_complete", "Building engine", None, 0),  # a parent steps while children are open
    ("phase_finish", "Building engine", None, 0),  # finished with open children
    ("step_complete", 'It\'s "quoted"\\', None, 0),  # repr with both quotes and a backslash
    ("step_complete", "Builder's pass", None, 0),  # repr in double quotes
    ("phase_start", "Übergang 漢字", None, 1),
    ("phase_finish", "Übergang 漢字", None, 0),
]


def write_trace(path: Path, callbacks: list[tuple[str, str, str | None, int]]) -> Path:
    """A trace of ``callbacks`` (callback, phase, parent, num_steps or step) for the driver."""
    with open(path, "w", encoding="utf-8") as handle:
        for kind, name, parent, number in callbacks:
            record: dict[str, object] = {"cb": kind, "phase_name": name}
            if kind == "phase_start":
                record.update(parent_phase=parent, num_steps=number)
            elif kind == "step_complete":
                record["step"] = number
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def test_protocol_breaks_are_the_anomalies_pythons_monitor_records(
    driver: Path, tmp_path: Path
) -> None:
    """As trt-otel reads the C++ journal: the journal itself records the callbacks alone."""
    trace = write_trace(tmp_path / "breaks.jsonl", PROTOCOL_BREAKS)
    journal_path = tmp_path / "build.jsonl"
    run_driver(driver, "trace", trace=trace, journal=journal_path)
    cpp = read_clean(journal_path).events
    started = cpp[0]
    assert isinstance(started, BuildStarted)

    def play(monitor: BuildMonitor) -> bool:
        for kind, name, parent, number in PROTOCOL_BREAKS:
            if kind == "phase_start":
                monitor.phase_start(name, parent, number)
            elif kind == "step_complete":
                monitor.step_complete(name, number)
            else:
                monitor.phase_finish(name)
        return True

    python = python_events(started, play)
    kinds = collections.Counter(e.kind.value for e in cpp if isinstance(e, Anomaly))
    assert set(kinds) == {
        "step_for_unknown_phase",
        "finish_of_unknown_phase",
        "unknown_parent",
        "invalid_argument",
        "step_out_of_range",
        "name_reused_while_open",
        "step_not_increasing",
        "finish_with_open_children",
    }
    assert [comparable(e) for e in cpp] == [comparable(e) for e in python]
    same_lines(journal_path, unchecked(python))
    assert span_shape(spans_of(cpp)) == span_shape(spans_of(python))


def test_the_journal_records_protocol_breaks_raw_and_replay_and_watch_find_them(
    driver: Path, tmp_path: Path
) -> None:
    """The C++ monitor checks nothing: its journal says so in its header and holds no anomaly;
    replay and watch take its callbacks through the one way in, which finds them."""
    trace = write_trace(tmp_path / "breaks.jsonl", PROTOCOL_BREAKS)
    journal_path = tmp_path / "build.jsonl"
    run_driver(driver, "trace", trace=trace, journal=journal_path)
    as_written = raw_reader.read_journal(journal_path)
    assert as_written.header["checked"] is False
    assert [e for e in as_written.events if e.type == "anomaly"] == []
    found = [e for e in read_journal(journal_path).events if isinstance(e, Anomaly)]
    assert len(found) == 10

    def cli(*arguments: str) -> str:
        done = subprocess.run(
            [*CLI, *arguments, str(journal_path)],
            env={**os.environ, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    assert "10 protocol anomalies" in cli("replay")
    watched = cli("watch", "--no-progress")
    for anomaly in found:  # watch says the first of each kind
        assert f"protocol anomaly ({anomaly.kind.value})" in watched
    assert "step 0 of 'Ghost', not open" in watched


def test_a_live_watch_of_a_cpp_build_shows_its_protocol_break(driver: Path, tmp_path: Path) -> None:
    steps = 400
    callbacks: list[tuple[str, str, str | None, int]] = [
        ("phase_start", "Building engine", None, steps),
        *(("step_complete", "Building engine", None, step) for step in range(steps // 2)),
        ("step_complete", "Ghost", None, 0),  # a phase that is not open, a second in
        *(("step_complete", "Building engine", None, step) for step in range(steps // 2, steps)),
        ("phase_finish", "Building engine", None, 0),
    ]
    trace = write_trace(tmp_path / "live.jsonl", callbacks)
    journal_path = tmp_path / "build.jsonl"
    build = subprocess.Popen(
        [str(driver), "trace", f"trace={trace}", f"journal={journal_path}", "delay_us=5000",
         "poll_ms=20"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_file(journal_path)
        watch = subprocess.Popen(
            [*CLI, "watch", str(journal_path),
             "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert build.poll() is None, "the build ended before watch started: not a live watch"
        out, _ = watch.communicate(timeout=120)
    finally:
        build.kill()
        build.wait(30)
    assert watch.returncode == 0, out
    assert "protocol anomaly (step_for_unknown_phase): step 0 of 'Ghost', not open" in out


# -- threads, cancels, kills and full disks --------------------------------------------------------


def test_threads_calling_back_at_once_lose_nothing(driver: Path, tmp_path: Path) -> None:
    journal_path = tmp_path / "build.jsonl"
    threads, steps = 4, 2000
    run = run_driver(driver, "threads", journal=journal_path, threads=threads, steps=steps)
    assert run.summary["events_lost"] == 0
    events = read_clean(journal_path).events
    # build_start, per thread: its phase, per step a child phase of 2 steps and a step, its
    # finish; build_end.
    assert len(events) == 1 + threads * (2 + steps * 5) + 1
    state = fold(events)
    assert not state.anomalies and state.outcome is Outcome.SUCCESS
    assert state.steps_completed_total == threads * steps * 3
    assert len({e.thread for e in events[1:-1]}) == threads
    for index in range(threads):
        root = f"worker {index}"
        mine = [
            event_to_dict(e)["step"]
            for e in events
            if e.type == "step" and event_to_dict(e)["name"] == root
        ]
        assert mine == list(range(steps))


def first_step_after(events: list[Event], seq: int) -> list[object]:
    step = next(event_to_dict(e) for e in events if e.type == "step" and e.seq > seq)
    return [step["name"], step["step"]]


def written_whole(path: Path, text: str) -> None:
    """Write a cancel file as docs/stopping.md says to, and as ``trt-otel watch`` writes its
    control file: whole at once, so a poll between the file's creation and its write cannot
    find it empty (and take the default reason for the one written)."""
    staged = path.with_name(path.name + ".tmp")
    staged.write_text(text)
    staged.replace(path)


@pytest.mark.parametrize("how", ["cancel()", "cancel file", "control file", "timeout"])
def test_a_cancel_refuses_the_next_step_with_its_reason(
    driver: Path, tmp_path: Path, how: str
) -> None:
    journal_path = tmp_path / "build.jsonl"
    stop = tmp_path / "stop"
    ready = tmp_path / "ready"
    options: dict[str, object] = {"journal": journal_path, "total": 5000, "delay_us": 300}
    if how == "cancel()":
        options["cancel_after"] = 3
    elif how == "timeout":
        options.update(timeout_ms=400, poll_ms=20)
    else:
        options.update(cancel_file=stop, ready_file=ready, poll_ms=20)
    command = [str(driver), "steps", *(f"{k}={v}" for k, v in options.items())]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        if how == "cancel file":
            wait_for_file(ready)
            written_whole(stop, "  release freeze  \nsecond line ignored\n")
        elif how == "control file":
            wait_for_file(ready)
            decision = {
                "reason": "no progress for 1.0s",
                "source": "stall",
                "policy": "stall(1.0s)",
            }
            written_whole(stop, json.dumps(decision) + "\n")
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["refused"] is not None, "the build was never refused a step"

    events = read_clean(journal_path).events
    cancel = cancel_record(events)
    assert first_step_after(events, cancel["seq"]) == summary["refused"]
    expected = {
        "cancel()": ("stop requested by the test driver", "user", False, "", "cancellation"),
        "cancel file": ("release freeze", "file", False, f"file({stop})", "cancellation"),
        "control file": ("no progress for 1.0s", "stall", False, "stall(1.0s)", "cancellation"),
        "timeout": (
            "the build ran past its timeout of 0.4s",
            "timeout",
            True,
            "timeout(0.4s)",
            "timeout",
        ),
    }[how]
    assert (cancel["reason"], cancel["source"], cancel["timeout"], cancel["policy"]) == expected[:4]
    state = fold(events)
    assert state.outcome == expected[4]
    assert state.outcome_detail == expected[0]
    assert not state.open_by_name, "TensorRT's unwinding finishes every open phase"
    if how == "timeout":
        started = events[0].mono_ns
        assert cancel["mono_ns"] - started >= 400_000_000
        assert state.error_type == "timeout"


def test_a_journal_torn_by_a_kill_replays_as_unfinished(driver: Path, tmp_path: Path) -> None:
    journal_path = tmp_path / "build.jsonl"
    ready = tmp_path / "ready"
    command = [
        str(driver),
        "steps",
        f"journal={journal_path}",
        f"ready_file={ready}",
        "total=100000",
        "poll_ms=10",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        wait_for_file(ready)
        wait_until(
            lambda: journal_path.read_bytes().count(b"\n") > 5, "a few events in the journal", 30
        )
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    data = journal_path.read_bytes()
    # Whatever the kill left, a write cut mid-line is what a kill can leave too.
    journal_path.write_bytes(data[:-7] if data.endswith(b"\n") else data)

    journal = read_journal(journal_path)
    assert [p.kind for p in journal.problems] == ["torn_tail"]
    assert journal.events and not any(e.type == "build_end" for e in journal.events)
    spans = spans_of(journal.events)
    build = spans[-1]
    assert build.attributes["error.type"] == "unfinished"
    assert build.attributes["cicd.pipeline.result"] == "error"
    assert any(
        s.attributes.get("trt.phase.close_reason") == "the log ended before the build did"
        for s in spans
    )
    done = subprocess.run(
        [*CLI, "replay", str(journal_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 4 and "torn last line" in done.stderr  # no end: not built


def test_a_monitor_destroyed_before_end_leaves_an_unfinished_build(
    driver: Path, tmp_path: Path
) -> None:
    journal_path = tmp_path / "build.jsonl"
    run_driver(driver, "steps", journal=journal_path, total=5, delay_us=0, no_end=1)
    events = read_clean(journal_path).events
    assert not any(e.type == "build_end" for e in events)
    last = events[-1]
    assert isinstance(last, LogMessage) and "destroyed before end()" in last.message
    assert spans_of(events)[-1].attributes["error.type"] == "unfinished"


@pytest.mark.parametrize(
    ("total", "delay_us", "restore_after"),
    [
        (60, 500, 40),
        # Steps slower than the writer's 10 ms poll: it wakes with nothing to write while the
        # disk is still full (a loss was once noted then, and the note itself was lost).
        (16, 25_000, 10),
    ],
)
def test_a_full_disk_loses_events_counted_and_said_without_blocking(
    driver: Path, tmp_path: Path, total: int, delay_us: int, restore_after: int
) -> None:
    journal_path = tmp_path / "build.jsonl"
    run = run_driver(
        driver,
        "steps",
        journal=journal_path,
        total=total,
        delay_us=delay_us,
        poll_ms=10,
        fsize_limit=3000,
        fsize_restore_after=restore_after,
    )
    assert run.summary["completed"], "a full disk must not stop or cancel the build"
    lost = run.summary["events_lost"]
    assert lost > 0
    assert "cannot write journal" in run.stderr

    journal = raw_reader.read_journal(journal_path)  # the file as written, its gap
    gaps = [p for p in journal.problems if p.kind == "seq_gap"]
    assert gaps, [str(p) for p in journal.problems]
    notes = [
        e
        for e in journal.events
        if isinstance(e, LogMessage) and "did not reach the journal" in e.message
    ]
    assert len(notes) == 1
    assert notes[0].severity == "error" and f"trt-otel: {lost} events" in notes[0].message
    assert "File too large" in notes[0].message
    # Every event is either in the journal or counted as lost.
    last_seq = journal.events[-1].seq
    assert len(journal.events) + lost == last_seq + 1
    assert journal.events[-1].type == "build_end"

    # watch, as the build's exporter, follows the journal past its gap to the build's end.
    done = subprocess.run(
        [*CLI, "watch", str(journal_path), "--no-progress",
         "--http-port", "0", "--no-gpu"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "seq jumps" in done.stderr


# -- sanitizers ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_sanitized_builds_are_clean(
    drivers: Callable[[str], Path], variant: str, tmp_path: Path
) -> None:
    """AddressSanitizer (with UndefinedBehaviorSanitizer and leak checks) and ThreadSanitizer
    halt with a non-zero exit on any report; every driver mode runs under them."""
    binary = drivers(variant)
    traces = [p.values[0] for p in trace_params() if p.values[0] is not None]  # type: ignore[attr-defined]
    if traces:
        run_driver(binary, "trace", trace=traces[0], journal=tmp_path / "trace.jsonl")
        read_clean(tmp_path / "trace.jsonl")
    run_driver(binary, "threads", journal=tmp_path / "threads.jsonl", threads=4, steps=300)
    read_clean(tmp_path / "threads.jsonl")
    breaks = write_trace(tmp_path / "breaks-trace.jsonl", PROTOCOL_BREAKS)
    run_driver(binary, "trace", trace=breaks, journal=tmp_path / "breaks.jsonl")
    read_clean(tmp_path / "breaks.jsonl")
    run = run_driver(
        binary, "steps", journal=tmp_path / "cancel.jsonl", total=50, delay_us=100, cancel_after=5
    )
    assert run.summary["refused"] is not None
    stop = tmp_path / "stop"
    stop.write_text("stop\n")
    run = run_driver(
        binary,
        "steps",
        journal=tmp_path / "file.jsonl",
        cancel_file=stop,
        poll_ms=5,
        total=500,
        delay_us=200,
    )
    assert run.summary["refused"] is not None
    run = run_driver(
        binary,
        "steps",
        journal=tmp_path / "full.jsonl",
        total=30,
        delay_us=200,
        poll_ms=5,
        fsize_limit=2000,
        fsize_restore_after=20,
    )
    assert run.summary["events_lost"] > 0
    run_driver(binary, "steps", journal=tmp_path / "noend.jsonl", total=5, delay_us=0, no_end=1)


# -- CMake -----------------------------------------------------------------------------------------

CONSUMER_CMAKE = """
cmake_minimum_required(VERSION 3.16)
project(consumer CXX)
if(USE_INSTALLED)
    find_package(trt_otel 0.1 CONFIG REQUIRED)
else()
    add_subdirectory(${TRT_OTEL_CPP} trt_otel)
endif()
add_executable(app main.cpp)
target_link_libraries(app PRIVATE trt_otel::progress_monitor)
target_include_directories(app SYSTEM PRIVATE ${NVIDIA_INCLUDES})
target_compile_options(app PRIVATE -Wall -Wextra -Werror)
"""

CONSUMER_MAIN = """
#include <trt_otel/progress_monitor.h>
int main(int argc, char** argv) {
    trt_otel::Options options;
    options.journal = argv[1];
    trt_otel::ProgressMonitor monitor(options);
    nvinfer1::IProgressMonitor& tensorrt = monitor;
    tensorrt.phaseStart("Building engine", nullptr, 1);
    bool const go_on = tensorrt.stepComplete("Building engine", 0);
    tensorrt.phaseFinish("Building engine");
    return argc == 2 && monitor.end(go_on) == trt_otel::Outcome::kSUCCESS ? 0 : 1;
}
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
@pytest.mark.parametrize("how", ["add_subdirectory", "find_package"])
def test_cmake_target_trt_otel_progress_monitor(tmp_path: Path, how: str) -> None:
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    (consumer / "CMakeLists.txt").write_text(CONSUMER_CMAKE)
    (consumer / "main.cpp").write_text(CONSUMER_MAIN)
    nvidia = f"{TENSORRT_INCLUDE};{cuda_include()}"
    defines = [f"-DNVIDIA_INCLUDES={nvidia}", f"-DTRT_OTEL_CPP={CPP}"]
    if how == "find_package":
        prefix = tmp_path / "prefix"
        for step in (
            [
                "cmake",
                "-S",
                str(CPP),
                "-B",
                str(tmp_path / "lib"),
                f"-DCMAKE_INSTALL_PREFIX={prefix}",
            ],
            ["cmake", "--install", str(tmp_path / "lib")],
        ):
            done = subprocess.run(step, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, done.stdout + done.stderr
        assert (prefix / "include" / "trt_otel" / "progress_monitor.h").is_file()
        defines += ["-DUSE_INSTALLED=ON", f"-DCMAKE_PREFIX_PATH={prefix}"]
    build = tmp_path / "build"
    for step in (
        ["cmake", "-S", str(consumer), "-B", str(build), *defines, *cmake_launcher()],
        ["cmake", "--build", str(build)],
    ):
        toolchain_step(step)
    journal_path = tmp_path / "build.jsonl"
    assert (
        subprocess.run([str(build / "app"), str(journal_path)], timeout=60, check=False).returncode
        == 0
    )
    assert fold(read_clean(journal_path).events).outcome is Outcome.SUCCESS


# -- trt-otel watch as the exporter and supervisor of a C++ build ---------------------------------


def received_shape(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """Received spans less what differs between two runs: times, the sending process."""
    return sorted(
        (
            dataclasses.replace(
                s,
                start_ns=0,
                end_ns=0,
                resource={
                    k: v
                    for k, v in s.resource.items()
                    if k != "service.instance.id" and not k.startswith("process.")
                },
            )
            for s in spans
        ),
        key=lambda s: s.span_id,
    )


def python_journal_of(events: list[Event], path: Path) -> None:
    """Python's monitor making the callbacks (and the cancel) the C++ journal records, in the
    same order, with the same build id and attributes, writing its own journal."""
    started = events[0]
    assert isinstance(started, BuildStarted)
    monitor = BuildMonitor(build_id=started.build_id, attributes=started.attributes)
    monitor.log.follow(JournalWriter(path))
    for event in events[1:]:
        if isinstance(event, PhaseStarted):
            monitor.phase_start(event.name, event.parent, event.num_steps)
        elif isinstance(event, StepCompleted):
            monitor.step_complete(event.name, event.step)
        elif isinstance(event, PhaseFinished):
            monitor.phase_finish(event.name)
        elif isinstance(event, CancelRequested):
            monitor.cancel(
                event.reason, source=event.source, timeout=event.timeout, policy=event.policy
            )
        elif isinstance(event, BuildFinished):
            monitor.end_with_result(b"engine" if event.outcome is Outcome.SUCCESS else None)
    assert monitor.close(10)


def http_json(url: str, *, data: bytes | None = None, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@pytest.mark.slow
@pytest.mark.parametrize("decider", ["POST /cancel", "--timeout"])
def test_watch_exports_serves_and_cancels_a_cpp_build(
    driver: Path, tmp_path: Path, decider: str
) -> None:
    journal_path = tmp_path / "build.jsonl"
    control = tmp_path / "control"
    http_port = free_port()
    build = subprocess.Popen(
        [str(driver), "steps", f"journal={journal_path}", f"cancel_file={control}",
         "total=100000", "delay_us=3000", "poll_ms=20", "model=/models/resnet.onnx"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    log = tmp_path / "watch.log"
    with otlp_receiver() as receiver, open(log, "w") as watch_stderr:
        options = ["--timeout", "1.5s"] if decider == "--timeout" else []
        watch = subprocess.Popen(
            [*CLI, "watch", str(journal_path),
             "--control-file", str(control), "--http-port", str(http_port),
             "--cancel-token", "secret", "--no-progress", "--no-gpu",
             "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}", "--otlp-protocol", "grpc",
             *options],
            stderr=watch_stderr,
        )  # fmt: skip
        try:
            status_url = f"http://127.0.0.1:{http_port}/status"
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, "watch never served the build's /status"
                try:
                    code, status = http_json(status_url)
                except OSError:
                    code, status = 0, None
                if code == 200 and status["steps_completed"] > 10:
                    break
                time.sleep(0.1)
            assert status["status"] == "running"
            assert status["attributes"]["model.path"] == "/models/resnet.onnx"
            assert [phase["name"] for phase in status["phases"]] == ["Building engine"]
            if decider == "POST /cancel":
                body = json.dumps({"reason": "stopped from the web page"}).encode()
                code, answer = http_json(
                    f"http://127.0.0.1:{http_port}/cancel", data=body, token="secret"
                )
                assert code == 202 and answer["first"], answer
            out, _ = build.communicate(timeout=60)
            watched = watch.wait(60)
        finally:
            build.kill()
            watch.kill()
        assert watched == 3, log.read_text()
        assert json.loads(out.strip().splitlines()[-1])["refused"] is not None

        events = read_clean(journal_path).events
        cancel = cancel_record(events)
        if decider == "POST /cancel":
            assert (cancel["reason"], cancel["source"], cancel["timeout"]) == (
                "stopped from the web page",
                "http",
                False,
            )
            assert fold(events).outcome is Outcome.CANCELLATION
        else:
            assert (cancel["reason"], cancel["source"], cancel["timeout"], cancel["policy"]) == (
                "the build ran past its timeout of 1.5s",
                "timeout",
                True,
                "timeout(1.5s)",
            )
            assert fold(events).outcome is Outcome.TIMEOUT
            assert cancel["mono_ns"] - events[0].mono_ns >= 1_500_000_000

        phases = sum(1 for e in events if e.type == "phase_start")
        watched_spans = receiver.wait_for_final(phases + 1)
        assert len(watched_spans) == phases + 1
        build_span = next(s for s in watched_spans if s.name == "BUILD resnet.onnx")
        assert build_span.attributes["trt.cancel.source"] == cancel["source"]

        # The same callbacks made in Python, replayed to the same receiver: the same spans.
        receiver.clear()
        python_journal = tmp_path / "python.jsonl"
        python_journal_of(events, python_journal)
        replay = subprocess.run(
            [*CLI, "replay", str(python_journal),
             "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}",
             "--otlp-protocol", "grpc"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert replay.returncode == 3, replay.stderr  # replay exits as the build did: cancelled
        assert received_shape(receiver.wait_for_final(phases + 1)) == received_shape(watched_spans)


def test_watch_refuses_options_it_cannot_honour(tmp_path: Path) -> None:
    journal_path = tmp_path / "build.jsonl"
    journal_path.write_text('{"format":"trt-otel-journal","version":1}\n')
    for arguments, message in (
        (["--timeout", "1h"], "need --control-file"),
        (["--journal", str(tmp_path / "x.jsonl")], "--journal does not apply"),
        (["--http-port", "0", "--gpu", "0"], "does not sample the GPU"),
    ):
        done = subprocess.run(
            [*CLI, "watch", str(journal_path), *arguments],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, done.stderr
    done = subprocess.run(
        [*CLI, "watch", "--url", "http://127.0.0.1:1",
         "--http-port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "only shows the build" in done.stderr


def test_the_journal_names_its_writer_and_is_touched_through_a_silence(
    driver: Path, tmp_path: Path
) -> None:
    """What `watch` needs to tell a silent C++ build from a lost one (trt_otel.capture.liveness)."""
    journal_path = tmp_path / "build.jsonl"
    build = subprocess.Popen(
        [str(driver), "steps", f"journal={journal_path}", "total=1", "delay_us=30000000",
         "poll_ms=20", "touch_ms=200"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_text(journal_path, b"Timing tactics", timeout_s=30)
        header = json.loads(journal_path.read_bytes().splitlines()[0])
        assert header["writer_pid"] == build.pid
        assert header["writer_host"] == socket.gethostname()
        assert header["touch_interval_s"] == 0.2
        before = journal_path.stat()
        wait_until(
            lambda: journal_path.stat().st_mtime_ns > before.st_mtime_ns,
            "the silent build's journal touched (every 200 ms)",
            timeout_s=10,
        )
        after = journal_path.stat()
        assert after.st_size == before.st_size, "the build is silent: nothing new to write"

        # Killed in its silence: `watch` sees at once that the writer is gone.
        watch = subprocess.Popen(
            [*CLI, "watch", str(journal_path), "--no-progress",
             "--lost-after", "300s"],
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        wait_until(lambda: holds_open(watch.pid, journal_path), "watch following the journal", 60)
        build.kill()
        build.wait(30)
        _, stderr = watch.communicate(timeout=60)
        assert watch.returncode == 2, stderr
        assert f"pid {build.pid}" in stderr and "gone" in stderr
    finally:
        build.kill()
        build.wait(30)


def test_a_writer_that_cannot_keep_up_drops_counted_events_and_never_blocks_the_build(
    driver: Path, tmp_path: Path
) -> None:
    """The journal is a pipe nobody reads (a hung disk): the writer blocks in write(); the
    build still completes, the events beyond max_pending are counted as lost, and once the
    pipe is read again the journal says so."""
    fifo = tmp_path / "journal.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read until the end
    build = subprocess.Popen(
        [str(driver), "steps", f"journal={fifo}", "total=4000", "delay_us=0", "max_pending=500",
         "poll_ms=10", "end_timeout_ms=200"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert build.stdout is not None
        line = build.stdout.readline()  # printed after end(), while the pipe is still full
        summary = json.loads(line)
        assert summary["completed"], "the build must not be cancelled or stopped by its journal"
        assert summary["events_lost"] > 0
        os.set_blocking(reader, True)
        data = b""
        while chunk := os.read(reader, 1 << 16):
            data += chunk
        assert build.wait(60) == 0
    finally:
        os.close(reader)
        build.kill()
        build.communicate(timeout=30)
    journal_path = tmp_path / "copy.jsonl"
    journal_path.write_bytes(data)
    journal = raw_reader.read_journal(journal_path)  # the file as written, its gap
    assert {p.kind for p in journal.problems} == {"seq_gap"}
    notes = [e for e in journal.events if isinstance(e, LogMessage) and "keep up" in e.message]
    assert len(notes) == 1 and f"{summary['events_lost']} events" in notes[0].message
    assert len(journal.events) + summary["events_lost"] == journal.events[-1].seq + 1
    assert any(e.type == "build_end" for e in journal.events)


def test_exactly_max_pending_events_wait_for_a_sleeping_writer(
    driver: Path, tmp_path: Path
) -> None:
    """The writer sleeps through the whole build (its poll is ten minutes; only end() wakes it):
    the first max_pending events wait for it, every ordinary one past them is dropped and
    counted, and the build's end is kept all the same."""
    journal_path = tmp_path / "build.jsonl"
    run = run_driver(
        driver, "steps", journal=journal_path, total=1, delay_us=0, poll_ms=600_000, max_pending=4
    )
    # build_start, "Building engine" and "Timing tactics" started, its first step (4 waiting);
    # its 2 other steps, its finish, the step of "Building engine" and its finish dropped (5).
    assert run.summary["events_lost"] == 5
    journal = raw_reader.read_journal(journal_path)  # the file as written, its gap
    assert [(e.seq, e.type) for e in journal.events[:5]] == [
        (0, "build_start"),
        (1, "phase_start"),
        (2, "phase_start"),
        (3, "step"),
        (9, "build_end"),
    ]
    notes = [e for e in journal.events if isinstance(e, LogMessage) and "keep up" in e.message]
    assert len(notes) == 1 and "trt-otel: 5 events" in notes[0].message


def test_end_returns_as_soon_as_the_build_end_is_written(driver: Path, tmp_path: Path) -> None:
    """end() wakes the writer (asleep for its ten-minute poll) and returns once the build_end
    is written, long before its end_timeout (20 s), whatever else the batch held."""
    journal_path = tmp_path / "build.jsonl"
    started = time.monotonic()
    run = run_driver(
        driver,
        "steps",
        journal=journal_path,
        total=3,
        delay_us=0,
        poll_ms=600_000,
        end_timeout_ms=20_000,
    )
    assert time.monotonic() - started < 10, "end() waited for its timeout"
    assert run.summary["completed"]
    assert read_clean(journal_path).events[-1].type == "build_end"


def test_a_timeout_the_writer_finds_passed_after_the_build_ended_cancels_nothing(
    driver: Path, tmp_path: Path
) -> None:
    """The writer checks the timeout only when it wakes: one that passed while it slept through
    a whole short build (1 ms, its poll ten minutes) is no cancel of a build that has ended."""
    journal_path = tmp_path / "build.jsonl"
    run = run_driver(
        driver, "steps", journal=journal_path, total=3, delay_us=2000, timeout_ms=1, poll_ms=600_000
    )
    assert run.summary["completed"]
    events = read_clean(journal_path).events
    assert [e.type for e in events if e.type in ("cancel", "build_end")] == ["build_end"]
    assert fold(events).outcome is Outcome.SUCCESS


def test_the_logger_records_tensorrts_warnings_on_the_build_span(
    driver: Path, tmp_path: Path
) -> None:
    journal_path = tmp_path / "build.jsonl"
    run_driver(driver, "steps", journal=journal_path, total=2, delay_us=0, log="weights are FP32")
    events = read_clean(journal_path).events
    logs = [(e.severity, e.message) for e in events if isinstance(e, LogMessage)]
    assert logs == [("warning", "weights are FP32")], "verbose messages are left out by default"
    build_span = spans_of(events)[-1]
    assert [(e.name, e.attributes) for e in build_span.events] == [
        ("trt.log", {"log.severity": "warning", "log.message": "weights are FP32"})
    ]


@pytest.mark.slow
def test_watch_stops_a_build_silent_past_its_cancel_from_outside(
    driver: Path, tmp_path: Path
) -> None:
    """TensorRT silent for a minute: the cancel reaches the C++ monitor (it records it) but no
    step comes to refuse. --terminate-after later watch stops the process and ends the
    journal, as `trt-otel build` stops its worker."""
    journal_path, control = tmp_path / "build.jsonl", tmp_path / "control"
    build = subprocess.Popen(
        [str(driver), "steps", f"journal={journal_path}", f"cancel_file={control}", "total=3",
         "delay_us=60000000", "poll_ms=20"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        began = time.monotonic()
        done = subprocess.run(
            [*CLI, "watch", str(journal_path), "--no-progress",
             "--control-file", str(control), "--timeout", "1s", "--terminate-after", "1s"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        took = time.monotonic() - began
        assert done.returncode == 3, done.stderr
        assert took < 30, f"took {took:.1f}s"
        assert build.wait(30) == -signal.SIGTERM
    finally:
        build.kill()
        build.wait(30)
    events = read_clean(journal_path).events
    cancel = cancel_record(events)
    assert cancel["source"] == "timeout", "the C++ monitor recorded watch's decision"
    state = fold(events)
    assert state.outcome is Outcome.TIMEOUT and state.error_type == "timeout"
    assert state.outcome_detail == (
        "the build ran past its timeout of 1.0s; TensorRT had not stopped 1.0s later, "
        "so its process was stopped with SIGTERM"
    )
    assert not state.open_by_name
    assert spans_of(events)[-1].attributes["cicd.pipeline.result"] == "timeout"


@pytest.mark.slow
def test_watch_ends_a_stopped_builds_unchecked_journal_without_a_gap(
    driver: Path, tmp_path: Path
) -> None:
    """The build_end watch appends for a build it stopped follows the journal's own last seq,
    not the checked numbering (one more here, for the anomaly trt-otel found)."""
    trace = tmp_path / "silent.jsonl"
    lines = [
        {"cb": "phase_start", "phase_name": "Building engine", "parent_phase": None,
         "num_steps": 3},
        {"cb": "step_complete", "phase_name": "Ghost", "step": 0},  # not open: an anomaly
        {"cb": "step_complete", "phase_name": "Building engine", "step": 0,
         "delay_us": 60_000_000},  # TensorRT silent for a minute
    ]  # fmt: skip
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    journal_path, control = tmp_path / "build.jsonl", tmp_path / "control"
    build = subprocess.Popen(
        [str(driver), "trace", f"trace={trace}", f"journal={journal_path}",
         f"cancel_file={control}", "poll_ms=20"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        done = subprocess.run(
            [*CLI, "watch", str(journal_path), "--no-progress",
             "--control-file", str(control), "--timeout", "1s", "--terminate-after", "1s"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 3, done.stderr
        assert build.wait(30) == -signal.SIGTERM
    finally:
        build.kill()
        build.wait(30)
    as_written = raw_reader.read_journal(journal_path)
    assert as_written.problems == [], [str(p) for p in as_written.problems]
    assert as_written.events[-1].type == "build_end"
    events = read_clean(journal_path).events
    assert [e.kind.value for e in events if isinstance(e, Anomaly)] == ["step_for_unknown_phase"]
    assert fold(events).outcome is Outcome.TIMEOUT


CANCEL_PROGRAM = r"""
#include <trt_otel/progress_monitor.h>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>

// argv: JOURNAL CANCEL_FILE ("" for none). Prints one word on stdout:
// "flushed" when the cancel reached the journal well before the next poll (a minute away).
static bool journalHas(char const* path, char const* text)
{
    std::ifstream in(path);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all.find(text) != std::string::npos;
}

int main(int argc, char** argv)
{
    if (argc != 3)
        return 2;
    trt_otel::Options options;
    options.journal = argv[1];
    options.cancel_file = argv[2];
    options.poll_interval = std::chrono::milliseconds(std::string(argv[2]).empty() ? 60000 : 10);
    trt_otel::ProgressMonitor monitor(options);
    monitor.start();
    monitor.phaseStart("Building engine", nullptr, 1000);
    if (std::string(argv[2]).empty())
    {
        bool const first = monitor.cancel("the first reason", "user");
        bool const second = monitor.cancel("a second reason", "timeout", true);
        if (!first || second)
            return 3;
        auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!journalHas(argv[1], "\"cancel\"") && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::cout << (journalHas(argv[1], "\"cancel\"") ? "flushed" : "late") << "\n";
    }
    else
    {
        auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        int32_t step = 0;
        while (monitor.stepComplete("Building engine", step % 1000)
            && std::chrono::steady_clock::now() < deadline)
        {
            ++step;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::cout << (monitor.cancelled() ? "cancelled" : "never") << "\n";
    }
    monitor.phaseFinish("Building engine");
    monitor.end(false);
    return 0;
}
"""


def compile_program(
    tmp_path_factory: pytest.TempPathFactory, name: str, source: str, warnings: Sequence[str]
) -> Path:
    """A small program against the header, compiled once for the module."""
    directory = tmp_path_factory.mktemp(f"{name}-program")
    unit, binary = directory / f"{name}.cpp", directory / name
    unit.write_text(source)
    return build_program(unit, binary, [*warnings, "-O1", *include_flags()])


@pytest.fixture(scope="module")
def cancel_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_program(tmp_path_factory, "cancel", CANCEL_PROGRAM, WARNINGS)


def test_only_the_first_cancel_is_an_event_and_it_is_written_at_once(
    cancel_program: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "build.jsonl"
    done = subprocess.run(
        [str(cancel_program), str(journal), ""],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.split() == ["flushed"], "the cancel waited for the next poll (a minute)"
    cancel = cancel_record(read_clean(journal).events)  # exactly one
    assert (cancel["reason"], cancel["source"], cancel["timeout"]) == (
        "the first reason",
        "user",
        False,
    )


def cancelled_by(cancel_program: Path, folder: Path, control_line: bytes) -> dict[str, Any]:
    """The cancel the C++ monitor records from a control file holding ``control_line``."""
    journal, control = folder / "build.jsonl", folder / "control"
    control.write_bytes(control_line)
    done = subprocess.run(
        [str(cancel_program), str(journal), str(control)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.split() == ["cancelled"]
    return cancel_record(read_clean(journal).events)


@pytest.mark.parametrize(
    ("source", "recorded"),
    [
        ("stall", "stall"),
        ("made-up", "file"),
        ("x" * 300, "file"),
        ('user"} {"injected', "file"),
        ("", "file"),
    ],
)
def test_a_control_files_source_is_one_of_the_known_kinds(
    cancel_program: Path, tmp_path: Path, source: str, recorded: str
) -> None:
    line = json.dumps({"reason": "stop it", "source": source}) + "\n"
    cancel = cancelled_by(cancel_program, tmp_path, line.encode())
    assert (cancel["reason"], cancel["source"]) == ("stop it", recorded)


@pytest.mark.parametrize("character", ["é", "構", "😀"])
def test_a_long_reason_of_any_script_keeps_its_source_policy_and_timeout(
    cancel_program: Path, tmp_path: Path, character: str
) -> None:
    """watch's control line for a reason longer than the monitor keeps, in characters of two,
    three and four bytes: the monitor reads it whole, so the cancel keeps what watch decided,
    with as much of the reason as fits."""
    reason, policy = character * 300, "stall(10m)"
    line = control_line(reason, source="stall", timeout=True, policy=policy)
    cancel = cancelled_by(cancel_program, tmp_path, line)
    assert (cancel["source"], cancel["policy"], cancel["timeout"]) == ("stall", policy, True)
    assert 50 <= len(cancel["reason"]) <= 200
    assert reason.startswith(cancel["reason"])


NULL_NAMES_PROGRAM = r"""
#include <trt_otel/progress_monitor.h>
int main(int, char** argv)
{
    trt_otel::Options options;
    options.journal = argv[1];
    trt_otel::ProgressMonitor monitor(options);
    monitor.phaseStart(nullptr, nullptr, 2);
    bool const answered = monitor.stepComplete(nullptr, 0);
    monitor.phaseFinish(nullptr);
    monitor.end(true);
    monitor.stepComplete("Building engine", 0); // after the end: recorded as it comes
    return answered ? 0 : 3;
}
"""


def test_a_null_phase_name_is_the_recorders_own_note(tmp_path: Path) -> None:
    """The journal cannot hold a null pointer as a name: the recorder notes it (its only
    anomaly) and records the callback under "(null)", which the checks then take as any name.
    A callback after end() is recorded plainly: the checks find it outside the build."""
    unit, binary, journal = tmp_path / "null.cpp", tmp_path / "null", tmp_path / "build.jsonl"
    unit.write_text(NULL_NAMES_PROGRAM)
    command = ["g++", "-std=c++17", *WARNINGS, "-O1", *include_flags(), str(unit)]
    done = subprocess.run(
        [*command, "-o", str(binary), "-pthread"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert subprocess.run([str(binary), str(journal)], timeout=60, check=False).returncode == 0
    events = read_clean(journal).events
    as_written = raw_reader.read_journal(journal).events
    assert [e.type for e in as_written[-2:]] == ["build_end", "step"]
    notes = [(e.kind.value, e.detail) for e in events if isinstance(e, Anomaly)]
    assert notes == [
        *[("invalid_argument", "phase_name is a null pointer, not a str")] * 3,
        (
            "callback_outside_build",
            "a callback arrived after the build ended; one monitor serves one build",
        ),
        ("step_for_unknown_phase", "step 0 of 'Building engine', not open"),
    ]
    state = fold(events)
    assert state.outcome is Outcome.SUCCESS and sum(state.anomalies.values()) == 5
    assert [state.phases[root].name for root in state.roots] == ["(null)"]


LIFECYCLE_PROGRAM = r"""
#include <trt_otel/progress_monitor.h>
#include <cstring>
#include <iostream>

// argv: JOURNAL unused|again. "unused": a monitor made and destroyed without a build; "again":
// a one-step build ended as a success, then end() called again with no engine; prints the
// outcome each end() returned.
int main(int argc, char** argv)
{
    if (argc != 3)
        return 2;
    trt_otel::Options options;
    options.journal = argv[1];
    trt_otel::ProgressMonitor monitor(options);
    if (std::strcmp(argv[2], "again") == 0)
    {
        monitor.phaseStart("Building engine", nullptr, 1);
        monitor.stepComplete("Building engine", 0);
        monitor.phaseFinish("Building engine");
        std::cout << trt_otel::toString(monitor.end(true)) << "\n";
        std::cout << trt_otel::toString(monitor.end(false, "too late")) << "\n";
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def lifecycle_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_program(tmp_path_factory, "lifecycle", LIFECYCLE_PROGRAM, WARNINGS)


def run_lifecycle(program: Path, journal: Path, how: str) -> list[str]:
    done = subprocess.run(
        [str(program), str(journal), how], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    return done.stdout.split()


def test_a_monitor_destroyed_without_a_build_leaves_only_the_header(
    lifecycle_program: Path, tmp_path: Path
) -> None:
    """No callback, no start(): there was no build, so nothing to call unfinished."""
    journal = tmp_path / "build.jsonl"
    assert run_lifecycle(lifecycle_program, journal, "unused") == []
    lines = journal.read_bytes().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["format"] == "trt-otel-journal"


def test_end_called_again_changes_nothing_and_returns_the_recorded_outcome(
    lifecycle_program: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "build.jsonl"
    assert run_lifecycle(lifecycle_program, journal, "again") == ["success", "success"]
    events = read_clean(journal).events
    assert [e.type for e in events].count("build_end") == 1
    assert fold(events).outcome is Outcome.SUCCESS


JOURNAL_PROGRAM = r"""
#include <trt_otel/progress_monitor.h>
#include <iostream>
#include <string>

// argv: JOURNAL [hold]. Records a one-step build in JOURNAL; with "hold", says "holding" once
// the journal is open and waits for a line on stdin before it ends the build. Prints "opened"
// (exit 0), "busy: WHAT" (JournalBusyError, exit 3) or "error: WHAT" (exit 4).
int main(int argc, char** argv)
{
    if (argc < 2)
        return 2;
    trt_otel::Options options;
    options.journal = argv[1];
    options.poll_interval = std::chrono::milliseconds(10);
    try
    {
        trt_otel::ProgressMonitor monitor(options);
        monitor.phaseStart("Building engine", nullptr, 1);
        monitor.stepComplete("Building engine", 0);
        if (argc > 2)
        {
            std::cout << "holding" << std::endl;
            std::string line;
            std::getline(std::cin, line);
        }
        monitor.phaseFinish("Building engine");
        monitor.end(true);
    }
    catch (trt_otel::JournalBusyError const& error)
    {
        std::cout << "busy: " << error.what() << std::endl;
        return 3;
    }
    catch (std::exception const& error)
    {
        std::cout << "error: " << error.what() << std::endl;
        return 4;
    }
    std::cout << "opened" << std::endl;
    return 0;
}
"""


@pytest.fixture(scope="module")
def journal_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_program(tmp_path_factory, "journal", JOURNAL_PROGRAM, STRICT)


def open_journal_from_cpp(program: Path, journal: Path) -> tuple[int, str]:
    """The program's exit code and what it said; a constructor that blocks fails the test."""
    done = subprocess.run(
        [str(program), str(journal)], capture_output=True, text=True, timeout=30, check=False
    )
    return done.returncode, done.stdout.strip()


def test_a_journal_a_python_build_writes_is_refused_by_the_cpp_monitor_and_left_whole(
    journal_program: Path, tmp_path: Path
) -> None:
    """A Python build writes the journal (it holds its lock): the C++ monitor given the same
    path refuses it (JournalBusyError, naming the writer) and neither empties nor writes it, so
    the Python build's record stays one whole build."""
    journal = tmp_path / "build.jsonl"
    now = time.monotonic_ns()
    started = BuildStarted(
        seq=0, wall_ns=time.time_ns(), mono_ns=now, thread="Main", build_id="a" * 32,
        attributes={"model.path": "python.onnx"},
    )  # fmt: skip
    writer = JournalWriter(journal)
    writer.handle(
        [started, PhaseStarted(seq=1, wall_ns=time.time_ns(), mono_ns=now, thread="Main",
                               name="Building engine", parent=None, num_steps=2)]
    )  # fmt: skip
    try:
        before = journal.read_bytes()
        code, said = open_journal_from_cpp(journal_program, journal)
        assert code == 3, said
        assert said == (
            f"busy: trt-otel: journal {journal} is already being written by trt-otel pid "
            f"{os.getpid()} on host {socket.gethostname()} (give each build its own journal)"
        )
        assert journal.read_bytes() == before
        writer.handle(
            [StepCompleted(seq=2, wall_ns=time.time_ns(), mono_ns=now, thread="Main",
                           name="Building engine", step=0),
             PhaseFinished(seq=3, wall_ns=time.time_ns(), mono_ns=now, thread="Main",
                           name="Building engine"),
             BuildFinished(seq=4, wall_ns=time.time_ns(), mono_ns=now, thread="Main",
                           outcome=Outcome.SUCCESS, detail="", error_type=None)]
        )  # fmt: skip
    finally:
        writer.close()
    events = read_clean(journal).events
    assert [e.type for e in events] == [
        "build_start", "phase_start", "step", "phase_finish", "build_end"
    ]  # fmt: skip
    assert isinstance(events[0], BuildStarted) and events[0].build_id == "a" * 32


def test_the_journal_a_cpp_build_writes_is_locked_as_pythons_and_replaced_once_it_ends(
    journal_program: Path, tmp_path: Path
) -> None:
    """The C++ monitor takes the lock Python's writer takes: while it writes, Python's writer
    and a second C++ monitor are refused, naming it; once it has ended, a new build (C++ or
    Python) writes the path afresh, as Python's writer does a finished journal."""
    journal = tmp_path / "build.jsonl"
    holder = subprocess.Popen(
        [str(journal_program), str(journal), "hold"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "holding"
        named = (
            f"trt-otel pid {holder.pid} on host {socket.gethostname()} "
            "(give each build its own journal)"
        )
        with pytest.raises(raw_journal.JournalBusyError) as refused:
            JournalWriter(journal)
        assert str(refused.value.strerror) == f"already being written by {named}"
        assert raw_journal.journal_in_use(journal) == named
        code, said = open_journal_from_cpp(journal_program, journal)
        assert (code, said) == (3, f"busy: trt-otel: journal {journal} is already being "
                                   f"written by {named}")  # fmt: skip
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    finally:
        holder.kill()
        holder.wait()
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
    assert raw_journal.journal_in_use(journal) is None  # released with the process
    assert open_journal_from_cpp(journal_program, journal) == (0, "opened")
    events = read_clean(journal).events  # one build: the first was replaced, not appended to
    assert [e.type for e in events] == [
        "build_start", "phase_start", "step", "phase_finish", "build_end"
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["named pipe", "directory", "device"])
def test_a_journal_that_is_not_a_regular_file_is_refused_at_once_by_the_cpp_monitor(
    journal_program: Path, tmp_path: Path, kind: str
) -> None:
    """Documented to throw: a named pipe nobody reads, a directory or a device given as the
    journal is refused at once, in words; never opened blocking (the constructor waited for
    ever on a pipe with no reader), never written."""
    journal = tmp_path / "build.jsonl"
    if kind == "named pipe":
        os.mkfifo(journal)
        expected = f"error: trt-otel: journal {journal} is a named pipe that nobody reads"
    else:
        if kind == "directory":
            journal.mkdir()
        else:
            journal = Path(os.devnull)
        expected = f"error: trt-otel: journal {journal} is a {kind}, not a regular file"
    assert open_journal_from_cpp(journal_program, journal) == (4, expected)


def test_a_named_pipe_with_a_reader_is_a_consumers_stream_of_the_journal(
    journal_program: Path, tmp_path: Path
) -> None:
    """A named pipe that a consumer reads is written as the journal would be: the reader gets
    the whole journal, and the C++ monitor neither locks nor empties it."""
    journal = tmp_path / "build.jsonl"
    os.mkfifo(journal)
    reader = os.open(journal, os.O_RDONLY | os.O_NONBLOCK)
    try:
        code, said = open_journal_from_cpp(journal_program, journal)
        os.set_blocking(reader, True)
        streamed = b""
        while chunk := os.read(reader, 65536):
            streamed += chunk
    finally:
        os.close(reader)
    assert code == 0, said
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(streamed)
    types = [e.type for e in read_clean(copy).events]
    assert (types[0], types[-1]) == ("build_start", "build_end"), types
