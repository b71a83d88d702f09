"""`watch JOURNAL` tells a silent build from a lost one: a writer killed on this host is lost at
once, a journal with no sign of life is lost after --lost-after, and a live build's silent
window is followed to its end. Real processes, signals and files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli import CLI, run_cli, start_demo
from crafted import craft_journal
from trt_otel import BuildMonitor
from trt_otel.capture import liveness
from trt_otel.capture.watch import (
    BuildLostError,
    WatchError,
    events_url,
    follow_journal,
    follow_url,
)
from trt_otel.control.stopping import process_running
from trt_otel.core.events import Event
from trt_otel.core.journal_codec import encode_event
from trt_otel.core.writer import Toucher
from waiting import wait_for_text


def killed_in_silence(journal: Path) -> subprocess.Popen[str]:
    """A demo build SIGKILLed in its silent window, its journal left with no end."""
    build = start_demo("--no-gpu", "--journal", journal, "--silence", "120s")
    try:
        wait_for_text(journal, b"Optimizing graph")
    finally:
        build.send_signal(signal.SIGKILL)
        build.communicate(timeout=30)
    return build


def watch(journal: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli("watch", "--no-progress", journal, *args, timeout=timeout)


@pytest.mark.e2e
def test_watch_of_a_journal_whose_writer_was_killed_is_lost_at_once(tmp_path: Path) -> None:
    journal = tmp_path / "k9.jsonl"
    build = killed_in_silence(journal)
    header = json.loads(journal.read_text().splitlines()[0])
    assert header["writer_pid"] == build.pid and header["writer_host"] == socket.gethostname()
    began = time.monotonic()
    result = watch(journal, timeout=20)
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - began < 10, "lost at once, not after a silence"
    assert (
        f"trt-otel: error: {journal}: its writer (pid {build.pid} on {socket.gethostname()}) is "
        "gone and the journal has no end: the build was lost"
    ) in result.stderr
    assert "Optimizing graph" in result.stderr, "what was recorded is shown first"


def strip_writer(journal: Path) -> None:
    lines = journal.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    for key in ("writer_pid", "writer_host", "touch_interval_s"):
        header.pop(key, None)
    journal.write_text(json.dumps(header) + "\n" + "".join(lines[1:]))


@pytest.mark.e2e
def test_a_journal_with_no_sign_of_life_is_lost_after_the_limit(tmp_path: Path) -> None:
    journal = tmp_path / "old.jsonl"
    killed_in_silence(journal)
    strip_writer(journal)  # as an older writer, or one on another host, leaves it
    began = time.monotonic()
    result = watch(journal, "--lost-after", "1.5s", timeout=30)
    waited = time.monotonic() - began
    assert result.returncode == 2, result.stderr
    assert 1.5 <= waited < 15
    assert (
        f"{journal}: nothing written nor touched for 1.5s and the journal has no end: the build "
        "was lost (--lost-after waits longer)"
    ) in result.stderr


@pytest.mark.e2e
def test_a_live_build_silent_longer_than_the_limit_is_followed_to_its_end(tmp_path: Path) -> None:
    journal = tmp_path / "live.jsonl"
    build = start_demo("--no-gpu", "--journal", journal, "--speed", "4", "--silence", "6s")
    try:
        wait_for_text(journal, b"Optimizing graph")
        result = watch(journal, "--lost-after", "1s", timeout=120)
        build.communicate(timeout=60)
    finally:
        build.kill()
    assert result.returncode == 0, result.stderr
    assert "build success" in result.stderr
    assert "its writer is alive (TensorRT is silent); still following" in result.stderr


def test_a_journal_is_lost_only_once_its_silence_outlasts_the_limit(tmp_path: Path) -> None:
    journal = tmp_path / "remote.jsonl"
    header = {"format": "trt-otel-journal", "version": 1, "created_wall_ns": time.time_ns()}
    journal.write_text(json.dumps(header) + "\n")
    now = [100.0]
    watcher = liveness.Liveness(journal, header, lost_after_s=30.0, clock=lambda: now[0])
    now[0] += 30.0
    assert watcher.lost() is None, "no sign of life for the limit itself: not lost yet"
    now[0] += 0.5
    said = watcher.lost()
    assert said is not None and "nothing written nor touched for 30.0s" in said


def test_touches_keep_a_remote_writers_journal_alive(tmp_path: Path) -> None:
    journal = tmp_path / "remote.jsonl"
    header = {
        "format": "trt-otel-journal", "version": 1, "created_wall_ns": time.time_ns(),
        "writer_pid": 1, "writer_host": "another-host.example", "touch_interval_s": 0.2,
    }  # fmt: skip
    journal.write_text(json.dumps(header) + "\n")
    toucher = Toucher(journal, interval_s=0.2)
    outcome: list[object] = []

    def follow() -> None:
        try:
            outcome.append(follow_journal(journal, lambda events: None, warn=lambda m: None,
                                          poll_s=0.05, lost_after_s=1.0))  # fmt: skip
        except BuildLostError as error:
            outcome.append(error)

    follower = threading.Thread(target=follow, daemon=True)
    began = time.monotonic()
    follower.start()
    follower.join(3.0)
    assert follower.is_alive(), f"given up while the file was touched: {outcome}"
    toucher.stop()
    follower.join(10.0)
    assert not follower.is_alive()
    assert isinstance(outcome[0], BuildLostError)
    assert "nothing written nor touched" in str(outcome[0])
    assert time.monotonic() - began >= 3.5


@pytest.mark.e2e
def test_a_zombie_or_a_reused_pid_is_not_the_writer() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").exists() and time.monotonic() < deadline:
        state = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.01)
    try:
        assert process_running(child.pid) is False, "a zombie has ended"
    finally:
        child.wait()
    assert process_running(child.pid) is False
    assert process_running(os.getpid(), created_wall_ns=time.time_ns()) is True
    an_hour_ago = time.time_ns() - 3600 * 10**9
    assert process_running(os.getpid(), created_wall_ns=an_hour_ago) is False, (
        "a process that started after the journal was written is another one"
    )


class SilentServer:
    """A real TCP server that accepts every connection and then never answers, or (``trickle``)
    sends an answer's head a byte at a time and never finishes it."""

    def __init__(self, trickle: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.trickle, self.closed = trickle, threading.Event()
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(connection)
            if self.trickle:
                threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Pad: " + b"a" * 10_000
        for byte in head:  # a byte every 50 ms: each read waits less than any timeout
            if self.closed.wait(0.05):
                return
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for connection in self.accepted:
            connection.close()


def silent_for(said: str) -> float:
    """The seconds of silence an error reports (a loaded machine may report a tenth more than
    the limit)."""
    found = re.search(r"no answer for (\d+\.\d)s \(it accepted the connection\)", said)
    assert found, said
    return float(found[1])


@pytest.mark.e2e
def test_a_url_that_accepts_and_never_answers_is_lost_after_the_limit() -> None:
    for server in (SilentServer(), SilentServer(trickle=True)):
        try:
            started = time.monotonic()
            done = subprocess.run(
                [*CLI, "watch", "--url", server.url, "--lost-after", "1s", "--no-progress"],
                capture_output=True, text=True, timeout=50, check=False,
            )  # fmt: skip
            took = time.monotonic() - started
        finally:
            server.close()
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert silent_for(done.stderr) >= 1.0, done.stderr
        assert took < 30, f"--lost-after 1s took {took:.0f}s (trickle={server.trickle})"


def test_a_silent_server_whose_read_times_out_before_the_watchman_is_still_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The socket's own timeout is the deadline's: on a loaded machine it can run out before the
    # watchman thread shuts the socket down. Without the watchman the read always wins the race.
    from trt_otel.core import deadlines

    monkeypatch.setattr(deadlines._WATCHMAN, "watch", lambda deadline: None)
    server = SilentServer()
    try:
        with pytest.raises(WatchError) as raised:
            follow_url(server.url, lambda batch: None, warn=print, retry_for_s=0.3)
    finally:
        server.close()
    assert silent_for(str(raised.value)) >= 0.3, raised.value


class EndlessLineServer:
    """A real TCP server that answers as an event stream, then sends one ``data:`` line that
    never ends, for as long as it is read."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: "
                )
                while not self.closed.is_set():
                    connection.sendall(b"A" * 65536)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


def test_a_builds_url_names_its_event_stream_with_or_without_a_trailing_slash() -> None:
    """``--url`` of the build's address or of its stream, a trailing slash or not: the stream
    at ``/events``, its query kept (never ``//events``)."""
    for url in (
        "http://host:8080",
        "http://host:8080/",
        "http://host:8080/events",
        "http://host:8080/events/",
    ):
        assert events_url(url) == "http://host:8080/events", url
    assert events_url("https://h/fleet/b1/?token=x") == "https://h/fleet/b1/events?token=x"


@pytest.mark.e2e
def test_an_event_stream_line_that_never_ends_is_not_an_event_stream() -> None:
    """A server that keeps sending one line is alive, so --lost-after never fires: the line's
    bound does, in one line and exit 2."""
    server = EndlessLineServer()
    try:
        done = subprocess.run(
            [*CLI, "watch", "--url", server.url, "--no-progress"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        server.close()
    assert done.returncode == 2, done.stderr
    assert "not an event stream" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.e2e
def test_a_live_process_that_does_not_hold_the_journal_is_no_sign_of_life(
    tmp_path: Path,
) -> None:
    """A crafted header names an unrelated live process of this host: it is not the writer, so
    the build is lost after --lost-after with no line nor touch (watch had followed it for ever)."""
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        journal = tmp_path / "crafted.jsonl"
        craft_journal(journal, bystander.pid)
        done = subprocess.run(
            [*CLI, "watch", str(journal), "--no-progress", "--lost-after", "1s"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "nothing written nor touched for 1.0s" in done.stderr
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.e2e
def test_a_live_reader_of_the_journal_is_no_sign_of_life(tmp_path: Path) -> None:
    """A crafted header names a live process that holds the journal open, but only reads it
    (a `tail -f`): not the writer (it holds no write lock), so the build is lost after
    --lost-after with no line nor touch (watch had followed it for as long as the reader lived)."""
    journal = tmp_path / "crafted.jsonl"
    journal.write_bytes(b"")
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); print('open', "
         "flush=True); time.sleep(600)", str(journal)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        craft_journal(journal, reader.pid)  # into the file the reader holds
        done = subprocess.run(
            [*CLI, "watch", str(journal), "--no-progress", "--lost-after", "1s"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "nothing written nor touched for 1.0s" in done.stderr
        assert reader.poll() is None
    finally:
        reader.kill()
        reader.communicate()


def test_a_running_writer_whose_lock_cannot_be_told_is_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the locks of the writer's process cannot be read (None: no /proc, or not ours to
    read), its running process is still a sign of life; only a lock it provably does not hold
    makes it no writer."""
    journal = tmp_path / "j.jsonl"
    journal.write_text("{}\n")
    writer = liveness.Writer(os.getpid(), socket.gethostname(), None)
    monkeypatch.setattr(liveness, "holds_write_lock", lambda pid, path: None)
    assert writer.running_here(journal) is True
    monkeypatch.setattr(liveness, "holds_write_lock", lambda pid, path: False)
    assert writer.running_here(journal) is None


class FallsSilentServer:
    """A real TCP server whose first connection gets ``events`` as an event stream (HTTP/1.1,
    chunked: the connection stays open) and then nothing more; every later connection is closed
    unanswered. ``accepted``: the connections it took."""

    def __init__(self, events: list[Event]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        frames = b"".join(
            f"id: {e.seq}\ndata: {encode_event(e).decode()}\n\n".encode() for e in events
        )
        self.answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(frames), frames)
        )
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(connection)
            if len(self.accepted) > 1:
                connection.close()
                continue
            with contextlib.suppress(OSError):
                connection.recv(65536)
                connection.sendall(self.answer)

    def close(self) -> None:
        self.listener.close()
        for connection in self.accepted:
            connection.close()


def test_a_stream_that_falls_silent_is_lost_counting_from_its_last_event() -> None:
    """A stream that sent events and then nothing is lost ``retry_for_s`` after its last sign
    of life, not after its silence was noticed: silent for its read timeout (1 s) since its
    last event, with 0.3 s to come back, it is lost at once, never asked to resume."""
    monitor = BuildMonitor()
    monitor.start()
    monitor.phase_start("Building engine", None, 2)
    server = FallsSilentServer(monitor.log.recent())
    warnings: list[str] = []
    try:
        end = follow_url(
            server.url, lambda batch: None, warn=warnings.append, retry_for_s=0.3,
            read_timeout_s=1.0,
        )  # fmt: skip
    finally:
        server.close()
    assert end is None, "the stream never sent the build's end"
    assert len(warnings) == 1 and silent_for(warnings[0]) >= 1.0, warnings
    assert len(server.accepted) == 1, "lost since its last event: not asked to resume"


class ReplayingStreamServer:
    """A real HTTP server whose event stream ignores ``Last-Event-ID``: each connection gets
    the build's events from the first (a proxy's cache, a server restarted from its journal),
    and the first connection is dropped after ``cut_after`` of them."""

    def __init__(self, events: list[Event], cut_after: int) -> None:
        frames = [f"id: {e.seq}\ndata: {encode_event(e).decode()}\n\n".encode() for e in events]
        self.asked_after: list[str | None] = []
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                first = not served.asked_after
                served.asked_after.append(self.headers.get("Last-Event-ID"))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"".join(frames[:cut_after] if first else frames))

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_resumed_stream_that_sends_events_again_shows_each_once() -> None:
    """A dropped connection is resumed after the last event seen; events the server sends
    again (it ignored ``Last-Event-ID``) are not shown twice, the last one seen included."""
    monitor = BuildMonitor()
    monitor.start()
    monitor.phase_start("Building engine", None, 2)
    monitor.step_complete("Building engine", 0)
    monitor.step_complete("Building engine", 1)
    monitor.phase_finish("Building engine")
    monitor.end()
    events = monitor.log.recent()
    server = ReplayingStreamServer(events, cut_after=3)
    shown: list[Event] = []
    try:
        end = follow_url(server.url, shown.extend, warn=lambda message: None, retry_for_s=30)
    finally:
        server.close()
    assert server.asked_after == [None, "2"], "resumed after the last event seen"
    assert [e.seq for e in shown] == [e.seq for e in events]
    assert end == events[-1]


def test_a_stream_dropped_after_its_first_event_is_resumed_after_that_event() -> None:
    """The first event's sequence number is 0: a connection dropped right after it resumes
    with ``Last-Event-ID: 0``, not from the start."""
    monitor = BuildMonitor()
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    monitor.step_complete("Building engine", 0)
    monitor.phase_finish("Building engine")
    monitor.end()
    events = monitor.log.recent()
    assert events[0].seq == 0
    server = ReplayingStreamServer(events, cut_after=1)
    shown: list[Event] = []
    try:
        follow_url(server.url, shown.extend, warn=lambda message: None, retry_for_s=30)
    finally:
        server.close()
    assert server.asked_after == [None, "0"]
    assert [e.seq for e in shown] == [e.seq for e in events]
