"""``trt-otel watch``: what cannot be followed is a clear error, exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trt_otel.app.cli import main
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


DATA = Path(__file__).parent / "data"
CLI = [sys.executable, "-m", "trt_otel.app.cli"]


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


@pytest.mark.e2e
def test_terminate_after_never_signals_a_process_that_does_not_hold_the_journal(
    tmp_path: Path,
) -> None:
    """A crafted journal's header names an unrelated process of this user, started before it:
    --terminate-after must not stop it, since it is not provably the journal's writer."""
    import json
    import os
    import socket
    import time

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.2)
        journal, control = tmp_path / "crafted.jsonl", tmp_path / "control"
        now = time.time_ns()
        header = {
            "format": "trt-otel-journal", "version": 1, "created_wall_ns": now,
            "producer": "trt-otel 0.1.0", "writer_pid": bystander.pid,
            "writer_host": socket.gethostname(), "touch_interval_s": 10.0,
        }  # fmt: skip
        start = {
            "type": "build_start", "seq": 0, "wall_ns": now, "mono_ns": time.monotonic_ns(),
            "thread": "MainThread", "build_id": "crafted", "attributes": {},
        }  # fmt: skip
        journal.write_text(json.dumps(header) + "\n" + json.dumps(start) + "\n")
        watch = subprocess.Popen(
            [sys.executable, "-m", "trt_otel.app.cli", "watch", str(journal), "--no-progress",
             "--control-file", str(control), "--timeout", "1s", "--terminate-after", "1s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert watch.stderr is not None
        said = []
        for line in watch.stderr:  # EOF if watch exits (having stopped the bystander)
            said.append(line)
            if "not provably the build's writer" in line:
                break
        assert bystander.poll() is None, "".join(said)
        assert "sending SIGTERM" not in "".join(said)
        with journal.open("a") as file:  # the build ends: watch goes
            end = {
                "type": "build_end", "seq": 1, "wall_ns": time.time_ns(),
                "mono_ns": time.monotonic_ns(), "thread": "MainThread",
                "outcome": "cancellation", "detail": "", "error_type": "",
            }  # fmt: skip
            file.write(json.dumps(end) + "\n")
        watch.communicate(timeout=60)
        assert bystander.poll() is None
        os.kill(bystander.pid, 0)
    finally:
        bystander.kill()
        bystander.wait()


def test_the_end_is_not_written_twice_when_the_writer_ended_its_journal_on_its_way_out(
    tmp_path: Path,
) -> None:
    """watch signalled the writer, and the writer ended its journal itself before watch had read
    that end: watch must not append a second build_end (seen with a demo that exits quickly)."""
    import json
    import os
    import socket
    import time

    from trt_otel.app.remote import Escalation, RemoteBuild
    from trt_otel.core.events import BuildFinished, BuildStarted, Outcome
    from trt_otel.core.journal import JournalWriter, read_journal
    from trt_otel.core.readmodel import ReadModel

    journal = tmp_path / "b.jsonl"
    started = BuildStarted(seq=0, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
                           thread="Main", build_id="b1", attributes={})  # fmt: skip
    writer = JournalWriter(journal)
    writer.handle([
        started,
        BuildFinished(seq=1, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(), thread="Main",
                      outcome=Outcome.CANCELLATION, detail="received SIGTERM", error_type=None),
    ])  # fmt: skip
    writer.close()
    header = json.loads(journal.read_text().splitlines()[0])
    assert header["writer_pid"] == os.getpid() and header["writer_host"] == socket.gethostname()
    monitor = RemoteBuild(tmp_path / "control", started=started, model=ReadModel())
    assert monitor.state.outcome is None  # watch has not read the end yet
    Escalation(journal, header, monitor, after_s=1.0)._end_journal("SIGTERM")
    ends = [e for e in read_journal(journal).events if isinstance(e, BuildFinished)]
    assert [e.detail for e in ends] == ["received SIGTERM"]
