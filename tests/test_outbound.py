"""Every call trt-otel makes to a peer has one deadline, connect, headers and body together,
held against real peers that drip their answer a byte every half second (``dripping.py``): the
helper they share (core/deadlines.py, core/outbound.py), the Pushgateway push, the OTLP
exports and their final flush, the fleet's calls to a build's HTTP view and Ray's job server.
The cancel URL's poll is held in test_policy_isolation.py, ``watch --url`` in
test_watch_lost.py."""

from __future__ import annotations

import base64
import http.server
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from cli import CLI
from dripping import drip_head, dripping
from otlp_receiver import hanging_collector
from trt_otel import BuildMonitor
from trt_otel.app.components import final_push
from trt_otel.app.config import MetricsConfig
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core import outbound
from trt_otel.core.deadlines import Deadline, DeadlineExceededError, call_within
from trt_otel.core.urls import shown
from trt_otel.views.otlp_http import AcceptedOn2xx, NotAccepted
from trt_otel.views.prometheus import MetricSources, metrics_registry, push_build_metrics
from waiting import wait_until

PLACES = ["headers", "body", "mute"]
SLACK_S = 2.0
"""What a bounded call may take past its deadline here (a loaded machine's scheduling: 0.8 s
was once too little for a Ray client's call at load 6). The peers drip for as long as they are
read, so a bound of seconds still tells a deadline from none."""


def bounded(call: Callable[[], object], limit_s: float) -> tuple[object, float]:
    """Run ``call`` on a thread: what it returned or raised, and how long it took. A call
    still running after ``limit_s`` fails the test rather than hanging it."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:
            outcome.append(error)

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still waiting on the peer after {limit_s:g}s"
    return outcome[0], time.monotonic() - began


# -- the helper -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", [*PLACES, "tls"])
def test_a_call_is_bounded_as_a_whole_wherever_the_peer_drips(where: str) -> None:
    with dripping(where) as server:

        def call() -> object:
            with Deadline(1.0) as deadline:
                return outbound.call(f"{server.url}/x", deadline, max_bytes=1 << 20)

        outcome, took = bounded(call, 10)
    assert isinstance(outcome, DeadlineExceededError), outcome
    assert str(outcome) == "no complete answer within 1.0s"
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


def test_an_answer_within_the_deadline_is_whole_and_a_redirect_is_not_followed() -> None:
    moved = answering(307, b"moved", location="https://elsewhere.example/v1")
    with moved as (url, paths), Deadline(5.0) as deadline:
        answer = outbound.call(f"{url}/here", deadline, max_bytes=1 << 20)
    assert (answer.status, answer.body) == (307, b"moved")
    assert answer.redirect() == "307 Temporary Redirect, to 'https://elsewhere.example/v1'"
    assert paths == ["/here"], "nothing followed"


def test_a_call_to_a_builds_own_view_goes_straight_there_past_any_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``proxies=False`` (the fleet's calls to a build's view on loopback, a cancel URL): to
    the server itself, whatever ``http_proxy`` says; ``proxies=True`` (a Pushgateway, as
    prometheus_client does): through the proxy the environment names."""
    with (
        answering(200, b"target") as (target, at_target),
        answering(200, b"proxy") as (
            proxy,
            at_proxy,
        ),
    ):
        monkeypatch.setenv("http_proxy", proxy)
        for name in ("no_proxy", "NO_PROXY"):
            monkeypatch.delenv(name, raising=False)
        with Deadline(5.0) as deadline:
            direct = outbound.call(f"{target}/x", deadline, max_bytes=1 << 10, proxies=False)
        with Deadline(5.0) as deadline:
            proxied = outbound.call(f"{target}/y", deadline, max_bytes=1 << 10, proxies=True)
    assert (direct.body, at_target) == (b"target", ["/x"])
    assert (proxied.body, at_proxy) == (b"proxy", [f"{target}/y"])


def test_a_call_lets_go_of_its_sockets_and_a_closed_deadline_shuts_nothing() -> None:
    """The guard keeps a duplicate of each socket's descriptor for the call's length only; a
    deadline that passes after its call ended leaves the (pooled, reused) connection alone."""
    before = len(os.listdir("/proc/self/fd"))
    with answering(200, b"ok") as (url, _):
        for _ in range(20):
            with Deadline(5.0) as deadline:
                assert outbound.call(url, deadline, max_bytes=100).body == b"ok"
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # the server's own, at most
    left, right = socket.socketpair()
    with left, right:
        deadline = Deadline(0.0)
        deadline.close()
        deadline.guard(left)  # after the call: not kept
        deadline._expire()  # the watchman, late
        left.sendall(b"still open")
        assert right.recv(100) == b"still open"
        assert not deadline.expired


def test_call_within_answers_on_time_and_hands_over_the_call_s_own_error() -> None:
    release = threading.Event()
    began = time.monotonic()
    with pytest.raises(DeadlineExceededError, match=r"no answer within 0\.5s"):
        call_within(0.5, release.wait, name="test-stuck")
    assert time.monotonic() - began < 0.5 + SLACK_S
    release.set()
    assert call_within(5, lambda: 42, name="test-quick") == 42
    with pytest.raises(ZeroDivisionError):
        call_within(5, lambda: 1 // 0, name="test-raises")


# -- the Pushgateway ------------------------------------------------------------------------------


def a_registry() -> Any:
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(3))
    monitor.end()
    return metrics_registry(MetricSources(monitor))


@pytest.mark.parametrize("where", PLACES)
def test_a_push_to_a_pushgateway_that_drips_ends_at_its_deadline(where: str) -> None:
    """prometheus_client's own handler bounds each read: a Pushgateway (or a proxy) that drips
    its answer held the push, and the command, for as long as it dripped."""
    registry = a_registry()
    with dripping(where) as server:
        outcome, took = bounded(lambda: push_build_metrics(registry, server.url, timeout_s=1.0), 10)
    assert isinstance(outcome, OSError), outcome
    assert "no complete answer within 1.0s" in str(outcome)
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


def test_a_pushgateway_that_redirects_is_a_failure_and_is_not_followed() -> None:
    registry = a_registry()
    moved = answering(307, b"", location="https://gateway.example/")
    with moved as (url, paths), pytest.raises(OSError) as raised:
        push_build_metrics(registry, url)
    assert "answered 307 Temporary Redirect, to 'https://gateway.example/'" in str(raised.value)
    assert "a push is not redirected" in str(raised.value)
    assert len(paths) == 1 and paths[0].startswith("/metrics/job/trt_otel/build_id/")


def test_a_user_and_password_in_the_pushgateway_url_go_as_basic_auth_and_are_never_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``https://user:password@host`` is how Prometheus' users write a protected Pushgateway:
    http.client took the pair for part of the host, and the warning printed the password."""
    registry = a_registry()
    heard: list[str | None] = []
    with answering(200, b"", authorizations=heard) as (url, paths):
        push_build_metrics(registry, url.replace("http://", "http://ci:s%3Acret@"))
    assert heard == ["Basic " + base64.b64encode(b"ci:s:cret").decode()]
    assert len(paths) == 1 and paths[0].startswith("/metrics/job/trt_otel/build_id/")

    with (
        answering(503, b"") as (url, _),
        final_push(
            registry, MetricsConfig(pushgateway=url.replace("http://", "http://ci:s3cret@"))
        ),
    ):
        pass
    said = capsys.readouterr().err
    assert "cannot push metrics to http://ci:***@127.0.0.1:" in said, said
    assert "s3cret" not in said


@pytest.mark.e2e
def test_the_command_says_once_that_a_dripping_pushgateway_did_not_answer() -> None:
    with dripping("headers") as server:
        done = subprocess.run(
            [*CLI, "demo", "--speed", "0", "--no-progress", "--no-gpu",
             "--pushgateway", server.url],
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = f"cannot push metrics to {server.url}: no complete answer within 5.0s"
    assert done.stderr.count(said) == 1, done.stderr
    assert "Traceback" not in done.stderr


# -- OTLP -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", PLACES)
def test_the_otlp_session_gives_each_request_its_timeout_in_all(where: str) -> None:
    """The session every OTLP/HTTP exporter sends through (spans, log records, metrics):
    ``requests`` bounds each read, so a dripping collector held an export, and its thread, for
    as long as it dripped."""
    with dripping(where) as server:
        outcome, took = bounded(
            lambda: AcceptedOn2xx().post(f"{server.url}/v1/traces", data=b"x", timeout=1.0), 10
        )
    assert isinstance(outcome, requests.Timeout), outcome
    assert "no complete answer within 1.0s" in str(outcome)
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


def test_an_otlp_span_export_to_a_dripping_collector_fails_within_its_timeout() -> None:
    from opentelemetry.sdk.trace.export import SpanExportResult

    from trt_otel.views.otlp_settings import OtlpSettings

    with dripping("headers") as server:
        settings = OtlpSettings(f"{server.url}/v1/traces", "http/protobuf", request_timeout_s=1.0)
        exporter = settings.make_exporter()
        outcome, took = bounded(lambda: exporter.export([]), 10)
    assert outcome is SpanExportResult.FAILURE
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


def test_an_otlp_session_bounds_a_request_on_a_connection_it_kept() -> None:
    """The session keeps its connection between exports: a collector that answered the first
    export and drips its answer to the next, on the same connection, is bounded too."""
    with answer_then_drip() as (url, connections):
        session = AcceptedOn2xx()
        assert session.post(f"{url}/v1/traces", data=b"x", timeout=5.0).status_code == 200
        outcome, took = bounded(
            lambda: session.post(f"{url}/v1/traces", data=b"x", timeout=1.0), 10
        )
    assert connections == [1], "one connection, kept"
    assert isinstance(outcome, requests.Timeout), outcome
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
@pytest.mark.e2e
def test_the_final_flush_of_spans_logs_and_metrics_ends_within_one_flush_timeout(
    protocol: str,
) -> None:
    """Against a collector that accepts and never answers, the three OTLP exports flush at
    once, within ``--otlp-flush-timeout``: they flushed one after the other (twice the timeout
    with --otlp-metrics)."""
    with hanging_collector() as port:
        ended = run_until_exit(
            [*CLI, "demo", "--speed", "0", "--no-progress", "--no-gpu",
             "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", protocol,
             "--otlp-logs-level", "info", "--otlp-metrics", "--otlp-flush-timeout", "3s"],
            after="build success",
        )  # fmt: skip
    code, lines, flushed_s = ended
    assert code == 0, lines
    text = "\n".join(lines)
    assert "spans not exported" in text and "log records not exported" in text, text
    assert "the final metrics were not exported over OTLP (no answer within 3s)" in text, text
    # One after the other, they took 6 s and more.
    assert flushed_s < 3.0 + 1.8, f"{flushed_s:.1f}s from the build's end to the exit"


def run_until_exit(command: list[str], *, after: str) -> tuple[int, list[str], float]:
    """Run ``command``: its exit code, its lines (stdout and stderr), and the seconds from the
    first line containing ``after`` to its exit."""
    lines: list[str] = []
    seen_at: float | None = None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line.rstrip("\n"))
                if seen_at is None and after in line:
                    seen_at = time.monotonic()
            code = process.wait(90)
        finally:
            if process.poll() is None:
                process.kill()
    assert seen_at is not None, lines
    return code, lines, time.monotonic() - seen_at


# -- the fleet ------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", PLACES)
def test_the_fleets_calls_to_a_builds_view_are_bounded(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build's HTTP view that drips (its process stopped halfway through an answer): the
    fleet's status call reads nothing from it, and a cancel fails, each by its deadline."""
    from trt_otel.app import fleet

    monkeypatch.setattr(fleet, "STATUS_TIMEOUT_S", 1.0)
    monkeypatch.setattr(fleet, "CANCEL_TIMEOUT_S", 1.0)
    with dripping(where) as server:
        status, took = bounded(lambda: fleet._get_json(f"{server.url}/status"), 10)
        assert status is None and took < 1.0 + SLACK_S, f"{took:.1f}s"
        cancel, took = bounded(lambda: fleet._post_cancel(server.url, "token", "why"), 10)
    assert isinstance(cancel, DeadlineExceededError), cancel
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


def test_a_ray_job_server_that_drips_is_an_error_in_time(tmp_path: Path) -> None:
    """Ray's job client makes a ``requests`` session of its own for each call, with no timeout:
    a job server that answers its version check and then drips held a submission forever."""
    pytest.importorskip("ray.job_submission")
    from trt_otel.app.fleet_documents import BuildRequest
    from trt_otel.app.fleet_requests import FleetError
    from trt_otel.app.ray_fleet import RayFleet

    with ray_job_server() as url:
        fleet = RayFleet(url, tmp_path, call_timeout_s=1.0)
        outcome, took = bounded(lambda: fleet.start(BuildRequest(kind="demo")), 20)
    assert isinstance(outcome, FleetError), outcome
    assert "Ray did not take the job (no answer within 1.0s)" in str(outcome)
    assert took < 1.0 + SLACK_S + 0.5, f"{took:.1f}s"  # the request's checks come first


def test_a_ray_job_server_that_drips_its_version_is_not_reached(tmp_path: Path) -> None:
    pytest.importorskip("ray.job_submission")
    from trt_otel.app.fleet_requests import FleetError
    from trt_otel.app.ray_fleet import RayFleet

    with dripping("headers") as server:
        outcome, took = bounded(lambda: RayFleet(server.url, tmp_path, call_timeout_s=1.0), 20)
    assert isinstance(outcome, FleetError), outcome
    assert str(outcome) == f"cannot reach Ray at {server.url}: no answer within 1.0s"
    assert took < 1.0 + SLACK_S, f"{took:.1f}s"


# -- peers ----------------------------------------------------------------------------------------


@contextmanager
def answering(
    status: int,
    body: bytes,
    *,
    location: str | None = None,
    authorizations: list[str | None] | None = None,
) -> Iterator[tuple[str, list[str]]]:
    """A real HTTP server answering every request with ``status`` and ``body`` (and a
    ``Location``); its URL and the paths asked for (and into ``authorizations``, each request's
    Authorization header)."""
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            paths.append(self.path)
            if authorizations is not None:
                authorizations.append(self.headers.get("Authorization"))
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self.answer()

        def do_POST(self) -> None:
            self.answer()

        def do_PUT(self) -> None:
            self.answer()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", paths
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def answer_then_drip() -> Iterator[tuple[str, list[int]]]:
    """A real HTTP/1.1 server that answers the first request on a connection, and drips its
    answer to the next one; its URL, and the number of each request's connection."""
    stopping = threading.Event()
    connections: list[int] = []
    count = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            count[0] += 1
            self.number, self.answered = count[0], 0

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.number not in connections:
                connections.append(self.number)
            self.answered += 1
            if self.answered == 1:
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            drip_head(self.wfile, stopping)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", connections
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()


@contextmanager
def ray_job_server() -> Iterator[str]:
    """Enough of Ray's job server for its client to be made (``/api/version``), whose other
    answers drip their head a byte every half second."""
    stopping = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/api/version":
                document = {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}
                body = json.dumps(document).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.drip()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.drip()

        def drip(self) -> None:
            drip_head(self.wfile, stopping)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()


def test_an_earlier_deadline_is_kept_while_a_later_one_is_watched() -> None:
    """The watchman wakes for the earliest deadline it watches: a call due in a fraction of a
    second has its socket shut then, not when a long call watched before it is due."""
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        with Deadline(60) as long, Deadline(0.2) as short:
            long.guard(pairs[0][0])
            short.guard(pairs[1][0])
            wait_until(lambda: short.expired, "the short deadline shut its socket", 10)
            assert pairs[1][0].recv(1) == b"", "shut down: reads end at once"
            assert not long.expired
    finally:
        for pair in pairs:
            for end in pair:
                end.close()


@pytest.mark.parametrize(
    ("url_user", "sent"),
    [("ci:s3cret@", "ci:s3cret"), ("token@", "token:"), (":s3cret@", ":s3cret"), ("", None)],
)
def test_whatever_credentials_a_url_carries_go_as_basic_auth_and_not_in_the_url(
    url_user: str, sent: str | None
) -> None:
    """A user alone (``https://TOKEN@host``, as CI tokens are written) is a credential too."""
    authorizations: list[str | None] = []
    server = answering(200, b"ok", authorizations=authorizations)
    with server as (url, paths), Deadline(5.0) as deadline:
        outbound.call(url.replace("//", f"//{url_user}", 1) + "/x", deadline, max_bytes=64)
    expected = None if sent is None else "Basic " + base64.b64encode(sent.encode()).decode()
    assert (authorizations, paths) == ([expected], ["/x"])


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://ci:s3cret@push.example/x", "https://ci:***@push.example/x"),
        ("https://ci:p@ss@push.example/x", "https://ci:***@push.example/x"),
        ("https://:s3cret@push.example", "https://:***@push.example"),
        ("https://token@push.example/x", "https://token@push.example/x"),
        ("https://push.example:99999/x", "https://push.example:99999/x"),
    ],
)
def test_a_url_is_shown_with_its_password_hidden_whatever_the_password_holds(
    url: str, said: str
) -> None:
    """The host is what follows the last ``@``, as the password is read: a password written
    with an ``@`` of its own (not percent-encoded) shows none of itself."""
    assert shown(url) == said


@pytest.mark.parametrize(
    ("status", "redirect"), [(300, True), (399, True), (400, False), (200, False)]
)
def test_only_a_3xx_answer_is_a_redirect(status: int, redirect: bool) -> None:
    with answering(status, b"") as (url, _), Deadline(5.0) as deadline:
        answer = outbound.call(f"{url}/x", deadline, max_bytes=64)
    assert (answer.redirect() is not None) is redirect


def test_an_otlp_collectors_400_goes_to_the_sdk_and_a_3xx_is_refused() -> None:
    """Answers of 400 and over are the SDK's to judge (it retries a 429 or a 503); a redirect,
    which it would take for success, is refused here. Sent as the SDK sends: no redirect
    followed."""
    with answering(400, b"bad") as (url, _):
        answer = AcceptedOn2xx().post(
            f"{url}/v1/traces", data=b"x", timeout=5.0, allow_redirects=False
        )
    assert answer.status_code == 400
    moved = answering(308, b"", location="https://elsewhere.example/")
    with moved as (url, _), pytest.raises(NotAccepted):
        AcceptedOn2xx().post(f"{url}/v1/traces", data=b"x", timeout=5.0, allow_redirects=False)


def test_a_call_whose_deadline_has_passed_is_refused_before_it_connects() -> None:
    """A deadline with no time left is exceeded at once: the call fails as a deadline's, and
    never reaches the peer (no connect is given 0 seconds, which would wait forever or not at
    all, as each library reads it)."""
    with answering(200, b"ok") as (url, paths), Deadline(0.0) as deadline:
        with pytest.raises(DeadlineExceededError, match=r"no complete answer within 0\.0s"):
            deadline.check()
        with pytest.raises(DeadlineExceededError):
            outbound.call(url, deadline, max_bytes=100)
        assert paths == []
    with Deadline(5.0) as later:
        assert 0.0 < later.check() <= 5.0
