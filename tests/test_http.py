"""The HTTP view of a build, with real HTTP clients: status, resumable SSE, cancel, abuse."""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import re
import select
import socket
import stat
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from cli import CLI, HOLD, announced_url, start_demo
from trt_otel import BuildMonitor, Outcome, read_journal
from trt_otel.app.assembly import attach_session
from trt_otel.app.config import HttpConfig, ObservabilityConfig
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.http import StatusServer
from trt_otel.views.http_feed import EventFeed
from trt_otel.views.prometheus import MetricSources, MetricsServer, metrics_registry
from trt_otel.views.status import MAX_TREE_DEPTH
from waiting import wait_until

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
"""The header of a request that presents the whole token."""


READ_BEFORE_ANNOUNCED: dict[int, list[str]] = {}
"""Per demo (by pid), the lines of its stderr read before it announced its endpoint (its first
build lines may come before that announcement)."""


def serving_demo(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A demo serving HTTP on a free port (``env``: added to this environment); returns the
    process and its base URL."""
    process = start_demo("--http-port", "0", *args, env={**os.environ, **(env or {})})
    read = READ_BEFORE_ANNOUNCED[process.pid] = []
    return process, announced_url(process, read)


def sse_events(
    base: str, *, last_event_id: int | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Read the event stream (until it ends, or ``limit`` events)."""
    host = base.removeprefix("http://")
    connection = http.client.HTTPConnection(host, timeout=60)
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    connection.request("GET", "/events", headers=headers)
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    events: list[dict[str, Any]] = []
    frame: dict[str, str] = {}
    try:
        while limit is None or len(events) < limit:
            raw = response.readline()
            if not raw:
                break
            line = raw.decode().rstrip("\n")
            if line:
                key, _, value = line.partition(": ")
                frame[key] = value
                continue
            if "data" in frame and "id" in frame:
                record = json.loads(frame["data"])
                assert int(frame["id"]) == record["seq"]
                assert frame["event"] == record["type"]
                events.append(record)
            frame = {}
    finally:
        connection.close()
    return events


def post(url: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"null")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.e2e
def test_clients_joining_mid_build_and_resuming_get_every_event_once_in_order(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "build.jsonl"
    # At full speed into a silent window: the build is mid-way while the clients join.
    process, base = serving_demo(*HOLD, "--journal", str(journal))
    try:
        first_part = sse_events(base, limit=40)
        late: list[dict[str, Any]] = []
        joining = threading.Thread(target=lambda: late.extend(sse_events(base)))
        joining.start()  # a client joining mid-build gets it from its first event
        resumed = sse_events(base, last_event_id=first_part[-1]["seq"])
        joining.join(60)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0
    recorded = [e.seq for e in read_journal(journal).events]
    assert [e["seq"] for e in first_part + resumed] == recorded
    assert [e["seq"] for e in late] == recorded
    assert late[-1]["type"] == "build_end" and late[-1]["outcome"] == "success"


@pytest.mark.e2e
def test_since_query_resumes_too(tmp_path: Path) -> None:
    process, base = serving_demo(*HOLD)
    try:
        with urllib.request.urlopen(f"{base}/events?since=9", timeout=30) as response:
            head = response.read(4096).decode()
        process.communicate(timeout=60)
    finally:
        process.kill()
    ids = [int(m) for m in re.findall(r"^id: (\d+)$", head, flags=re.MULTILINE)]
    assert ids[:3] == [10, 11, 12]


@pytest.mark.e2e
def test_status_describes_the_build(tmp_path: Path) -> None:
    process, base = serving_demo(*HOLD)
    try:
        status = get_json(f"{base}/status")

        def mid_build() -> bool:
            nonlocal status
            status = get_json(f"{base}/status")
            return bool(status["progress"] > 0 and status["elapsed_s"] > 1)

        wait_until(mid_build, "the build never showed progress after a second", 30)
        health = get_json(f"{base}/healthz")
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert status["status"] == "running" and status["outcome"] is None
    assert 0 < status["progress"] < 1 and status["elapsed_s"] > 1
    assert status["phases"][0]["name"] == "Building engine"
    assert status["phases"][0]["status"] == "open"
    assert set(status["eta"]) == {"seconds", "basis", "unknown"}
    assert status["eta_history"]["unknown"] == "no history given (--history DIR)"
    assert health == {"status": "ok", "build": "running"}
    assert "trt_build_progress_ratio" in metrics


@pytest.mark.e2e
def test_cancel_needs_the_right_token_and_says_why(tmp_path: Path) -> None:
    journal = tmp_path / "cancel.jsonl"
    process, base = serving_demo(
        *HOLD, "--journal", str(journal), env={"TRT_OTEL_CANCEL_TOKEN": TOKEN}
    )
    try:
        assert post(f"{base}/cancel")[0] == 401
        assert post(f"{base}/cancel", headers={"Authorization": "Bearer nope"})[0] == 403
        assert post(f"{base}/cancel", headers={"Authorization": "Basic " + TOKEN})[0] == 401
        code, answer = post(
            f"{base}/cancel",
            json.dumps({"reason": "GPU needed elsewhere"}).encode(),
            {**AUTH, "Content-Type": "application/json"},
        )
        assert (code, answer["reason"], answer["first"]) == (202, "GPU needed elsewhere", True)
        again = post(f"{base}/cancel", b"twice", AUTH)
        assert again[0] == 200 and again[1]["first"] is False
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3, err
    events = read_journal(journal).events
    cancels = [e for e in events if e.type == "cancel"]
    assert len(cancels) == 1
    assert (cancels[0].reason, cancels[0].source) == ("GPU needed elsewhere", "http")  # type: ignore[attr-defined]


@pytest.mark.e2e
def test_a_generated_token_is_written_for_the_owner_only(tmp_path: Path) -> None:
    process, base = serving_demo(*HOLD, env={"XDG_RUNTIME_DIR": str(tmp_path)})
    assert process.stderr is not None
    line = process.stderr.readline()
    match = re.search(r"\$\(cat ([^)]+)\)", line)
    assert match, line
    token_file = Path(match.group(1))
    try:
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
        token = token_file.read_text().strip()
        assert len(token) >= 32
        code, _ = post(f"{base}/cancel", b"from a script", {"Authorization": f"Bearer {token}"})
        assert code == 202
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3
    assert not token_file.exists(), "the token goes with the build"


# -- abuse, against a server in this process ---------------------------------------------------


@pytest.fixture
def served() -> Iterator[tuple[BuildMonitor, StatusServer]]:
    monitor = BuildMonitor()
    model = ReadModel()
    monitor.log.follow(model)
    server = StatusServer(
        monitor, model, metrics_registry(MetricSources(monitor)), port=0, cancel_token=TOKEN
    )
    monitor.log.follow(server.feed, capacity=1_000_000)
    try:
        yield monitor, server
    finally:
        monitor.close()
        server.close(linger_s=0)


def test_a_cancel_after_the_build_ended_is_409(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    monitor, server = served
    monitor.start()
    monitor.end()
    code, answer = post(f"{server.url}/cancel", b"too late", AUTH)
    assert (code, answer) == (409, {"error": "the build has ended", "outcome": "success"})
    assert monitor.state.cancel is None, "nothing recorded"


def test_an_ended_streams_last_frames_come_before_it_is_over() -> None:
    """A client reading an ended build a piece at a time is told the stream is over only with
    its last frames: not after its first piece (it would miss the rest, the build's end among
    them)."""
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(2))
    monitor.end()
    events = monitor.log.recent()
    feed = EventFeed()
    feed.handle(events)
    assert feed.ended
    seq, pieces, over = -1, 0, False
    while not over:
        first, frames, over = feed.frames_after(seq, 0, limit=10)
        seq, pieces = first + len(frames) - 1, pieces + 1
    assert seq == events[-1].seq, "every frame read, the build's end the last"
    assert pieces == -(-len(events) // 10)


def test_a_stream_of_several_builds_ends_with_the_log_not_a_build() -> None:
    """``trt-otel run``'s feed: a build's end is not the stream's; its close is."""
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(1))
    monitor.end()
    feed = EventFeed(ends_with_build=False)
    feed.handle(monitor.log.recent())
    assert not feed.ended and not feed.frames_after(-1, 0)[2]
    feed.close()
    assert feed.frames_after(-1, 0)[2]


@pytest.mark.parametrize("builds_in_a_run", [False, True], ids=["build", "run"])
def test_a_sessions_event_stream_ends_with_its_build_unless_it_is_a_run(
    builds_in_a_run: bool,
) -> None:
    """The HTTP view a session attaches: a build's stream is over once the build has ended;
    ``trt-otel run``'s goes on to the next build, its end not the stream's."""
    monitor = BuildMonitor(model=ReadModel())
    assert monitor.model is not None
    with contextlib.ExitStack() as stack:
        views = attach_session(
            stack,
            monitor,
            ObservabilityConfig(http=HttpConfig(port=0)),
            model=monitor.model,
            builds_in_a_run=builds_in_a_run,
        )
        assert views.http is not None
        Driver(speed=0).run(monitor, generate_plan(1))
        monitor.end()
        _, frames, over = views.http.feed.frames_after(-1, 0)
        assert b"\nevent: build_end\n" in frames[-1], "the build's end was streamed"
        assert over == (not builds_in_a_run)
    monitor.close()


def test_the_event_feed_keeps_the_newest_frames_and_says_what_it_dropped() -> None:
    """The HTTP view holds a bounded tail of the stream: trimmed to ``retain`` once it passes
    a tenth more; a client asking for older events gets a ``gap`` frame, then the rest."""
    feed = EventFeed(retain=20)
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(3))
    events = monitor.log.recent()[:40]
    feed.handle(events[:22])
    first, frames, _ = feed.frames_after(-1, 0)
    assert (first, len(frames)) == (0, 22), "within a tenth over the bound: kept"
    feed.handle(events[22:23])
    first, frames, _ = feed.frames_after(-1, 0)
    assert (first, len(frames)) == (3, 20), "over it: trimmed to the newest 20"
    feed.handle(events[23:40])
    first, frames, _ = feed.frames_after(-1, 0)
    assert first + len(frames) == 40 and 20 <= len(frames) <= 22
    assert frames[0].startswith(f"id: {first}\n".encode())
    assert feed.frames_after(30, 0)[0] == 31, "a resumed client gets what follows, no gap"

    monitor = BuildMonitor()
    model = ReadModel()
    monitor.log.follow(model)
    server = StatusServer(
        monitor, model, metrics_registry(MetricSources(monitor)), port=0, cancel_token=TOKEN
    )
    server.feed = EventFeed(retain=20)
    monitor.log.follow(server.feed, capacity=1_000_000)
    try:
        Driver(speed=0).run(monitor, generate_plan(3))
        monitor.end()
        assert monitor.log.flush()
        host = server.url.removeprefix("http://")

        def stream(last_event_id: int) -> str:
            connection = http.client.HTTPConnection(host, timeout=30)
            connection.request("GET", "/events", headers={"Last-Event-ID": str(last_event_id)})
            text = connection.getresponse().read().decode()
            connection.close()
            return text

        body = stream(4)
        held_from = int(re.findall(r"^id: (\d+)$", body, flags=re.MULTILINE)[0])
        just_missed = stream(held_from - 2)  # one event too old: a gap all the same
        in_time = stream(held_from - 1)  # nothing missed: no gap
    finally:
        monitor.close()
        server.close(linger_s=2.0)
    total = monitor.log.next_seq
    gap = re.search(r"event: gap\ndata: (.*)\n", body)
    assert gap is not None, body[:300]
    first_available = json.loads(gap.group(1))["first_available"]
    assert json.loads(gap.group(1)) == {"requested_after": 4, "first_available": first_available}
    assert total - 22 <= first_available <= total - 20
    ids = [int(i) for i in re.findall(r"^id: (\d+)$", body, flags=re.MULTILINE)]
    assert ids == list(range(first_available, total)), "then every held event, in order"
    assert "event: gap" in just_missed and "event: gap" not in in_time


def test_oversized_and_malformed_requests_get_clear_answers(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    monitor, server = served
    monitor.start()
    assert post(f"{server.url}/cancel", b"x" * 100_000, AUTH)[0] == 413
    assert (
        post(f"{server.url}/cancel", b"{not json", {**AUTH, "Content-Type": "application/json"})[0]
        == 400
    )
    assert post(f"{server.url}/nothing")[0] == 404
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{server.url}/nope", timeout=5)
    missing.value.close()
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as bad_id:
        urllib.request.urlopen(f"{server.url}/events?since=abc", timeout=5)
    bad_id.value.close()
    assert bad_id.value.code == 400
    assert not monitor.cancelled, "none of that cancelled the build"


def test_fifty_listeners_and_stalled_clients_do_not_hold_up_the_build(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    monitor, server = served
    # Clients that connect and never finish their request, or never read what they asked for.
    stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
    for sock in stalled[:2]:
        sock.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # headers never end
    for sock in stalled[2:]:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # and never reads
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    received: list[list[dict[str, Any]]] = [[] for _ in range(50)]

    def listen(index: int) -> None:
        received[index] = sse_events(server.url)

    listeners = [threading.Thread(target=listen, args=(i,)) for i in range(50)]
    for thread in listeners:
        thread.start()
    wait_until(lambda: server.sse_clients >= 53, "the 53 streams never all opened", 10)
    monitor.start()
    plan = generate_plan(num_layers=13, num_profiles=1, seed=5)
    began = time.monotonic()
    result = Driver(speed=0).run(monitor, plan)
    monitor.end()
    build_s = time.monotonic() - began
    assert monitor.log.flush(10.0)
    status = get_json(f"{server.url}/status")  # other clients are still served
    for thread in listeners:
        thread.join(30)
    for sock in stalled:
        sock.close()
    assert result.completed and result.cancelled_at is None
    assert status["outcome"] == "success"
    total = monitor.log.next_seq
    assert all(len(events) == total for events in received), [len(r) for r in received]
    assert all([e["seq"] for e in events] == list(range(total)) for events in received)
    http_worker = next(w for w in monitor.log.workers if w.follower.name == "http")
    assert http_worker.health().dropped == 0
    print(f"build of {total} events with 50 listeners took {build_s:.2f}s")


def test_a_port_in_use_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from trt_otel.app.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--speed", "0", "--http-port", str(port)]) == 2
    assert "cannot serve HTTP on 127.0.0.1" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_an_url_file_that_is_not_a_regular_file_is_refused_and_left_alone(
    kind: str, tmp_path: Path
) -> None:
    # The URL file is written by rename and removed at the end: a FIFO (or a directory) given
    # as --http-url-file had been replaced by a file, then deleted.
    target = tmp_path / "url"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    done = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--no-summary", "--http-port", "0",
         "--http-url-file", str(target), "-o", str(tmp_path / "x.engine")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"--http-url-file {target} is a" in done.stderr
    mode = target.lstat().st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISDIR(mode)
    assert not (tmp_path / "x.engine").exists()


# -- watch -------------------------------------------------------------------------------------


def build_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[")]


@pytest.mark.e2e
def test_watch_by_url_and_by_journal_show_what_the_build_showed(tmp_path: Path) -> None:
    journal = tmp_path / "watched.jsonl"
    process, base = serving_demo("--speed", "0", "--silence", "5s", "--journal", str(journal))
    watchers = [
        subprocess.Popen(
            [*CLI, "watch", *source, "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for source in (["--url", base], [str(journal)])
    ]
    try:
        # The rest of its stderr through the reader that found the announcement: what that
        # reader had read ahead is in its buffer (communicate() reads the pipe beneath it).
        assert process.stderr is not None
        build_err = process.stderr.read()
        process.wait(60)
        outputs = [w.communicate(timeout=60)[1] for w in watchers]
    finally:
        for p in (process, *watchers):
            p.kill()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    assert process.returncode == 0
    # The build printed its first lines before the watchers started; they get them all.
    expected = build_lines("".join(READ_BEFORE_ANNOUNCED[process.pid]) + build_err)
    assert expected and expected[-1].split("]", 1)[1].startswith(" build success")
    for watcher, output in zip(watchers, outputs, strict=True):
        assert watcher.returncode == 0, output
        assert build_lines(output) == expected


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ([], 0),
        # A timeout inside a silent window: cancelled at the first step after it.
        (["--silence", "1s", "--timeout", "0.2s"], 3),
    ],
    ids=["success", "timeout"],
)
def test_watch_renders_a_finished_journal_and_mirrors_its_exit_code(
    tmp_path: Path, args: list[str], code: int
) -> None:
    from trt_otel.app.cli import main

    journal = tmp_path / "done.jsonl"
    demo = ["demo", "--speed", "0", "--no-progress", "--in-process", "--journal", str(journal)]
    assert main([*demo, *args]) == code
    assert main(["watch", str(journal), "--no-progress"]) == code


def test_watch_of_a_failed_build_is_exit_4(tmp_path: Path) -> None:
    from trt_otel import JournalWriter
    from trt_otel.app.cli import main

    monitor = BuildMonitor()
    journal = JournalWriter(tmp_path / "failed.jsonl")
    monitor.log.follow(journal)
    monitor.phase_start("Building engine", None, 6)
    monitor.end(Outcome.FAILURE, "bad model", error_type="BuildFailed")
    monitor.close()
    assert main(["watch", str(journal.path), "--no-progress"]) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["watch"], "a journal or --url"),
        (["watch", "x.jsonl", "--url", "http://h"], "a journal or --url"),
        (["watch", "--url", "ftp://h"], "not an http"),
        (["watch", "/nonexistent.jsonl"], "cannot read journal"),
    ],
)
def test_watch_refuses_what_it_cannot_follow(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from trt_otel.app.cli import main

    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_watch_of_an_unreachable_url_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from prometheus_server import free_port
    from trt_otel.app.cli import main

    assert main(["watch", "--url", f"http://127.0.0.1:{free_port()}", "--no-progress"]) == 2
    assert "cannot follow" in capsys.readouterr().err


def test_the_http_view_answers_metrics_as_the_prometheus_endpoint_does(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    monitor, server = served
    monitor.start()
    Driver(speed=0).run(monitor, generate_plan(2))
    monitor.end()
    # The followers' own counters are in the exposition: both scrapes see them settled.
    assert monitor.log.flush(30.0)
    endpoint = MetricsServer(server.registry, 0)
    try:
        for headers in (
            {},
            {"Accept": "application/openmetrics-text; version=1.0.0"},
            {"Accept-Encoding": "gzip"},
            {"Accept": "application/openmetrics-text", "Accept-Encoding": "gzip, deflate"},
        ):
            answers = []
            for port in (server.port, endpoint.port):
                url = f"http://127.0.0.1:{port}/metrics"
                request = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(request, timeout=5) as response:
                    body = response.read()
                    encoding = response.headers.get("Content-Encoding")
                    text = gzip.decompress(body) if encoding == "gzip" else body
                    answers.append((response.headers["Content-Type"], encoding, text))
            assert answers[0] == answers[1], headers
            assert answers[0][1] == ("gzip" if "Accept-Encoding" in headers else None)
    finally:
        endpoint.close()


def test_an_ended_build_nobody_watched_is_not_lingered_for() -> None:
    """The final status waits for a client only when one came by during the build, or when
    the user asked for a linger anyway (a poller that comes late)."""
    for visited, unwatched, lingers in [
        (False, False, False),
        (True, False, True),
        (False, True, True),
    ]:
        monitor = BuildMonitor()
        model = ReadModel()
        monitor.log.follow(model)
        server = StatusServer(
            monitor, model, metrics_registry(MetricSources(monitor)), port=0, cancel_token=TOKEN
        )
        monitor.start()
        if visited:
            get_json(f"{server.url}/healthz")
        monitor.end()
        monitor.close()
        began = time.monotonic()
        server.close(linger_s=1.0, unwatched=unwatched)
        took = time.monotonic() - began
        assert (took >= 1.0) == lingers, (visited, unwatched, took)


# -- who may ask ---------------------------------------------------------------------------------


def ask(server: StatusServer, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """One request to ``server`` with exactly ``headers`` (a forged Host among them)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_only_requests_naming_this_server_are_answered(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    """DNS rebinding: a page of evil.example points its name at 127.0.0.1, and its requests
    say ``Host: evil.example``. They get nothing of the build, and cannot cancel it."""
    monitor, server = served
    monitor.start()
    port = server.port
    for host in ["evil.example", f"evil.example:{port}", "127.0.0.2", "[::1]", "", "localhost.x"]:
        for path in ["/status", "/events", "/metrics", "/", "/healthz"]:
            code, body = ask(server, "GET", path, {"Host": host})
            assert code == 421, (host, path)
            assert monitor.build_id not in body.decode() and len(body) < 200, (host, path)
        code, _ = ask(server, "POST", "/cancel", {"Host": host, **AUTH})
        assert code == 421, host
    assert not monitor.cancelled, "a request for another host cancelled the build"
    for host in [
        "127.0.0.1",
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        "LocalHost.",
        "127.0.0.1:1",
    ]:
        code, body = ask(server, "GET", "/status", {"Host": host})
        assert code == 200 and json.loads(body)["build_id"] == monitor.build_id, host
    # Without a Host at all (HTTP/1.0), nothing either.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /status HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 421"), answer[:40]


def test_names_the_user_allows_are_answered_and_any_ip_on_every_interface() -> None:
    monitor = BuildMonitor()
    model = ReadModel()
    monitor.log.follow(model)
    registry = metrics_registry(MetricSources(monitor))
    named = StatusServer(
        monitor, model, registry, port=0, cancel_token=TOKEN, allowed_hosts=["Build.Example."]
    )
    every = StatusServer(monitor, model, registry, port=0, address="0.0.0.0", cancel_token=TOKEN)
    try:
        monitor.start()
        assert ask(named, "GET", "/status", {"Host": "build.example:8080"})[0] == 200
        assert ask(named, "GET", "/status", {"Host": "BUILD.EXAMPLE"})[0] == 200
        assert ask(named, "GET", "/status", {"Host": "other.example"})[0] == 421
        assert ask(named, "GET", "/status", {"Host": "10.1.2.3"})[0] == 421
        # Served on every interface: any IP literal is this host (an IP cannot be rebound).
        assert ask(every, "GET", "/status", {"Host": "10.1.2.3:80"})[0] == 200
        assert ask(every, "GET", "/status", {"Host": "[fe80::1]"})[0] == 200
        assert ask(every, "GET", "/status", {"Host": "build.example"})[0] == 421
    finally:
        monitor.close()
        named.close(linger_s=0)
        every.close(linger_s=0)


@pytest.mark.e2e
def test_the_allowed_host_option_reaches_the_view(tmp_path: Path) -> None:
    process, base = serving_demo(
        *HOLD, "--http-allowed-host", "Build.Example", env={"TRT_OTEL_CANCEL_TOKEN": TOKEN}
    )
    try:
        host, port = base.removeprefix("http://").split(":")
        answers = {}
        for name in ["build.example", "other.example"]:
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            connection.request("GET", "/healthz", headers={"Host": f"{name}:{port}"})
            answers[name] = connection.getresponse().status
            connection.close()
        assert answers == {"build.example": 200, "other.example": 421}
        assert post(f"{base}/cancel", b"done", AUTH)[0] == 202
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3
    bad = subprocess.run(
        [*CLI, "demo", "--http-port", "0", "--http-allowed-host", "evil.example:80/x"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "is not a host name" in bad.stderr, bad.stderr


def test_only_the_whole_token_cancels(served: tuple[BuildMonitor, StatusServer]) -> None:
    monitor, server = served
    monitor.start()
    url = f"{server.url}/cancel"
    for authorization, expected in [
        (None, 401),
        ("Bearer", 401),
        ("Bearer ", 401),
        ("Bearer    ", 401),
        (f"Basic {TOKEN}", 401),
        (f"Bearer {TOKEN[:-1]}", 403),
        (f"Bearer {TOKEN[:1]}", 403),
        (f"Bearer {TOKEN}x", 403),
        (f"Bearer {TOKEN} {TOKEN}", 403),
        (f"Bearer x{TOKEN}", 403),
    ]:
        headers = {} if authorization is None else {"Authorization": authorization}
        assert post(url, b"no", headers)[0] == expected, authorization
    assert not monitor.cancelled
    assert post(url, b"yes", {"Authorization": f"bearer {TOKEN}"})[0] == 202
    assert monitor.state.cancel is not None and monitor.state.cancel.reason == "yes"


def test_an_empty_token_is_refused_when_serving() -> None:
    """With an empty token, ``Authorization: Bearer`` and a few spaces would cancel."""
    monitor = BuildMonitor()
    registry = metrics_registry(MetricSources(monitor))
    try:
        for token in ["", "   "]:
            with pytest.raises(ValueError, match="cancel token is empty"):
                StatusServer(monitor, ReadModel(), registry, port=0, cancel_token=token)
    finally:
        monitor.close()


def test_a_host_that_only_looks_like_this_servers_name_is_refused(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    """A name that ends with ``localhost`` is another name, and a port must be a port: none of
    these names this server."""
    monitor, server = served
    monitor.start()
    for host in [
        "evil-localhost",
        "evillocalhost",
        "localhost:evil",
        "localhost:",
        "localhost:80x",
        "127.0.0.1:1234567",
        "127.0.0.1:-1",
    ]:
        code, body = ask(server, "GET", "/status", {"Host": host})
        assert code == 421, host
        assert monitor.build_id not in body.decode(), host


def test_a_flood_of_idle_connections_gets_no_more_threads_than_the_cap(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    """Connections that never send a request each hold a thread until the client timeout: past
    MAX_CONNECTIONS they are answered 503 and closed, so the threads stay bounded; once the
    flood goes, the view answers again."""
    from trt_otel.views.http import MAX_CONNECTIONS, RESERVED_CONNECTIONS

    monitor, server = served
    monitor.start()
    threads_before = threading.active_count()
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        # Each of those is on a thread once accepted: wait until all are.
        wait_until(
            lambda: threading.active_count() >= threads_before + MAX_CONNECTIONS,
            f"not all {MAX_CONNECTIONS} idle connections were taken on a thread",
            30,
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            extra.sendall(b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n")
            answer = b""
            while chunk := extra.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503"), answer[:80]
        assert threading.active_count() <= threads_before + MAX_CONNECTIONS + RESERVED_CONNECTIONS
    finally:
        for connection in idle:
            connection.close()
    # The idle ones' threads see their clients go, and free their slots.
    wait_until(
        lambda: ask(server, "GET", "/healthz", {"Host": "localhost"})[0] == 200,
        "the view never answered /healthz again after the flood",
        30,
    )


def test_two_host_headers_are_a_bad_request(served: tuple[BuildMonitor, StatusServer]) -> None:
    """The allowed name first and another after: a proxy may read the one, this server the
    other, so neither is taken (RFC 9112: 400)."""
    monitor, server = served
    monitor.start()
    for hosts in (("localhost", "evil.example"), ("evil.example", "localhost")):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
            lines = "".join(f"Host: {host}\r\n" for host in hosts)
            connection.sendall(f"GET /status HTTP/1.1\r\n{lines}\r\n".encode())
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"400", (hosts, answer[:80])
        assert monitor.build_id.encode() not in answer


def test_status_of_phases_nested_five_thousand_deep_answers_with_a_bounded_tree(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    """A crafted build nesting phases far deeper than Python recurses: /status still answers,
    its tree cut at MAX_TREE_DEPTH with the count of what is hidden below."""
    monitor, server = served
    monitor.start()
    depth = 5_000
    for level in range(depth):
        monitor.phase_start(f"p{level}", f"p{level - 1}" if level else None, 2)
    assert monitor.log.flush(30.0)
    status = get_json(f"{server.url}/status")
    names, level_nodes, last = [], status["phases"], None
    while level_nodes:
        assert len(level_nodes) == 1
        last = level_nodes[0]
        names.append(last["name"])
        level_nodes = last["children"]
    assert names == [f"p{level}" for level in range(MAX_TREE_DEPTH)]
    assert last is not None and last["children_hidden"] == 1
    assert status["phases_started"] == depth


def test_a_plain_text_cancel_reason_is_its_first_line(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    monitor, server = served
    monitor.start()
    auth = {**AUTH, "Content-Type": "text/plain"}
    body = b"  release freeze\nsent from the release script\n"
    code, answer = post(f"{server.url}/cancel", body, auth)
    assert (code, answer["reason"]) == (202, "release freeze")
    assert monitor.state.cancel is not None and monitor.state.cancel.reason == "release freeze"


def test_status_says_how_a_failed_build_failed(served: tuple[BuildMonitor, StatusServer]) -> None:
    monitor, server = served
    monitor.start()
    monitor.end(Outcome.FAILURE, "out of GPU memory", error_type="OutOfMemory")
    assert monitor.log.flush(10.0)
    status = get_json(f"{server.url}/status")
    assert (status["outcome"], status["detail"], status["error_type"]) == (
        "failure", "out of GPU memory", "OutOfMemory",
    )  # fmt: skip


def test_the_status_schema_is_the_one_published_and_the_documents_follow_it(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    """docs/schemas/status.schema.json is the schema derived from the typed document (regenerate
    it with ``python -m trt_otel.views.status``), the view serves it, and a build's /status
    validates against it, running and ended."""
    import jsonschema

    from trt_otel.views.status import schema_text

    monitor, server = served
    published = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "status.schema.json"
    assert published.read_text(encoding="utf-8") == schema_text()
    schema = get_json(f"{server.url}/status.schema.json")
    assert schema == json.loads(schema_text())
    monitor.phase_start("Building engine", None, 2)
    for _ in range(2):
        monitor.phase_start("Timing", "Building engine", 1)
        monitor.phase_finish("Timing")
    monitor.phase_start("Optimizing", "Building engine", 3)
    monitor.cancel("enough", source="user")
    assert monitor.log.flush(10)
    document = get_json(f"{server.url}/status")
    jsonschema.validate(document, schema)
    children = document["phases"][0]["children"]
    assert [(n["kind"], n["name"]) for n in children] == [
        ("group", "Timing"),
        ("phase", "Optimizing"),
    ]
    assert children[0]["count"] == 2 and document["cancel"]["source"] == "user"
    monitor.end()
    assert monitor.log.flush(10)
    jsonschema.validate(get_json(f"{server.url}/status"), schema)


def raw_answer(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


@contextlib.contextmanager
def every_ordinary_slot_held(slots: int) -> Iterator[tuple[BuildMonitor, StatusServer]]:
    """A served build whose ``slots`` ordinary slots (``MAX_CONNECTIONS``, as the caller set
    it) are each held by an idle connection: the next connection is past them."""
    monitor = BuildMonitor()
    model = ReadModel()
    monitor.log.follow(model)
    server = StatusServer(monitor, model, CollectorRegistry(), port=0, cancel_token=TOKEN)
    monitor.start()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(slots)]
    try:
        wait_until(
            lambda: raw_answer(server.port, b"GET /status HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .split(b" ")[1] == b"503",
            "the ordinary slots taken",
        )  # fmt: skip
        yield monitor, server
    finally:
        for connection in idle:
            connection.close()
        server.close(linger_s=0)
        monitor.close()


def test_the_owners_controls_are_answered_while_others_hold_every_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Idle connections hold every ordinary slot: /status is refused (503), but /healthz and
    an authenticated POST /cancel are answered, from the slots kept for them."""
    from trt_otel.views import http as view

    monkeypatch.setattr(view, "MAX_CONNECTIONS", 4)
    with every_ordinary_slot_held(4) as (monitor, server):
        healthz = raw_answer(server.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert healthz.split(b" ")[1] == b"200", healthz[:80]
        cancel = raw_answer(
            server.port,
            b"POST /cancel HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode(),
        )
        assert cancel.split(b" ")[1] == b"202", cancel[:80]
        assert monitor.state.cancel is not None and monitor.state.cancel.source == "http"
        wrong = raw_answer(server.port, b"POST /cancel HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert wrong.split(b" ")[1] == b"401", wrong[:80]


def test_a_reserved_slot_is_refused_on_its_request_line_not_held_for_its_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the ordinary slots, a client that sends another request line than the owner's
    controls and then trickles its headers is refused on that line, at once: a flood of such
    clients held each reserved slot for its deadline, and /healthz found none free."""
    from trt_otel.views import http as view

    monkeypatch.setattr(view, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(view, "RESERVED_CONNECTIONS", 1)
    monkeypatch.setattr(view, "RESERVED_DEADLINE_S", 60.0)
    with every_ordinary_slot_held(2) as (_, server):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
            slow.sendall(b"GET /status HTTP/1.1\r\nHost: local")  # and no more
            assert slow.recv(65536).startswith(b"HTTP/1.1 503"), "held for its headers"
        # The refused clients' slots are freed as their handlers end, a moment after the
        # answer: /healthz finds one within seconds, where a held slot would last a minute.
        wait_until(
            lambda: raw_answer(server.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .split(b" ")[1] == b"200",
            "/healthz answered on a reserved slot",
            timeout_s=10,
        )  # fmt: skip


def test_a_request_that_trickles_in_is_dropped_at_its_deadline(
    served: tuple[BuildMonitor, StatusServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends its headers a byte at a time, each well inside the read timeout, is
    cut off once the request's deadline passes, so it cannot hold a slot for ever."""
    from trt_otel.views import http as view

    monkeypatch.setattr(view, "REQUEST_DEADLINE_S", 1.0)
    _, server = served
    # Before the connection: the server's deadline cannot start earlier (taken after it, the
    # server, which accepted first, once cut the request 0.4 ms short of a second).
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        closed = False
        for byte in b"GET /status HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 60:
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            readable, _, _ = select.select([connection], [], [], 0.2)  # a drip every 0.2 s
            if readable and connection.recv(65536) == b"":
                closed = True
                break
        took = time.monotonic() - began
    assert closed, "the trickling request was still being read after 12 s"
    assert 1.0 <= took < 4.0, took


def test_a_view_served_on_a_name_answers_that_name_however_it_is_written() -> None:
    """Served on a host name rather than an IP, the view answers that name as DNS compares
    names: in any case, with or without its trailing dot, on any port."""
    from trt_otel.views.http_hosts import HostCheck

    hosts = HostCheck("Build-Node.Example.")
    for header in ["build-node.example", "BUILD-NODE.EXAMPLE:9000", "build-node.example.:80"]:
        assert hosts.accepts(header), header
    assert not hosts.accepts("other-node.example")
    assert not hosts.accepts("10.1.2.3"), "served on a name: no IP literal is that name"


def test_a_host_header_takes_a_port_of_up_to_five_digits_and_nothing_longer() -> None:
    """A port is 1 to 5 digits (65535 is the largest): a longer one is no ``host:port`` and
    the request is refused, as is a port that is not digits or an empty name."""
    from trt_otel.views.http_hosts import HostCheck

    hosts = HostCheck("127.0.0.1")
    for header in ["localhost:1", "localhost:65535", "127.0.0.1:8"]:
        assert hosts.accepts(header), header
    for header in ["localhost:655350", "localhost:", "localhost:80a", ":8080", "[::1:80"]:
        assert not hosts.accepts(header), header


def test_a_cancel_body_of_exactly_the_limit_is_read_and_one_byte_more_is_refused(
    served: tuple[BuildMonitor, StatusServer],
) -> None:
    """``MAX_BODY`` is the largest body taken, not the first one refused."""
    from trt_otel.views.http import MAX_BODY

    monitor, server = served
    monitor.start()
    assert post(f"{server.url}/cancel", b"x" * (MAX_BODY + 1), AUTH)[0] == 413
    assert not monitor.cancelled
    code, answer = post(f"{server.url}/cancel", b"y" * MAX_BODY, AUTH)
    assert code == 202, answer
    assert answer["reason"] == "y" * 200, "the reason is its first 200 characters"


def test_event_streams_past_the_cap_are_refused_until_one_leaves(
    served: tuple[BuildMonitor, StatusServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most ``MAX_SSE_CLIENTS`` streams at once (a smaller cap here, the same rule): the
    next is answered 503 with a ``Retry-After``, and is served once a stream has gone."""
    from trt_otel.views import http as view

    monkeypatch.setattr(view, "MAX_SSE_CLIENTS", 3)
    # A stream whose client left is let go at its next write: its next keepalive here, not
    # 15 s on.
    monkeypatch.setattr(view, "KEEPALIVE_S", 0.2)
    monitor, server = served
    monitor.start()

    def stream() -> http.client.HTTPResponse:
        # The answer holds the connection's socket (a stream has no length): kept, it stays.
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("GET", "/events")
        return connection.getresponse()

    streams = []
    try:
        for _ in range(3):
            streams.append(stream())
            assert streams[-1].status == 200  # counted before its answer
        assert server.sse_clients == 3
        refused = stream()
        assert (refused.status, refused.getheader("Retry-After")) == (503, "5")
        refused.close()
        streams.pop().close()
        wait_until(lambda: server.sse_clients == 2, "a closed stream was never let go", 30)
        streams.append(stream())
        assert streams[-1].status == 200
    finally:
        for answer in streams:
            answer.close()
