"""``$GITHUB_STEP_SUMMARY``: when ``build``, ``demo`` or ``run`` end and it is set, the build's
markdown report is appended to it (``--no-summary`` opts out), as GitHub Actions shows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli import CLI, run_cli
from rtx_builds import import_rtx, write_conv
from runs import PROGRAMS
from trt_otel.builder.onnx_models import CONV_SHAPES, demo_model_bytes

pytestmark = pytest.mark.e2e

BEFORE = "## an earlier step's summary\n"


def trt_otel(tmp_path: Path, *args: str, summary: bool = True) -> subprocess.CompletedProcess[str]:
    """``trt-otel ARGS`` as a step of GitHub Actions runs it: ``$RUNNER_TEMP`` is ``tmp_path``,
    and ``$GITHUB_STEP_SUMMARY`` (an earlier step's summary in it) is set where ``summary``."""
    env = {**os.environ, "RUNNER_TEMP": str(tmp_path)}
    env.pop("GITHUB_STEP_SUMMARY", None)
    if summary:
        env["GITHUB_STEP_SUMMARY"] = str(tmp_path / "summary.md")
        (tmp_path / "summary.md").write_text(BEFORE, encoding="utf-8")
    return run_cli(*args, timeout=300, env=env)


def summary(tmp_path: Path) -> str:
    return (tmp_path / "summary.md").read_text(encoding="utf-8")


def test_a_demo_appends_its_report_and_keeps_a_journal_when_none_was_asked_for(
    tmp_path: Path,
) -> None:
    done = trt_otel(tmp_path, "demo", "--simulate", "tensorrt-rtx", "--speed", "0", "--no-progress")
    assert done.returncode == 0, done.stderr
    text = summary(tmp_path)
    assert text.startswith(BEFORE)  # appended, not replaced
    assert "✅ **success** in" in text
    assert "| phase | count | self |" in text and "Determining refit engines" in text
    kept = list(tmp_path.glob("trt-otel-*.jsonl"))
    assert len(kept) == 1 and f"journal: {kept[0]}" in done.stderr


def test_a_cancelled_build_says_so_in_the_summary_and_keeps_its_exit_code(tmp_path: Path) -> None:
    journal = tmp_path / "b.jsonl"
    done = trt_otel(
        tmp_path, "demo", "--simulate", "tensorrt-rtx", "--speed", "0", "--silence", "30s",
        "--timeout", "2s", "--grace", "1s", "--no-progress", "--journal", str(journal),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    text = summary(tmp_path)
    assert "**timeout**" in text and "> Cancelled by **timeout**" in text
    assert not list(tmp_path.glob("trt-otel-*.jsonl"))  # its own journal was used


def test_no_summary_opts_out(tmp_path: Path) -> None:
    done = trt_otel(
        tmp_path, "demo", "--simulate", "tensorrt-rtx", "--speed", "0", "--no-progress",
        "--no-summary",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert summary(tmp_path) == BEFORE
    assert not list(tmp_path.glob("trt-otel-*.jsonl"))


def test_a_usage_error_appends_nothing_not_even_an_earlier_journal(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier.jsonl"
    assert trt_otel(tmp_path, "demo", "--speed", "0", "--no-progress", "--journal", str(earlier),
                    summary=False).returncode == 0  # fmt: skip
    os.utime(earlier, (earlier.stat().st_mtime - 60,) * 2)  # a journal of a minute ago
    done = trt_otel(
        tmp_path, "build", str(tmp_path / "missing.onnx"), "-o", "x.engine",
        "--journal", str(earlier),
    )  # fmt: skip
    assert done.returncode == 2
    assert summary(tmp_path) == BEFORE


def test_a_summary_that_is_not_a_regular_file_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(tmp_path), "RUNNER_TEMP": str(tmp_path)}
    done = subprocess.run(
        [*CLI, "demo", "--simulate", "tensorrt-rtx", "--speed", "0", "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0
    assert "GITHUB_STEP_SUMMARY not written" in done.stderr and "Traceback" not in done.stderr


def test_a_summary_that_is_one_of_the_runs_files_is_not_written(tmp_path: Path) -> None:
    """``$GITHUB_STEP_SUMMARY`` naming the engine, the model or the journal of the same run (by
    its real path: through a symlink or ``..``): no markdown is appended to it, the build's
    exit code stands, and the warning says which file it is."""
    model = tmp_path / "model.onnx"
    model.write_bytes(demo_model_bytes())
    engine, journal = tmp_path / "out.engine", tmp_path / "b.jsonl"
    (tmp_path / "sub").mkdir()
    (tmp_path / "engine-link").symlink_to(engine)
    demo = ["demo", "--model", str(model), "-o", str(engine), "--journal", str(journal),
            "--speed", "0", "--no-progress"]  # fmt: skip
    for named, target in (
        ("engine", tmp_path / "sub" / ".." / "out.engine"),
        ("engine", tmp_path / "engine-link"),
        ("model", model),
        ("journal", journal),
    ):
        env = {**os.environ, "GITHUB_STEP_SUMMARY": str(target), "RUNNER_TEMP": str(tmp_path)}
        done = subprocess.run(
            [*CLI, *demo], capture_output=True, text=True, timeout=300, env=env, check=False
        )
        assert done.returncode == 0, done.stderr
        assert f"is the build's {named}; no summary appended" in done.stderr, done.stderr
        assert model.read_bytes() == demo_model_bytes()
        assert b"TensorRT build" not in engine.read_bytes()
        assert b"TensorRT build" not in journal.read_bytes()
        assert "Traceback" not in done.stderr


def test_a_runner_temp_that_is_not_there_is_not_made(tmp_path: Path) -> None:
    """The journal kept for the summary goes to ``$RUNNER_TEMP`` only when it is a folder:
    none is made for it (at the root, run as root), and the summary is still written."""
    missing = tmp_path / "nonexistent" / "deeper"
    (tmp_path / "summary.md").write_text(BEFORE, encoding="utf-8")
    env = {
        **os.environ,
        "RUNNER_TEMP": str(missing),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    done = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "nonexistent").exists()
    assert f"RUNNER_TEMP {missing} is not a folder" in done.stderr
    assert "success" in summary(tmp_path)
    kept = [line.split("journal: ", 1)[1] for line in done.stderr.splitlines()
            if line.startswith("journal: ")]  # fmt: skip
    assert kept and not kept[0].startswith(str(missing))
    Path(kept[0]).unlink()


def test_a_summary_that_cannot_be_written_is_a_warning_with_the_builds_exit_code(
    tmp_path: Path,
) -> None:
    for target in ("/proc/summary.md", str(tmp_path / "no" / "such" / "summary.md")):
        env = {**os.environ, "GITHUB_STEP_SUMMARY": target, "RUNNER_TEMP": str(tmp_path)}
        done = subprocess.run(
            [*CLI, "demo", "--speed", "0", "--no-progress", "--timeout", "1s", "--silence",
             "30s", "--grace", "1s"],
            capture_output=True, text=True, timeout=300, env=env, check=False,
        )  # fmt: skip
        assert done.returncode == 3, done.stderr  # cancelled: the code stands
        assert "GITHUB_STEP_SUMMARY not written" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_a_real_build_and_a_programs_builds_append_their_reports(tmp_path: Path) -> None:
    import_rtx()
    model = write_conv(tmp_path / "conv.onnx")
    built = trt_otel(
        tmp_path, "build", str(model), "-o", str(tmp_path / "conv.engine"),
        "--shapes", CONV_SHAPES, "--no-progress",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "(tensorrt-rtx 1.7" in summary(tmp_path)

    mnist = tmp_path / "mnist.onnx"
    mnist.write_bytes(demo_model_bytes())
    ran = trt_otel(
        tmp_path, "run", "--no-progress", "--", sys.executable,
        str(PROGRAMS / "plain_build.py"), str(mnist), str(mnist),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    text = summary(tmp_path)
    assert "### Build 1 of 2" in text and "### Build 2 of 2" in text
