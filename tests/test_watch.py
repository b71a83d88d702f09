"""``trt-otel watch``: what cannot be followed is a clear error, exit 2, never a traceback."""

from __future__ import annotations

import pytest

from trt_otel.app.cli import main


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
