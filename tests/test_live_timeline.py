"""The live page's timeline (``GET /timeline.svg``): a running ``trt-otel demo`` serves the
timeline of the build so far, drawn by the code that draws ``trt-otel report``'s, with the
current silent window; the page shows it in a real headless Chromium; and at the end it is the
report's timeline of the build's journal."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest

from browser import chromium
from cli import CLI, ServingBuild

SVG = "{http://www.w3.org/2000/svg}"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class LiveDemo(ServingBuild):
    """A paced ``trt-otel demo`` with a silent window, serving its HTTP view."""

    def __init__(self, journal: Path, silence: str = "6s") -> None:
        super().__init__(
            "demo", "--simulate", "tensorrt-rtx", "--silence", silence, "--no-progress",
            "--no-summary", "--http-port", "0", "--journal", journal,
        )  # fmt: skip

    def timeline(self) -> tuple[dict[str, str], ElementTree.Element]:
        with urllib.request.urlopen(f"{self.base}/timeline.svg", timeout=10) as answer:
            return dict(answer.headers), ElementTree.fromstring(answer.read())


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[LiveDemo, Path]]:
    journal = tmp_path / "live.jsonl"
    demo = LiveDemo(journal)
    try:
        yield demo, journal
    finally:
        demo.close()


@pytest.fixture
def long_live(tmp_path: Path) -> Iterator[LiveDemo]:
    """A build that stays silent (and its page up) for longer than a loaded machine takes to
    start Chromium: the page is read while the build runs, never after it ended."""
    demo = LiveDemo(tmp_path / "live.jsonl", silence="90s")
    try:
        yield demo
    finally:
        demo.close()


def labels(svg: ElementTree.Element) -> list[str]:
    return [t.text or "" for t in svg.iter(f"{SVG}text") if t.get("class") == "label"]


def silences(svg: ElementTree.Element) -> list[str]:
    return ["".join(g.itertext()) for g in svg.iter(f"{SVG}g") if g.get("class") == "silent-window"]


def poll(what: str, probe: object, timeout_s: float = 60) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()  # type: ignore[operator]
        if value:
            return value
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def test_the_running_build_is_drawn_with_its_current_silence_and_ends_as_the_report(
    live: tuple[LiveDemo, Path], tmp_path: Path
) -> None:
    demo, journal = live
    headers, _ = demo.timeline()
    assert headers["Content-Type"].startswith("image/svg+xml")
    assert "default-src 'none'" in headers["Content-Security-Policy"]

    def silent_now() -> ElementTree.Element | None:
        """The picture while TensorRT is silent: the hatched window runs to the drawing's end
        (now), and the phase is open."""
        _, picture = demo.timeline()
        windows = [
            g
            for g in picture.iter(f"{SVG}g")
            if g.get("class") == "silent-window" and "Determining refit" in "".join(g.itertext())
        ]
        if not windows:
            return None
        window = next(windows[-1].iter(f"{SVG}rect"))
        rects = list(picture.iter(f"{SVG}rect"))
        end = next(e for e in picture.iter(f"{SVG}line") if "end-line" in (e.get("class") or ""))
        reaches_now = abs(float(window.get("x", 0)) + float(window.get("width", 0))
                          - float(end.get("x1", 0))) < 3  # fmt: skip
        still_open = any(r.get("class") == "bar open" for r in rects)
        return picture if reaches_now and still_open else None

    during = poll("the current silence drawn", silent_now)
    assert isinstance(during, ElementTree.Element)
    assert "Determining refit engines" in labels(during)
    assert demo.process.poll() is None  # drawn while the build is silent, not after

    assert demo.process.wait(120) == 0
    page = tmp_path / "report.html"
    done = subprocess.run([*CLI, "report", str(journal), "-o", str(page)], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report_labels = re.findall(r'<text class="label" x="\d+" y="14">([^<]*)</text>',
                               page.read_text(encoding="utf-8"))  # fmt: skip
    assert report_labels and report_labels[0] == "Building engine"
    assert labels(during) == report_labels[: len(labels(during))]  # the same rows, in order


def test_the_live_page_shows_the_timeline_image(long_live: LiveDemo) -> None:
    demo = long_live
    with chromium() as driver:
        driver.get(demo.base + "/")
        loaded = (
            "const i = document.getElementById('timeline');"
            "return i.complete && i.naturalWidth > 0 && i.src.includes('timeline.svg?at=');"
        )
        poll("the page's timeline loaded and refreshed", lambda: driver.execute_script(loaded))
        width = driver.execute_script("return document.getElementById('timeline').naturalWidth")
        assert width > 1000
        errors = [m for m in driver.get_log("browser") if m["level"] == "SEVERE"]
        assert [m for m in errors if "favicon.ico" not in m["message"]] == []  # no CSP refusal
        if folder := os.environ.get("TRT_OTEL_SCREENSHOTS"):
            driver.save_screenshot(str(Path(folder) / "live-timeline.png"))
    assert demo.process.poll() is None  # the page was read from the running build
