"""The HTTP view answers HEAD like GET without a body, and keeps serving an ended build's final
status for a short linger, so pollers see it and a late POST /cancel gets its 409."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cli import announced_url, start_demo

pytestmark = pytest.mark.e2e


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """A demo serving HTTP on a free port, its cancel token ``t``; the process and its base
    URL."""
    process = start_demo(
        "--no-gpu", "--http-port", "0", "--cancel-token", "t", *args, stdout=subprocess.DEVNULL
    )
    return process, announced_url(process)


def test_head_is_a_get_without_its_body(tmp_path: Path) -> None:
    process, url = start("--silence", "30s")
    try:
        host = url.removeprefix("http://")
        for path, status, kind in [
            ("/status", 200, "application/json"),
            ("/healthz", 200, "application/json"),
            ("/metrics", 200, "text/plain"),
            ("/events", 200, "text/event-stream"),
            ("/nowhere", 404, "application/json"),
        ]:
            connection = http.client.HTTPConnection(host, timeout=10)
            connection.request("HEAD", path)
            response = connection.getresponse()
            assert (response.status, path) == (status, path)
            assert response.getheader("Content-Type", "").startswith(kind)
            assert response.read() == b""
            connection.close()
        # On the wire: nothing after the headers (a client would read it as the next answer).
        with socket.create_connection((host.split(":")[0], int(host.split(":")[1])), 10) as raw:
            raw.sendall(b"HEAD /status HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := raw.recv(65536):
                answer += chunk
        assert answer.split(b"\r\n\r\n", 1)[1] == b""
        # One connection, a HEAD then a GET: the GET has its body.
        connection = http.client.HTTPConnection(host, timeout=10)
        connection.request("HEAD", "/status")
        head = connection.getresponse()
        head.read()
        connection.request("GET", "/status")
        body = connection.getresponse().read()
        connection.close()
        assert int(head.getheader("Content-Length", "0")) > 0
        assert json.loads(body)["status"] in ("pending", "running")  # a body, and the status
    finally:
        process.kill()
        process.communicate()


def test_the_final_status_lingers_and_a_late_cancel_gets_409() -> None:
    process, url = start("--speed", "0", "--http-linger", "20s")
    assert process.stderr is not None
    try:
        for line in process.stderr:
            if "build success" in line:
                break
        time.sleep(2.0)  # a poller that comes by a little after the end
        request = urllib.request.Request(
            f"{url}/cancel", data=b"too late", headers={"Authorization": "Bearer t"},
            method="POST",
        )  # fmt: skip
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("a cancel after the end was accepted")
        except urllib.error.HTTPError as error:
            assert error.code == 409
            assert json.loads(error.read())["outcome"] == "success"
        with urllib.request.urlopen(f"{url}/status", timeout=10) as response:
            assert json.loads(response.read())["outcome"] == "success"
        began = time.monotonic()
        process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0
    assert time.monotonic() - began < 10, "once the final status was read, the view need not wait"
