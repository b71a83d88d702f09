"""``trt-otel watch``: what cannot be followed is a clear error, exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli import CLI
from crafted import craft_journal
from journals import DATA
from trt_otel.app.cli import main
from trt_otel.app.remote import CONTROL_LINE_BYTES, Escalation, RemoteBuild, control_line
from trt_otel.core.events import BuildFinished, BuildStarted, Event, Outcome
from trt_otel.core.journal import JournalWriter
from trt_otel.core.journal_reader import Journal, read_journal
from trt_otel.core.readmodel import ReadModel
from waiting import wait_for_text


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://[::1", "is not a valid URL (Invalid IPv6 URL)"),
        ("http://host:99999", "is not a valid URL (Port out of range"),
        ("ftp://host/", "is not an http:// or https:// URL"),
    ],
)
def test_a_bad_url_is_refused_with_exit_2(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", "--url", url, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ("/nonexistent/dir/ctl", "its directory '/nonexistent/dir' does not exist"),
        ("{tmp}", "is a directory"),
        ("{tmp}/file/ctl", "/file' is not a directory"),
    ],
)
def test_a_control_file_that_cannot_be_written_is_refused_before_watching(
    tmp_path: Path, control: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    journal = str(DATA / "rtx-conv8-success.jsonl")  # a build that succeeded: watched, exit 0
    args = ["watch", journal, "--no-progress", "--control-file", control.format(tmp=tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.e2e
def test_a_cancel_that_cannot_be_delivered_is_not_a_success(tmp_path: Path) -> None:
    """The control file's directory goes away during the watch: the cancel that a policy
    then decides cannot reach the build, which builds on to success; watch says so and exits
    4, not 0."""
    journal, folder, stop = tmp_path / "b.jsonl", tmp_path / "control", tmp_path / "stop"
    folder.mkdir()
    build = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0", "--silence", "8s",
         "--journal", str(journal)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    err_path = tmp_path / "watch.err"
    with err_path.open("w") as err_file:
        watch = subprocess.Popen(
            [*CLI, "watch", str(journal), "--no-progress", "--control-file",
             str(folder / "ctl"), "--cancel-file", str(stop)],
            stdout=subprocess.DEVNULL, stderr=err_file,
        )  # fmt: skip
    try:
        wait_for_text(err_path, b"policy: ")  # watching, the control file's folder checked
        folder.rmdir()
        stop.write_text("enough\n")
        assert watch.wait(timeout=60) == 4, err_path.read_text()
        assert build.wait(timeout=60) == 0  # the cancel never reached it
    finally:
        watch.kill()
        build.kill()
    err = err_path.read_text()
    assert "the cancel (enough) could not be delivered: cannot write the control file" in err
    assert "(the build ended: success)" in err
    assert "Traceback" not in err


def watch_refuses_to_stop(journal: Path, control: Path, named: subprocess.Popen[str]) -> None:
    """watch --terminate-after cancels the crafted build, finds that the process its header
    names is not provably the writer, and stops nothing; the build ends, and watch goes."""
    watch = subprocess.Popen(
        [*CLI, "watch", str(journal), "--no-progress",
         "--control-file", str(control), "--timeout", "1s", "--terminate-after", "1s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watch.stderr is not None
        said = []
        for line in watch.stderr:  # EOF if watch exits (having stopped the process)
            said.append(line)
            if "not provably the build's writer" in line:
                break
        assert named.poll() is None, "".join(said)
        assert "sending SIGTERM" not in "".join(said)
        with journal.open("a") as file:  # the build ends: watch goes
            end = {
                "type": "build_end", "seq": 1, "wall_ns": time.time_ns(),
                "mono_ns": time.monotonic_ns(), "thread": "MainThread",
                "outcome": "cancellation", "detail": "", "error_type": "",
            }  # fmt: skip
            file.write(json.dumps(end) + "\n")
        watch.communicate(timeout=60)
    finally:
        watch.kill()
        watch.communicate()
    assert named.poll() is None
    os.kill(named.pid, 0)


@pytest.mark.e2e
def test_terminate_after_never_signals_a_process_that_does_not_hold_the_journal(
    tmp_path: Path,
) -> None:
    """A crafted journal's header names an unrelated process of this user, started before it:
    --terminate-after must not stop it, since it is not provably the journal's writer."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], text=True)
    try:
        time.sleep(0.2)
        journal = tmp_path / "crafted.jsonl"
        craft_journal(journal, bystander.pid)
        watch_refuses_to_stop(journal, tmp_path / "control", bystander)
    finally:
        bystander.kill()
        bystander.wait()


READER = """
import fcntl, os, sys, time
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR if how.startswith("open for writing") else os.O_RDONLY)
if how.endswith("its own journal"):  # a build of its own, which also reads this journal
    fcntl.flock(os.open(path + ".own", os.O_WRONLY | os.O_CREAT), fcntl.LOCK_EX)
elif how.endswith("shared lock"):
    fcntl.flock(fd, fcntl.LOCK_SH)
elif how.endswith("exclusive lock"):
    fcntl.flock(fd, fcntl.LOCK_EX)
print("open", flush=True)
time.sleep(600)
"""


HOLDING_OPEN = [
    "reading", "reading, shared lock", "reading, exclusive lock",
    "open for writing, no lock", "open for writing, shared lock",
    "reading, writing its own journal",
]  # fmt: skip


@pytest.mark.parametrize("how", HOLDING_OPEN)
@pytest.mark.e2e
def test_terminate_after_never_signals_a_reader_that_holds_the_journal_open(
    tmp_path: Path, how: str
) -> None:
    """The process a crafted header names holds the journal open (as every reader does: a
    `tail -f`, another watch), even for writing, even locked through a descriptor it only
    reads, or while it writes a journal of its own under that one's lock: it does not write
    this journal under the writer's lock, so it is not provably its writer, and
    --terminate-after never signals it."""
    journal = tmp_path / "crafted.jsonl"
    journal.write_bytes(b"")
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(journal), how], stdout=subprocess.PIPE, text=True
    )
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        craft_journal(journal, reader.pid)
        watch_refuses_to_stop(journal, tmp_path / "control", reader)
    finally:
        reader.kill()
        reader.communicate()


@pytest.mark.e2e
def test_the_process_a_crafted_header_names_is_not_sampled_for_the_stall(tmp_path: Path) -> None:
    """The stall and memory policies read the samples of the journal's writer: a process that
    only reads the journal (named by a crafted header) would keep a hung build alive with its
    own work, or stop one with its own memory. It is not sampled: the stall counts callbacks."""
    journal = tmp_path / "crafted.jsonl"
    journal.write_bytes(b"")
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(journal), "reading"], stdout=subprocess.PIPE, text=True
    )
    watch = None
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        craft_journal(journal, reader.pid)
        err = tmp_path / "watch.err"
        with err.open("w") as stderr:
            watch = subprocess.Popen(
                [*CLI, "watch", str(journal), "--no-progress", "--control-file",
                 str(tmp_path / "control"), "--stall-timeout", "30s", "--sample-interval",
                 "0.2s"],
                stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip
        wait_for_text(err, b"not provably its writer", timeout_s=30)
        assert b"--stall-timeout counts callbacks alone" in err.read_bytes()
    finally:
        if watch is not None:
            watch.kill()
            watch.wait()
        reader.kill()
        reader.communicate()


@pytest.mark.e2e
def test_terminate_after_stops_the_writer_that_holds_the_journals_lock(tmp_path: Path) -> None:
    """A real build (the demo's, silent for a minute) writes the journal under its lock: the
    one process --terminate-after may stop, and does, once the cancel it wrote was not taken."""
    journal, control = tmp_path / "b.jsonl", tmp_path / "control"
    build = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--no-gpu", "--speed", "0", "--silence", "60s",
         "--journal", str(journal)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        done = subprocess.run(
            [*CLI, "watch", str(journal), "--no-progress",
             "--control-file", str(control), "--timeout", "1s", "--terminate-after", "1s"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert f"sending SIGTERM to its process (pid {build.pid} on " in done.stderr, done.stderr
        assert build.wait(timeout=30) is not None
    finally:
        build.kill()
        build.wait()
    assert done.returncode == 3, done.stderr


def ended_by_watch(tmp_path: Path, *, writer_ended_it: bool) -> Journal:
    """A build's journal written by this process (its start, and its own end if
    ``writer_ended_it``) that watch, having read only its start, ends as a writer stopped with
    SIGTERM: the journal as it is after."""
    journal = tmp_path / "b.jsonl"
    started = BuildStarted(seq=0, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
                           thread="Main", build_id="b1", attributes={})  # fmt: skip
    events: list[Event] = [started]
    if writer_ended_it:
        events.append(
            BuildFinished(seq=1, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
                          thread="Main", outcome=Outcome.CANCELLATION,
                          detail="received SIGTERM", error_type=None)
        )  # fmt: skip
    writer = JournalWriter(journal)
    writer.handle(events)
    writer.close()
    header = json.loads(journal.read_text().splitlines()[0])
    assert header["writer_pid"] == os.getpid() and header["writer_host"] == socket.gethostname()
    monitor = RemoteBuild(tmp_path / "control", started=started, model=ReadModel())
    assert monitor.state.outcome is None  # watch has not read an end
    Escalation(journal, header, monitor, after_s=1.0)._end_journal("SIGTERM")
    return read_journal(journal)


def test_the_end_is_not_written_twice_when_the_writer_ended_its_journal_on_its_way_out(
    tmp_path: Path,
) -> None:
    """watch signalled the writer, and the writer ended its journal itself before watch had read
    that end: watch must not append a second build_end (seen with a demo that exits quickly)."""
    read = ended_by_watch(tmp_path, writer_ended_it=True)
    ends = [e for e in read.events if isinstance(e, BuildFinished)]
    assert [e.detail for e in ends] == ["received SIGTERM"]


def test_the_end_watch_writes_for_a_stopped_writer_follows_its_last_event(
    tmp_path: Path,
) -> None:
    """A writer stopped from outside left no end: the one watch appends is numbered after the
    journal's last event, so the journal reads as one build with nothing out of order."""
    read = ended_by_watch(tmp_path, writer_ended_it=False)
    assert [e.seq for e in read.events] == [0, 1]
    end = read.events[-1]
    assert isinstance(end, BuildFinished) and end.outcome is Outcome.CANCELLATION
    assert "stopped with SIGTERM" in end.detail
    assert not read.problems


def test_only_the_first_cancel_decided_here_reaches_the_control_file(tmp_path: Path) -> None:
    """Two decisions before the build has recorded the first (a policy's, then a user's ``POST
    /cancel``): the build gets the first one, and the second is refused, not written over it
    (the build would stop for the user's reason, not the policy's)."""
    control = tmp_path / "control"
    started = BuildStarted(seq=0, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
                           thread="Main", build_id="b1", attributes={})  # fmt: skip
    monitor = RemoteBuild(control, started=started, model=ReadModel())
    assert monitor.cancel("timed out after 1h", source="timeout", timeout=True, policy="timeout")
    assert not monitor.cancel("cancelled by the user")
    assert json.loads(control.read_text()) == {
        "reason": "timed out after 1h", "source": "timeout", "timeout": True, "policy": "timeout",
    }  # fmt: skip
    assert monitor.cancelled and monitor.state.cancel is None  # the build has not recorded it


@given(reason=st.text(), policy=st.text(), timeout=st.booleans())
def test_a_control_line_fits_what_the_monitor_reads_and_keeps_the_decision(
    reason: str, policy: str, timeout: bool
) -> None:
    """Whatever the reason and policy (any script, any length, lone surrogates), the line is
    one JSON object within the C++ monitor's read, with the source and timeout flag as decided
    and the longest beginnings of the reason and policy that fit."""
    line = control_line(reason, source="stall", timeout=timeout, policy=policy)
    assert len(line) <= CONTROL_LINE_BYTES
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    decision = json.loads(line)
    assert (decision["source"], decision["timeout"]) == ("stall", timeout)
    clean = {
        key: text.encode("utf-8", "replace").decode()
        for key, text in (("reason", reason), ("policy", policy))
    }
    for key, text in clean.items():
        assert text.startswith(decision[key])
        assert len(decision[key]) >= min(len(text), 50)


def test_a_control_line_of_exactly_what_the_monitor_reads_is_kept_whole() -> None:
    """A line of :data:`CONTROL_LINE_BYTES` bytes, its newline included, is read whole by the
    monitor: its reason is written as it is, not shortened by a character."""
    policy = "stall(10m)"
    room = CONTROL_LINE_BYTES - len(control_line("", source="stall", timeout=True, policy=policy))
    reason = "😀" * (room // 4) + "a" * (room % 4)
    line = control_line(reason, source="stall", timeout=True, policy=policy)
    assert len(line) == CONTROL_LINE_BYTES
    assert json.loads(line)["reason"] == reason


def test_a_reason_too_long_for_the_control_line_loses_its_end_not_its_beginning() -> None:
    """Shortened to fit, a reason keeps its first characters (where a policy says which limit
    it reached), whatever the script: here 200 different characters of four bytes each."""
    reason = "".join(chr(0x1F600 + i) for i in range(200))
    line = control_line(reason, source="stall", timeout=False, policy="stall(10m)")
    kept = json.loads(line)["reason"]
    assert len(line) <= CONTROL_LINE_BYTES
    assert 50 <= len(kept) < len(reason)
    assert kept == reason[: len(kept)], "the reason's beginning, not its end"
