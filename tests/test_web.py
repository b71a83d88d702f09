"""The live web page (``GET /``), driven in a real headless Chromium through Selenium.

Each test runs a real ``trt-otel demo`` process serving its HTTP view, points the browser at it
and reads what a person would see. The browser comes from the system (Debian's ``chromium`` and
``chromium-driver``, which ``.ci/run`` installs); without it these tests are skipped, except in
CI, where a missing browser is a failure. Screenshots go to ``TRT_OTEL_SCREENSHOTS`` when set.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from prometheus_client import CollectorRegistry

from browser import chromium
from cli import ServingBuild
from trt_otel import BuildMonitor, Outcome
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.capture.gpu import GpuReading, GpuSampler
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.http import StatusServer

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

TOKEN = "page-token-for-tests"
T = TypeVar("T")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module's tests, its window 1100 by 1200."""
    with chromium(1100, 1200) as driver:
        yield driver


@pytest.fixture
def page(browser: WebDriver) -> Iterator[WebDriver]:
    browser.set_window_size(1100, 1200)
    yield browser
    browser.get("about:blank")  # drop the page's event stream before the next build
    browser_log(browser)


class Demo(ServingBuild):
    """A ``trt-otel demo`` serving its HTTP view on a free port, with a known cancel token.

    ``lines`` collects what it prints; leaving the ``with`` block stops it if still running.
    """

    def __init__(self, *args: str) -> None:
        super().__init__(
            "demo", "--no-progress", "--http-port", "0", "--cancel-token", TOKEN, *args
        )


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = probe()
        except WebDriverException:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def text_of(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def visible(driver: WebDriver, element_id: str) -> bool:
    return bool(driver.find_element(By.ID, element_id).is_displayed())


def progress_percent(driver: WebDriver) -> int:
    return int(text_of(driver, "progress-text").rstrip("%") or 0)


def tree_texts(driver: WebDriver) -> list[str]:
    """The text of each line of the page's phase tree, as it is drawn now."""
    return [str(item.text) for item in driver.find_elements(By.CSS_SELECTOR, "#tree li")]


def outcome(driver: WebDriver) -> str | None:
    return text_of(driver, "outcome") if visible(driver, "end") else None


def screenshot(driver: WebDriver, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TRT_OTEL_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path))
    return path


def browser_log(driver: WebDriver) -> list[dict[str, Any]]:
    """The console entries since the last call (Selenium leaves this call untyped)."""
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[no-untyped-call]
    return entries


def page_errors(driver: WebDriver) -> list[str]:
    """Errors the page logged (a script error, a blocked resource, a CSP violation), less the
    requests that met the build's process exiting at its end."""
    gone = (
        "ERR_CONNECTION_RESET",
        "ERR_CONNECTION_REFUSED",
        "ERR_EMPTY_RESPONSE",
        "ERR_SOCKET_NOT_CONNECTED",
        # A response cut short by the same exit: the timeline the page asked for as it ended.
        "ERR_CONTENT_LENGTH_MISMATCH",
    )
    return [
        entry["message"]
        for entry in browser_log(driver)
        if entry["level"] == "SEVERE"
        and "/favicon.ico" not in entry["message"]
        and not any(word in entry["message"] for word in gone)
    ]


def test_page_shows_the_build_moving_to_its_outcome(page: WebDriver, tmp_path: Path) -> None:
    with Demo("--speed", "2") as demo:
        page.get(demo.base + "/")
        assert page.title == "TensorRT build"
        seen: list[int] = []
        # What the page said of the last callback while no outcome was shown (once the build
        # has ended it shows a dash: a loaded machine can get there before the asserts below).
        last_callback: list[str] = []

        def progress_moved() -> bool:
            value = progress_percent(page)
            if not seen or value != seen[-1]:
                seen.append(value)
            if outcome(page) is None:
                last_callback.append(text_of(page, "last-callback"))
            return len(seen) >= 4 or outcome(page) is not None

        wait_for("progress to move", progress_moved)
        # TensorRT's progress is not monotonic (a new root phase can pull the average down),
        # so "moving" is: several different values, going up overall.
        assert len(set(seen)) >= 3 and max(seen) > seen[0], seen
        # Read inside the probe: the page redraws its tree as the build moves, and an element
        # read after a redraw is stale (read again).
        tree = wait_for("the phase tree", lambda: tree_texts(page))
        assert any("Building engine" in text for text in tree)
        assert re.fullmatch(r"\d+\.\ds|\d+m\d\ds", text_of(page, "elapsed"))
        assert any(text.endswith("ago") for text in last_callback), last_callback
        assert wait_for("the outcome", lambda: outcome(page)) == "Built successfully (success)"
        assert progress_percent(page) == 100
        assert text_of(page, "state") == "success"
        # Folded like /status: a name repeated under one parent is one line with a count.
        assert wait_for("the folded tree", lambda: any("×" in t for t in tree_texts(page)))
        screenshot(page, "web-success", tmp_path)
        assert demo.wait() == 0
        assert page_errors(page) == []


def test_page_says_when_tensorrt_is_inside_a_silent_step(page: WebDriver, tmp_path: Path) -> None:
    with Demo("--speed", "4", "--silence", "12s") as demo:
        page.get(demo.base + "/")
        notice = wait_for(
            "the silent-step notice",
            lambda: text_of(page, "silence-text") if visible(page, "silence") else None,
        )
        assert notice.startswith("Silent step: no callback from TensorRT for ")
        assert re.search(r"inside step \d+ of \d+ of “[^”]+”", notice), notice
        before = text_of(page, "last-callback")
        time.sleep(1.5)  # the notice counts the silence up while nothing arrives
        assert text_of(page, "last-callback") != before
        screenshot(page, "web-silent-step", tmp_path)
        wait_for("the silence to end", lambda: not visible(page, "silence"))
        assert wait_for("the outcome", lambda: outcome(page)) == "Built successfully (success)"
        assert demo.wait() == 0


def test_page_says_whether_the_builder_is_working_or_idle(page: WebDriver, tmp_path: Path) -> None:
    # The simulator sleeps through its silent window: its process, sampled four times a
    # second, shows no CPU, and the verdict in the header turns to idle.
    with Demo("--speed", "0", "--silence", "12s", "--sample-interval", "0.25s") as demo:
        page.get(demo.base + "/")
        verdict = wait_for(
            "the builder to be idle",
            lambda: (
                text_of(page, "builder-verdict")
                if visible(page, "builder") and "idle" in text_of(page, "builder-verdict")
                else None
            ),
        )
        assert re.fullmatch(r"idle for \d+\.\ds \(CPU \d+%, \d+(\.\d+)? [KMG]iB\)", verdict), (
            verdict
        )
        assert text_of(page, "builder").startswith("builder: ")
        element = page.find_element(By.ID, "builder-verdict")
        assert element.get_attribute("data-state") == "idle"
        details = str(element.get_attribute("title"))
        # The builder runs in a child of the demo's process: that child is the one sampled.
        shown = re.match(r"process (\d+) · sleeping · ", details)
        assert shown, details
        children = psutil.Process(demo.process.pid).children(recursive=True)
        assert int(shown.group(1)) in {child.pid for child in children}
        # How long it has been idle counts up with the samples.
        later = wait_for(
            "the idle time to count up",
            lambda: ((text := text_of(page, "builder-verdict")) != verdict and text) or None,
        )
        assert later.startswith("idle for "), later
        screenshot(page, "web-builder-idle", tmp_path)
        assert wait_for("the outcome", lambda: outcome(page)) == "Built successfully (success)"
        assert demo.wait() == 0
        assert page_errors(page) == []


def submit_cancel(page: WebDriver, token: str, reason: str = "") -> str:
    """Fill the page's cancel form from the keyboard and return the status it shows."""
    result = page.find_element(By.ID, "cancel-result")
    page.execute_script("arguments[0].dataset.status = ''", result)
    field = page.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    box = page.find_element(By.ID, "reason")
    box.clear()
    box.send_keys(reason, Keys.ENTER)  # Enter in a field submits the form

    def answer() -> str | None:
        status = result.get_attribute("data-status")
        return str(status) if status else None

    return wait_for("the cancel answer", answer, timeout_s=15)


def test_cancel_from_the_page(page: WebDriver, tmp_path: Path) -> None:
    with Demo("--speed", "1", "--grace", "5s") as demo:
        page.get(demo.base + "/")
        wait_for("progress", lambda: progress_percent(page) > 0)
        assert submit_cancel(page, "") == "401"
        assert "token is needed" in text_of(page, "cancel-result")
        assert submit_cancel(page, "not-the-token") == "403"
        assert "Wrong token" in text_of(page, "cancel-result")
        assert demo.process.poll() is None
        assert submit_cancel(page, TOKEN, "stopped from the page") == "202"
        assert "Cancel accepted" in text_of(page, "cancel-result")
        assert wait_for("the outcome", lambda: outcome(page)) == (
            "The build was cancelled (cancellation)"
        )
        assert text_of(page, "cancel-reason") == "stopped from the page"
        assert text_of(page, "cancel-source") == "http"
        assert not page.find_element(By.ID, "cancel-button").is_enabled()
        screenshot(page, "web-cancelled", tmp_path)
        assert demo.wait() == 3


# -- against a view in this process, to hold a build in a chosen state ---------------------------


@pytest.fixture
def served() -> Iterator[tuple[BuildMonitor, StatusServer]]:
    monitor = BuildMonitor()
    model = ReadModel()
    monitor.log.follow(model)
    server = StatusServer(monitor, model, CollectorRegistry(), port=0, cancel_token=TOKEN)
    monitor.log.follow(server.feed, capacity=1_000_000)
    try:
        yield monitor, server
    finally:
        monitor.end()
        monitor.close()
        server.close(linger_s=2.0)


def test_a_cancel_after_the_end_shows_409(
    page: WebDriver, served: tuple[BuildMonitor, StatusServer]
) -> None:
    monitor, server = served
    monitor.start()
    monitor.phase_start("Building engine", None, 2)
    monitor.step_complete("Building engine", 0)
    monitor.end(Outcome.SUCCESS)
    page.get(server.url + "/")
    assert wait_for("the outcome", lambda: outcome(page)) == "Built successfully (success)"
    # The button is off once the build has ended; a request sent anyway gets the view's answer.
    assert not page.find_element(By.ID, "cancel-button").is_enabled()
    page.execute_script("document.getElementById('cancel-button').disabled = false")
    assert submit_cancel(page, TOKEN) == "409"
    assert "already ended" in text_of(page, "cancel-result")


class RisingGpu:
    """A GPU whose load climbs by a tenth each reading (NVML needs a real one)."""

    index = 0

    def __init__(self) -> None:
        self.readings = 0

    def read(self) -> GpuReading:
        self.readings += 1
        load = min(1.0, self.readings / 10)
        return GpuReading(
            memory_used_bytes=int(load * 8 * 2**30),
            memory_total_bytes=80 * 2**30,
            utilization=load,
        )

    def process_memory_bytes(self, pid: int) -> int | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"gpu.name": "rising"}

    def close(self) -> None:
        pass


def test_gpu_samples_are_drawn_over_time(
    page: WebDriver, served: tuple[BuildMonitor, StatusServer], tmp_path: Path
) -> None:
    monitor, server = served
    monitor.start()
    monitor.phase_start("Building engine", None, 2)
    page.get(server.url + "/")
    wait_for("the page", lambda: text_of(page, "link") == "live")
    assert not visible(page, "gpu")  # nothing sampled, nothing shown
    with GpuSampler(monitor, RisingGpu(), interval_s=0.05):
        wait_for("ten samples", lambda: "100% busy" in text_of(page, "gpu-now"))
    assert text_of(page, "gpu-now") == "GPU 0 · 100% busy · 8.0 of 80 GiB used"
    points = str(page.find_element(By.ID, "gpu-util-line").get_attribute("points")).split()
    assert len(points) >= 10
    heights = [float(point.split(",")[1]) for point in points]
    assert heights[0] > heights[-1] == 0.0  # drawn from the bottom up as the load rises
    screenshot(page, "web-gpu", tmp_path)


HOSTILE_PHASE = '<img src=x onerror="window.pwned=1"><b>Optimizing</b> & "graph"'
HOSTILE_REASON = "<script>window.pwned=2</script><i>too slow</i>"


def test_markup_from_the_build_is_shown_as_text(page: WebDriver, tmp_path: Path) -> None:
    trace = tmp_path / "hostile.jsonl"
    calls: list[dict[str, Any]] = [
        {"cb": "phase_start", "phase_name": "Building engine", "parent_phase": None,
         "num_steps": 2},
        {"cb": "phase_start", "phase_name": HOSTILE_PHASE, "parent_phase": "Building engine",
         "num_steps": 400},
    ]  # fmt: skip
    calls += [{"cb": "step_complete", "phase_name": HOSTILE_PHASE, "step": s} for s in range(400)]
    calls += [{"cb": "phase_finish", "phase_name": HOSTILE_PHASE}]
    calls += [{"cb": "step_complete", "phase_name": "Building engine", "step": 0}]
    calls += [{"cb": "phase_finish", "phase_name": "Building engine"}]
    trace.write_text("".join(json.dumps(c) + "\n" for c in calls))
    with Demo("--trace", str(trace), "--speed", "1", "--silence", "60s") as demo:
        page.get(demo.base + "/")
        names = wait_for(
            "the hostile phase",
            lambda: [
                n.text
                for n in page.find_elements(By.CSS_SELECTOR, "#tree .name")
                if "Optimizing" in n.text
            ],
        )
        assert names == [HOSTILE_PHASE]
        _post_cancel(demo.base, HOSTILE_REASON)
        wait_for("the outcome", lambda: outcome(page))
        assert text_of(page, "cancel-reason") == HOSTILE_REASON
        injected = "main img:not(#timeline), main b, main i, main script"  # the page's own image
        assert page.find_elements(By.CSS_SELECTOR, injected) == []
        assert page.execute_script("return window.pwned === undefined")
        assert demo.wait() == 3
        assert page_errors(page) == []


def _post_cancel(base: str, reason: str) -> None:
    request = urllib.request.Request(
        base + "/cancel",
        data=json.dumps({"reason": reason}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202


def test_page_reads_well_at_a_phones_width(page: WebDriver, tmp_path: Path) -> None:
    with Demo("--speed", "4") as demo:
        page.set_window_size(390, 844)
        page.get(demo.base + "/")
        wait_for("the outcome", lambda: outcome(page))
        overflow = page.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"the page is {overflow}px wider than a phone's screen"
        # Every form control has a label a screen reader can say.
        for control in page.find_elements(By.CSS_SELECTOR, "input"):
            labels = page.find_elements(
                By.CSS_SELECTOR, f"label[for='{control.get_attribute('id')}']"
            )
            assert labels, control.get_attribute("id")
        screenshot(page, "web-phone", tmp_path)
        assert demo.wait() == 0


class CuttingProxy:
    """A TCP proxy that cuts every event stream after some kilobytes, mid-frame, as a flaky
    network would; the page must resume where it was and count nothing twice."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.cuts = 0
        self.streams = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                return  # the build has exited
            with upstream, contextlib.suppress(OSError):
                self._pipe(client, upstream)

    def _pipe(self, client: socket.socket, upstream: socket.socket) -> None:
        request = client.recv(65536)
        limit = None
        if request.startswith(b"GET /events"):
            limit = self.cut_after
            self.streams += 1
            if self.streams == 2:
                # Once, the resumed stream loses its Last-Event-ID on the way (as through a
                # proxy that drops the header): the build sends everything again, and the page
                # must count none of it twice.
                request = re.sub(rb"(?im)^last-event-id:[^\n]*\n", b"", request)
        upstream.sendall(request)
        sent = 0
        while data := upstream.recv(65536):
            if limit is not None and sent + len(data) > limit:
                client.sendall(data[: limit - sent])
                self.cuts += 1
                return
            client.sendall(data)
            sent += len(data)

    def close(self) -> None:
        self._listener.close()


def test_page_resumes_a_dropped_event_stream(
    page: WebDriver, served: tuple[BuildMonitor, StatusServer]
) -> None:
    # A view in this process, which stays up after the end until the page has it all: a view
    # that exits while the page is between connections takes its last events with it.
    monitor, server = served
    proxy = CuttingProxy(server.port, cut_after=40_000)
    try:
        page.get(f"http://127.0.0.1:{proxy.port}/")
        wait_for("the page", lambda: text_of(page, "link") == "live")
        monitor.start()
        Driver(speed=0).run(monitor, generate_plan(13))
        expected = monitor.state.last_seq + 1

        def received() -> int:
            return int(text_of(page, "events-count").replace(",", ""))

        wait_for("every event", lambda: received() >= expected, timeout_s=120)
        time.sleep(2)  # a replay still on its way would land within a reconnection or two
        assert received() == expected
        assert proxy.cuts >= 3
        monitor.end()
        assert wait_for("the outcome", lambda: outcome(page)) == "Built successfully (success)"
    finally:
        proxy.close()


def test_assets_are_served_by_the_view_with_a_strict_policy() -> None:
    with Demo("--speed", "4") as demo:
        with urllib.request.urlopen(demo.base + "/", timeout=10) as response:
            html = response.read().decode()
            policy = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        for asset in re.findall(r'(?:src|href)="([^"]+)"', html):
            assert not asset.startswith(("http:", "https:", "//")), asset
            with urllib.request.urlopen(f"{demo.base}/{asset}", timeout=10) as response:
                assert response.status == 200 and response.read()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(demo.base + "/assets/../cli.py", timeout=10)
        missing.value.close()
        assert missing.value.code == 404
        assert demo.wait() == 0
