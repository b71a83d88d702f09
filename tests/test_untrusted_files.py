"""Files from outside that must not hang, crash or quietly lose trt-otel's record: named pipes,
devices, directories, journals nested deeper than Python recurses, journals truncated in place,
lines with no end, and two builds given one journal. Every case runs on the real thing (a FIFO
from ``os.mkfifo``, a link to ``/dev/zero``, a real directory, real ``trt-otel`` processes)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
import pytest

from cli import CLI, run_cli
from journals import write_journal
from trt_otel.builder.simulator import TraceError, load_trace
from trt_otel.core.eta import History
from trt_otel.core.events import (
    BuildFinished,
    BuildStarted,
    Event,
    LogMessage,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    StepCompleted,
)
from trt_otel.core.files import MAX_LINE_BYTES
from trt_otel.core.journal import JournalBusyError, JournalWriter
from trt_otel.core.journal_codec import JournalError, encode_events
from trt_otel.core.journal_reader import TRUNCATED_ATTRIBUTE, LineReader, read_journal
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState
from waiting import wait_for_text, wait_until

COMMAND_TIMEOUT_S = 30
"""Each command's limit: a hang fails the test here, well inside any test timeout."""


def trt_otel(*args: str | Path, timeout_s: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
    """Run ``trt-otel ARGS`` and return its exit code and what it wrote; a hang fails."""
    try:
        done = run_cli(*args, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"trt-otel {' '.join(map(str, args))} hung ({timeout_s}s)")
    return done.returncode, done.stdout + done.stderr


def assert_refused(code: int, output: str, message: str) -> None:
    """Exit code 2, one line that says why, and no traceback."""
    assert "Traceback" not in output, output
    assert code == 2, output
    errors = [line for line in output.splitlines() if line.startswith("trt-otel: error:")]
    assert len(errors) == 1, output
    assert message in errors[0], output


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return path


@pytest.fixture
def zero(tmp_path: Path) -> Path:
    path = tmp_path / "zero.jsonl"
    path.symlink_to("/dev/zero")
    return path


def nested(depth: int, *, ended: bool) -> list[Event]:
    """A build whose phases nest ``depth`` deep, each the child of the one before."""
    events: list[Event] = [BuildStarted(seq=0, wall_ns=1, mono_ns=1, thread="t", build_id="b")]
    for level in range(depth):
        parent = f"p{level - 1}" if level else None
        seq = len(events)
        events.append(
            PhaseStarted(
                seq=seq,
                wall_ns=seq,
                mono_ns=seq,
                thread="t",
                name=f"p{level}",
                parent=parent,
                num_steps=2,
            )
        )
    if ended:
        seq = len(events)
        events.append(
            BuildFinished(seq=seq, wall_ns=seq, mono_ns=seq, thread="t", outcome=Outcome.SUCCESS)
        )
    return events


# -- 1. named pipes and devices: refused, never opened blocking nor read without end ------------


@pytest.mark.e2e
def test_replay_of_a_fifo_with_no_writer_is_refused_at_once(fifo: Path) -> None:
    assert_refused(*trt_otel("replay", fifo), "a named pipe, not a regular file")


@pytest.mark.e2e
def test_watch_of_a_fifo_with_no_writer_is_refused_at_once(fifo: Path) -> None:
    assert_refused(*trt_otel("watch", fifo), "a named pipe, not a regular file")


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_watch_with_a_control_file_of_a_fifo_or_device_is_refused_at_once(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    journal = request.getfixturevalue(kind)
    code, output = trt_otel("watch", journal, "--control-file", tmp_path / "control")
    assert_refused(code, output, "not a regular file")


@pytest.mark.e2e
def test_demo_trace_of_a_fifo_with_no_writer_is_refused_at_once(fifo: Path) -> None:
    assert_refused(*trt_otel("demo", "--trace", fifo), "a named pipe, not a regular file")


@pytest.mark.e2e
def test_a_journal_on_a_fifo_is_refused_before_the_build(fifo: Path, tmp_path: Path) -> None:
    code, output = trt_otel("demo", "--speed", "0", "--journal", fifo)
    assert_refused(code, output, f"--journal {fifo} is a named pipe, not a regular file")
    assert "build success" not in output


@pytest.mark.e2e
def test_a_journal_in_a_folder_that_does_not_exist_is_refused_and_no_folder_made(
    tmp_path: Path,
) -> None:
    """A typo in ``--journal``'s folder made that folder (and every one above it), wherever
    the path pointed; the engine's folder must exist, and so must the journal's."""
    journal = tmp_path / "typo" / "deeper" / "j.jsonl"
    code, output = trt_otel("demo", "--speed", "0", "--no-progress", "--journal", journal)
    assert_refused(code, output, f"cannot write journal {journal}: no folder {journal.parent}")
    assert not (tmp_path / "typo").exists()


@pytest.mark.e2e
def test_the_journal_writer_never_blocks_on_a_fifo(fifo: Path) -> None:
    """Past every check (a path swapped for a FIFO after them): the writer itself refuses,
    whether or not a reader holds the pipe open. In a process of its own, so that a writer
    that blocks fails the test rather than hanging it."""
    program = (
        "import os, sys\n"
        "from trt_otel.core.files import FileKindError\n"
        "from trt_otel.core.journal import JournalWriter\n"
        "for reading in (False, True):\n"
        "    reader = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK) if reading else None\n"
        "    try:\n"
        "        JournalWriter(sys.argv[1])\n"
        "    except FileKindError as error:\n"
        "        print('refused:', error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(fifo)],
        check=False,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("is a named pipe, not a regular file") == 2, done.stdout


@pytest.mark.e2e
def test_instrument_with_a_fifo_journal_raises_rather_than_hangs(fifo: Path) -> None:
    program = (
        "import trt_otel\n"
        "try:\n"
        f"    trt_otel.instrument(journal={str(fifo)!r})\n"
        "except ValueError as error:  # InstrumentError\n"
        "    print('refused:', error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        check=False,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert f"refused: journal {fifo} is a named pipe, not a regular file" in done.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("command", [["replay"], ["watch"], ["demo", "--trace"]])
def test_a_link_to_dev_zero_is_refused_not_read(zero: Path, command: list[str]) -> None:
    assert_refused(*trt_otel(*command, zero), "a device, not a regular file")


@pytest.mark.e2e
def test_a_journal_linked_to_dev_zero_is_refused(zero: Path) -> None:
    assert_refused(
        *trt_otel("demo", "--speed", "0", "--journal", zero), "is a device, not a regular file"
    )


@pytest.mark.e2e
def test_history_skips_fifos_devices_and_directories(tmp_path: Path) -> None:
    history = tmp_path / "history"
    history.mkdir()
    os.mkfifo(history / "a.jsonl")
    (history / "b.jsonl").symlink_to("/dev/zero")
    (history / "c.jsonl").mkdir()
    code, output = trt_otel("demo", "--speed", "0", "--history", history)
    assert "Traceback" not in output
    assert code == 0, output
    assert "3 journals not used" in output
    skipped = History.load(history).skipped
    assert [reason.split(":")[0] for reason in skipped] == ["a.jsonl", "b.jsonl", "c.jsonl"]
    assert "a named pipe" in skipped[0]
    assert "a device" in skipped[1]
    assert "a directory" in skipped[2]


# -- 2. what made tracebacks ---------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["build", "demo"])
def test_a_directory_as_the_model_is_a_usage_error(command: str, tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    model.mkdir()
    args: list[str | Path] = (
        ["build", model, "-o", tmp_path / "e.engine"]
        if command == "build"
        else ["demo", "--speed", "0", "--model", model]
    )
    assert_refused(*trt_otel(*args), f"model path is a directory: {model}")


@pytest.mark.e2e
@pytest.mark.parametrize("ended", [False, True])
def test_replay_of_phases_nested_a_thousand_deep(tmp_path: Path, ended: bool) -> None:
    path = write_journal(tmp_path / "deep.jsonl", nested(1000, ended=ended))
    code, output = trt_otel("replay", path)
    assert "Traceback" not in output and "RecursionError" not in output, output[-3000:]
    assert code == (0 if ended else 4), output[-3000:]
    assert "p0" in output


def test_the_fold_never_recurses_on_depth() -> None:
    """Deeper than any recursion limit: the progress of the outermost phase, and a subtree
    the read model forgets (a second finished instance of a name drops the first's children)."""
    depth = sys.getrecursionlimit() * 3
    state = BuildState()
    for event in nested(depth, ended=False):
        state.apply(event)
    assert state.phase_progress(state.roots[0]) == 0.0
    assert state.progress_ratio() == 0.0

    model = ReadModel()
    events: list[Event] = [BuildStarted(seq=0, wall_ns=0, mono_ns=0, thread="t", build_id="b")]

    def add(kind: type[PhaseStarted] | type[PhaseFinished], name: str, **fields: object) -> None:
        seq = len(events)
        events.append(kind(seq=seq, wall_ns=seq, mono_ns=seq, thread="t", name=name, **fields))  # type: ignore[arg-type]

    add(PhaseStarted, "root", parent=None, num_steps=1)
    for _ in range(2):  # the same chain twice under root
        for level in range(depth):
            add(PhaseStarted, f"c{level}", parent=f"c{level - 1}" if level else "root", num_steps=1)
        for level in reversed(range(depth)):
            add(PhaseFinished, f"c{level}")
    model.handle(events)
    with model.reading():
        assert model.state.phase_progress(model.state.roots[0]) == 0.0
        assert len(model.state.phases) < depth + 10  # the first chain's subtree was forgotten


def test_closing_the_outermost_of_deeply_nested_phases_takes_one_pass() -> None:
    """Its open descendants are found in one pass over the open phases, not by walking each
    one's ancestors (which took minutes for a journal a few MB long)."""
    depth = 50_000
    events = nested(depth, ended=False)
    events.append(PhaseFinished(seq=len(events), wall_ns=0, mono_ns=0, thread="t", name="p0"))
    model = ReadModel()
    started = time.monotonic()
    model.handle(events)
    assert time.monotonic() - started < 10  # about 0.1 s; walking the ancestors took a minute
    assert not model.state.open_by_name
    assert model.state.phases[1].close_reason is None  # p0 finished
    assert model.state.phases[depth].close_reason == "its parent finished first"


def truncated_in_place(path: Path, events: Sequence[Event], cut: int, nuls: int) -> Path:
    """What logrotate's copytruncate leaves of a journal being written: the file cut to nothing
    while the writer goes on at its own offset, a run of NULs where the first lines were."""
    lines = encode_events(events).splitlines(keepends=True)
    with path.open("wb") as file:
        file.seek(nuls)  # a hole, read back as NULs
        file.write(b"".join(lines[cut:]))
    return path


@pytest.mark.e2e
def test_replay_of_a_journal_truncated_in_place_reads_what_is_left(tmp_path: Path) -> None:
    events = nested(10, ended=False)
    path = truncated_in_place(tmp_path / "rotated.jsonl", events, cut=3, nuls=5000)
    code, output = trt_otel("replay", path)
    assert "Traceback" not in output
    assert code == 4, output  # the build never ended in what is left
    said = [line for line in output.splitlines() if "NUL" in line]
    assert len(said) == 1, output
    assert "starts with 5,000 NUL bytes" in said[0] and "copytruncate" in said[0]
    assert "p2" in output and "p9" in output  # what followed the cut, shown

    journal = read_journal(path)
    assert journal.problems[0].kind == "nul_prefix"
    assert [problem.kind for problem in journal.problems] == ["nul_prefix"]
    first, *rest = journal.events
    assert isinstance(first, BuildStarted) and first.attributes == {TRUNCATED_ATTRIBUTE: True}
    assert [event.seq for event in rest] == [event.seq for event in events[3:]]
    history = History.load(tmp_path)
    assert history.skipped == ["rotated.jsonl: truncated in place; its start is lost"]


@pytest.mark.e2e
def test_a_sparse_file_of_nuls_is_skipped_not_read_into_memory(tmp_path: Path) -> None:
    path = tmp_path / "holes.jsonl"
    with path.open("wb") as file:
        file.truncate(8 * 1024**3)  # 8 GiB of NULs, on no disk
    code, output = trt_otel("replay", path)
    assert "Traceback" not in output and code == 2, output
    assert "starts with 8,589,934,592 NUL bytes" in output
    code, output = trt_otel("demo", "--speed", "0", "--trace", path)
    assert_refused(code, output, f"a line over {MAX_LINE_BYTES:,} bytes")


def test_a_line_with_no_end_is_skipped_with_bounded_memory() -> None:
    reader = LineReader()
    out: list[object] = []
    piece = b"x" * (1 << 20)
    for _ in range(MAX_LINE_BYTES // len(piece) * 3):
        out += reader.feed(piece)
        assert len(reader._pending) <= MAX_LINE_BYTES + len(piece)
    step = StepCompleted(seq=0, wall_ns=1, mono_ns=1, thread="t", name="p", step=0)
    out += reader.feed(b"tail\n" + encode_events([step]))
    out += reader.finish()
    kinds = [getattr(item, "kind", type(item).__name__) for item in out]
    assert kinds == ["long_line", "StepCompleted"]


def test_a_line_over_the_bound_is_skipped_however_its_bytes_arrive() -> None:
    """Whole in one chunk, in pieces of 1 MiB (as a journal is read), or cut where the bound
    was passed before its newline came (as a growing journal is followed): the same problem,
    never the event."""
    message = "x" * MAX_LINE_BYTES
    long = LogMessage(seq=0, wall_ns=1, mono_ns=1, thread="t", severity="info", message=message)
    step = StepCompleted(seq=1, wall_ns=2, mono_ns=2, thread="t", name="p", step=0)
    data = encode_events([long, step])
    piece = 1 << 20

    def read(chunks: list[bytes]) -> list[object]:
        reader = LineReader()
        out = [item for chunk in chunks for item in reader.feed(chunk)] + reader.finish()
        return [
            (getattr(item, "kind", type(item).__name__), getattr(item, "line", 0)) for item in out
        ]

    whole = read([data])
    assert whole == [("long_line", 2), ("StepCompleted", 0)]
    assert read([data[at : at + piece] for at in range(0, len(data), piece)]) == whole
    past = MAX_LINE_BYTES + 8  # the bound passed before the line's newline arrives
    assert read([data[:past], data[past:]]) == whole


def test_a_trace_line_with_no_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"[" * (MAX_LINE_BYTES + 10))
    with pytest.raises(TraceError, match="a line over"):
        load_trace(path)


# -- 3. one journal, one writer -----------------------------------------------------------------


def test_a_second_writer_of_a_journal_is_refused_and_cuts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "build.jsonl"
    first = JournalWriter(path)
    first.handle(nested(3, ended=False))
    first._file.flush()
    before = path.read_bytes()
    with pytest.raises(JournalBusyError) as refused:
        JournalWriter(path)
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(refused.value.strerror)
    assert path.read_bytes() == before  # not truncated
    first.close()
    JournalWriter(path).close()  # free again once the first closed


@pytest.fixture
def running_build(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    journal = tmp_path / "shared.jsonl"
    process = subprocess.Popen(
        [*CLI, "demo", "--journal", str(journal)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        yield process, journal
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.e2e
def test_two_builds_given_one_journal_the_second_is_refused(
    running_build: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, journal = running_build
    wait_for_text(journal, b'"type":"phase_start"', timeout_s=COMMAND_TIMEOUT_S)
    header = msgspec.json.decode(journal.read_bytes().split(b"\n", 1)[0])
    code, output = trt_otel("demo", "--speed", "0", "--journal", journal)
    assert_refused(
        code,
        output,
        f"already being written by trt-otel pid {header['writer_pid']} "
        f"on host {header['writer_host']}",
    )
    assert process.poll() is None  # the first goes on, its journal whole
    assert journal.read_bytes().startswith(b'{"format":"trt-otel-journal"')
    wait_until(
        lambda: journal.read_bytes().count(b"\n") >= 10,
        "the first build's journal stopped growing",
        COMMAND_TIMEOUT_S,
    )


def test_a_fifo_in_history_replay_header_says_so(fifo: Path) -> None:
    with pytest.raises(JournalError, match="a named pipe, not a regular file"):
        read_journal(fifo)


KMSG = Path("/proc/kmsg")


@pytest.mark.e2e
@pytest.mark.skipif(not os.access(KMSG, os.R_OK), reason="/proc/kmsg is readable by root only")
@pytest.mark.parametrize("holding", ["nothing", "a line"])
@pytest.mark.parametrize("read_as", ["model", "trace", "journal"])
def test_a_file_that_says_it_is_regular_but_would_block_is_refused_not_waited_on(
    read_as: str, holding: str, tmp_path: Path
) -> None:
    """/proc/kmsg passes for a regular file (as a FUSE or network file may) and blocks its
    reader until the kernel logs something: refused in one line, at once, whether it has
    nothing to read or a few lines before it would wait (the kernel logs at any time)."""
    if holding == "a line":
        if not os.access("/dev/kmsg", os.W_OK):
            pytest.skip("/dev/kmsg is writable by root only")
        Path("/dev/kmsg").write_text("trt-otel's tests: a line for /proc/kmsg to hold\n")
    args: tuple[str | Path, ...] = {
        "model": ("build", KMSG, "-o", tmp_path / "kmsg.engine", "--no-progress"),
        "trace": ("demo", "--speed", "0", "--no-progress", "--trace", KMSG),
        "journal": ("replay", KMSG),
    }[read_as]
    assert_refused(*trt_otel(*args), "/proc/kmsg")
