"""A real headless Chromium for tests that look at a page (the system's ``chromium`` and
``chromedriver``, which ``.ci/run`` installs): skipped with the reason where they are missing,
except in CI, where a missing browser is a failure."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def chromium(width: int = 1280, height: int = 1400) -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (browser and driver_path):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: .ci/run installs them")
        pytest.skip("needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium would otherwise try to download one.
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=driver_path)
    )
    try:
        yield driver
    finally:
        driver.quit()
