"""A policy that blocks must not blind the others: a cancel file that is a FIFO or sits on a hung
mount, a cancel URL that drips its answer. Real FIFOs, real sockets, real worker processes."""

from __future__ import annotations

import contextlib
import os
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from cli import CLI
from dripping import DripServer, dripping
from journals import first_cancel
from trt_otel import BuildMonitor
from trt_otel.control.policies import AnyOf, Decision, Stall, Timeout
from trt_otel.control.probes import CancelFile, CancelUrl, Polled, fetch
from trt_otel.control.runner import PolicyRunner
from trt_otel.views.prometheus import MetricSources, metrics_registry
from waiting import wait_for_text, wait_until


def until_cancelled(monitor: BuildMonitor, timeout_s: float = 10) -> None:
    """Until ``monitor`` is cancelled or ``timeout_s`` has passed; the caller asserts which."""
    deadline = time.monotonic() + timeout_s
    while not monitor.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)


# -- a cancel file that blocks ------------------------------------------------------------------


class HungProbe(Polled):
    """A probe that blocks until released, as a ``stat`` on a hung NFS mount does."""

    source = "file"

    def __init__(self) -> None:
        super().__init__(interval_s=0.05, stuck_after_s=0.3)
        self.release = threading.Event()

    def describe(self) -> str:
        return "file(/mnt/hung/stop)"

    def probe(self) -> Decision | None:
        self.release.wait(30)
        return None


def test_a_hung_probe_is_reported_stuck_and_the_other_policies_still_decide() -> None:
    hung = HungProbe()
    warnings: list[str] = []
    monitor = BuildMonitor()
    runner = PolicyRunner(monitor, AnyOf(hung, Timeout(1.0)), interval_s=0.02, warn=warnings.append)
    try:
        with runner:
            monitor.start()
            until_cancelled(monitor)
    finally:
        hung.release.set()
    assert monitor.state.cancel is not None, "the timeout never fired: the hung probe starved it"
    assert monitor.state.cancel.source == "timeout"
    stuck = [w for w in warnings if "is stuck" in w]
    assert stuck and stuck[0].startswith("cancel policy file(/mnt/hung/stop) is stuck: no answer")
    assert "the other policies keep deciding" in stuck[0]
    assert hung.errors >= 1, "a stuck probe is counted as an error"


def test_a_fifo_as_cancel_file_is_a_signal_and_is_never_opened_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "stop"
    os.mkfifo(fifo)
    policy = CancelFile(fifo)
    done = threading.Event()

    def check() -> None:
        policy.poll_once()
        done.set()

    threading.Thread(target=check, daemon=True).start()
    try:
        assert done.wait(5), "reading the FIFO's reason blocked"
    finally:
        if not done.is_set():  # release the blocked open() so its thread ends
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    decision = policy.check(None)  # type: ignore[arg-type]
    assert decision is not None and decision.reason == f"cancel file {fifo} appeared"


@pytest.mark.e2e
def test_a_fifo_appearing_mid_build_cancels_it_at_once(tmp_path: Path) -> None:
    journal, fifo = tmp_path / "fifo.jsonl", tmp_path / "cf"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--journal", str(journal), "--cancel-file", str(fifo),
         "--timeout", "20s", "--silence", "60s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for_text(journal, b"Optimizing graph")
        os.mkfifo(fifo)
        began = time.monotonic()
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 3, err
    assert time.monotonic() - began < 15, "the cancel waited for something else"
    cancel = first_cancel(journal)
    assert (cancel.source, cancel.reason) == ("file", f"cancel file {fifo} appeared")


# -- a cancel URL that drips ------------------------------------------------------------------


@pytest.fixture(params=["headers", "body"])
def drip_server(request: pytest.FixtureRequest) -> Iterator[DripServer]:
    """A flag server that drips its answer a byte every tenth of a second, in its headers or in
    a body that never reaches its Content-Length."""
    with dripping(request.param, drip_s=0.1) as server:
        yield server


def flag_url(server: DripServer) -> str:
    """The cancel URL's flag on ``server`` (which answers any path alike, dripping)."""
    return f"{server.url}/flag"


def test_one_poll_is_bounded_as_a_whole(drip_server: DripServer) -> None:
    outcome: list[BaseException | tuple[int, bytes]] = []

    def poll() -> None:
        try:
            outcome.append(fetch(flag_url(drip_server), 1.0, 65536))
        except Exception as error:
            outcome.append(error)

    began = time.monotonic()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    poller.join(10)  # a failure, not a hang, when the bound does not hold
    assert not poller.is_alive(), "the poll was still reading its dripping answer after 10s"
    assert time.monotonic() - began < 1.8
    assert isinstance(outcome[0], TimeoutError)
    assert str(outcome[0]) == "no complete answer within 1.0s"


@pytest.mark.e2e
def test_a_dripping_cancel_url_fails_closed(tmp_path: Path, drip_server: DripServer) -> None:
    journal = tmp_path / "drip.jsonl"
    result = subprocess.run(
        [*CLI, "demo", "--no-progress", "--journal", str(journal),
         "--cancel-url", flag_url(drip_server), "--cancel-url-interval", "0.5s",
         "--cancel-url-fail-closed", "--silence", "60s"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    cancel = first_cancel(journal)
    assert cancel.source == "http" and "failing closed" in cancel.reason
    assert "no complete answer within 0.5s" in cancel.reason
    assert drip_server.requests >= 3, "each poll is its own request, the first did not hang"
    assert result.stderr.count("no complete answer within 0.5s") >= 1


def test_a_stuck_policy_shows_in_the_metrics() -> None:
    hung = HungProbe()
    monitor = BuildMonitor()
    runner = PolicyRunner(monitor, hung, interval_s=0.02, warn=lambda message: None)
    registry = metrics_registry(MetricSources(monitor, policy_health=runner.health))
    try:
        with runner:
            monitor.start()
            wait_until(lambda: hung.health().stuck_s is not None, "the probe never got stuck", 5)
            text = generate_latest(registry).decode()
    finally:
        hung.release.set()
    line = next(x for x in text.splitlines() if x.startswith("trt_otel_policy_stuck_seconds"))
    assert line.startswith('trt_otel_policy_stuck_seconds{policy="file"} ')
    assert float(line.split()[-1]) >= 0.3


def test_a_stall_still_fires_while_a_cancel_url_hangs() -> None:
    monitor = BuildMonitor()
    with dripping("headers", drip_s=0.5) as server:
        url = CancelUrl(flag_url(server), interval_s=10)
        with PolicyRunner(monitor, AnyOf(url, Stall(0.5)), interval_s=0.02, warn=lambda m: None):
            monitor.start()
            until_cancelled(monitor)
    assert monitor.state.cancel is not None and monitor.state.cancel.source == "stall"


class LateBodyHandler(socketserver.BaseRequestHandler):
    """HTTP/1.0 with ``Connection: close``: the client lets go of the socket after the headers,
    and the body comes a moment later."""

    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"HTTP/1.0 500 Oops\r\nConnection: close\r\nContent-Length: 4\r\n\r\n")
        time.sleep(0.2)  # the late body under test, not a wait
        self.request.sendall(b"oops")


def test_a_body_sent_after_its_headers_on_a_closing_connection_is_read() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), LateBodyHandler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/flag"
        assert fetch(url, 2.0, 100) == (500, b"oops")
    finally:
        server.shutdown()
        server.server_close()


class FailingProbe(Polled):
    """A probe that fails every time it is asked, after ``release`` is set."""

    source = "url"

    def __init__(self, *, stuck_after_s: float = 30.0) -> None:
        super().__init__(interval_s=0.05, stuck_after_s=stuck_after_s, fail_closed=True)
        self.release = threading.Event()
        self.release.set()

    def describe(self) -> str:
        return "url(http://flags.invalid/stop)"

    def probe(self) -> Decision | None:
        self.release.wait(30)
        raise OSError("connection refused")


def test_failing_closed_takes_three_errors_in_a_row_not_more_not_fewer() -> None:
    policy = FailingProbe()
    for _ in range(2):
        policy.poll_once()
        assert policy.check(None) is None, "fewer than 3 errors in a row must not decide"  # type: ignore[arg-type]
    policy.poll_once()
    decision = policy.check(None)  # type: ignore[arg-type]
    assert decision is not None, "the third error in a row must fail closed"
    assert decision.reason.startswith("url(http://flags.invalid/stop) failed 3 times in a row")


def test_a_stuck_probe_that_then_fails_is_one_error_not_two() -> None:
    policy = FailingProbe(stuck_after_s=0.2)
    policy.release.clear()
    probing = threading.Thread(target=policy.poll_once, daemon=True)
    probing.start()
    deadline = time.monotonic() + 10
    while policy.errors == 0 and time.monotonic() < deadline:
        policy.check(None)  # type: ignore[arg-type]  # counts the overrun once it is due
        time.sleep(0.02)
    assert policy.errors == 1, "the stuck probe was never counted"
    policy.release.set()
    probing.join(10)
    assert not probing.is_alive()
    assert (policy.errors, policy.consecutive_errors) == (1, 1), "one probe counted twice"
    assert policy.last_error is not None and policy.last_error.startswith("no answer for")
