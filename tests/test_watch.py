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
