"""A build's files: refused before the build when they cannot work (exit 2), and a write that
still fails after the build is a failure that keeps the plan (exit 4). Real processes, real
files, real FIFOs and devices, and a real full filesystem where this user may mount one."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli import CLI, run_cli, start_demo
from trt_otel import Outcome, read_journal
from trt_otel.builder.preflight import (
    PreflightError,
    check_build_files,
    check_cancel_file,
    check_distinct,
    check_writable_file,
    read_model,
)
from trt_otel.builder.saving import save_build
from trt_otel.core.events import BuildFinished
from waiting import wait_for_text


def end_of(journal: Path) -> BuildFinished:
    ends = [e for e in read_journal(journal).events if isinstance(e, BuildFinished)]
    assert len(ends) == 1
    return ends[0]


# -- refused before the build --------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "nodir/sub/x.engine"], "-o nodir/sub/x.engine: directory nodir/sub does not exist"),
        (["-o", "adir"], "-o adir is a directory; give a file name"),
        # Not /dev/null: the code this guards against, run as root, replaces the device itself.
        (["-o", "fifo"], "-o fifo is not a regular file (a named pipe)"),
        (["-o", "keep.jsonl", "--journal", "keep.jsonl"],
         "-o keep.jsonl is also the --journal"),
        (["--timing-cache", "keep.jsonl", "--journal", "./keep.jsonl"],
         "--journal keep.jsonl is also the --timing-cache"),
        (["--model", "model.onnx", "-o", "model.onnx"], "-o model.onnx is also the model"),
        (["--model", "model.onnx", "--journal", "model.onnx"],
         "--journal model.onnx is also the model"),
        (["--timing-cache", "adir"], "--timing-cache adir is a directory"),
        (["--model", "fifo"], "model fifo is not a regular file (a named pipe)"),
        (["--cancel-file", "stale"],
         "--cancel-file stale already exists (left from an earlier build?)"),
    ],
)  # fmt: skip
def test_files_that_cannot_work_are_refused_before_the_build(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "keep.jsonl").write_text("precious\n")
    (tmp_path / "model.onnx").write_bytes(b"precious model")
    (tmp_path / "stale").write_text("")
    os.mkfifo(tmp_path / "fifo")
    result = run_cli(
        "demo", "--speed", "0", "--no-progress", "--no-gpu", *args, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 2, result.stderr
    assert f"trt-otel: error: {message}" in result.stderr
    assert "Traceback" not in result.stderr and "build started" not in result.stderr
    assert (tmp_path / "keep.jsonl").read_text() == "precious\n", "nothing truncated"
    assert (tmp_path / "model.onnx").read_bytes() == b"precious model"


ROOT_AS_A_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
"""Root without the capabilities that let it read and write past a file's mode (util-linux's
``setpriv``): a read-only directory is then read-only to it, as to any user."""


@pytest.mark.e2e
def test_a_read_only_directory_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    as_user = ROOT_AS_A_USER if os.geteuid() == 0 else []
    result = subprocess.run(
        [*as_user, *CLI, "demo", "--speed", "0", "--no-progress", "-o", "locked/x.engine"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "-o locked/x.engine: cannot write in locked: Permission denied" in result.stderr


@pytest.mark.e2e
def test_build_refuses_its_own_model_as_output(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"model")
    (tmp_path / "link.onnx").symlink_to("m.onnx")  # another name, the same file
    result = run_cli("build", "m.onnx", "-o", "link.onnx", timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and "-o link.onnx is also the model" in result.stderr
    assert (tmp_path / "m.onnx").read_bytes() == b"model"


def test_a_model_over_the_limit_or_not_a_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.onnx"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(PreflightError, match=r"big.onnx is 1,001 bytes, over the limit of 1,000"):
        read_model(big, max_bytes=1000)
    assert read_model(big, max_bytes=1001) == b"x" * 1001
    with pytest.raises(PreflightError, match=r"model /dev/zero is not a regular file \(a device\)"):
        read_model(Path("/dev/zero"))
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    began = time.monotonic()
    with pytest.raises(PreflightError, match="named pipe"):
        read_model(fifo)
    assert time.monotonic() - began < 1, "opening the FIFO blocked"


def test_an_empty_model_is_refused_and_a_symlinked_one_is_read(tmp_path: Path) -> None:
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(PreflightError, match=r"model file is empty: .*empty\.onnx"):
        read_model(empty)
    (tmp_path / "m.onnx").write_bytes(b"model")
    (tmp_path / "link.onnx").symlink_to("m.onnx")
    assert read_model(tmp_path / "link.onnx") == b"model"
    (tmp_path / "empty-link.onnx").symlink_to("empty.onnx")
    with pytest.raises(PreflightError, match="model file is empty"):
        read_model(tmp_path / "empty-link.onnx")


def test_outputs_are_judged_by_what_a_symlink_points_at(tmp_path: Path) -> None:
    (tmp_path / "old.engine").write_bytes(b"old")
    (tmp_path / "link.engine").symlink_to("old.engine")
    check_writable_file(tmp_path / "link.engine", "-o")  # a link to a regular file is one
    (tmp_path / "adir").mkdir()
    (tmp_path / "dir-link").symlink_to("adir")
    with pytest.raises(PreflightError, match="dir-link is a directory; give a file name"):
        check_writable_file(tmp_path / "dir-link", "-o")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "fifo-link").symlink_to("fifo")
    with pytest.raises(PreflightError, match=r"not a regular file \(a named pipe\)"):
        check_writable_file(tmp_path / "fifo-link", "-o")


def test_a_cancel_file_that_is_a_dangling_symlink_is_already_there(tmp_path: Path) -> None:
    dangling = tmp_path / "stop"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(PreflightError, match=r"--cancel-file .*stop already exists"):
        check_cancel_file(dangling)
    check_cancel_file(tmp_path / "absent")


# -- a write that fails after the build ----------------------------------------------------


def build_while(
    tmp_path: Path, out: Path, trouble: object, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run a demo build writing ``out``; call ``trouble()`` once it has started."""
    journal, keep = tmp_path / "b.jsonl", tmp_path / "tmp"
    keep.mkdir()
    process = start_demo(
        "--no-gpu", "--speed", "2", "--journal", journal, "-o", out, *extra,
        cwd=tmp_path, env={**os.environ, "TMPDIR": str(keep)},
    )  # fmt: skip
    try:
        wait_for_text(journal, b"Building engine")
        trouble()  # type: ignore[operator]
        out_text, err_text = process.communicate(timeout=120)
    finally:
        process.kill()
    return subprocess.CompletedProcess(process.args, process.returncode, out_text, err_text), keep


@pytest.mark.e2e
@pytest.mark.parametrize("in_process", [False, True], ids=["worker", "in-process"])
def test_an_engine_that_cannot_be_written_is_a_failure_and_the_plan_is_kept(
    tmp_path: Path, in_process: bool
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    extra = ["--in-process"] if in_process else []
    result, keep = build_while(
        tmp_path, out_dir / "x.engine", lambda: shutil.rmtree(out_dir), *extra
    )
    assert result.returncode == 4, result.stderr
    assert "Traceback" not in result.stderr
    assert "build success" not in result.stderr
    kept = list(keep.glob("x.engine.unsaved-*"))
    assert len(kept) == 1 and kept[0].stat().st_size > 0
    end = end_of(tmp_path / "b.jsonl")
    assert end.outcome is Outcome.FAILURE and end.error_type == "EngineWriteError"
    assert end.detail == (
        f"the engine was built but cannot be written to {out_dir / 'x.engine'}: "
        f"No such file or directory; the built plan was kept at {kept[0]}"
    )
    assert end.detail in result.stderr


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[None]:
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small filesystem here (needs root)")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> None:
    # Unbuffered, so closing it has nothing left to write on the full disk.
    with open(directory / "filler", "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 4096)


@pytest.mark.e2e
def test_a_disk_that_fills_during_the_build_fails_it_with_the_reason(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with small_filesystem(disk, "256k"):
        result, keep = build_while(
            tmp_path, disk / "x.engine", lambda: fill(disk), "--timing-cache", str(disk / "t.cache")
        )
        assert not (disk / "x.engine").exists()
        assert not list(disk.glob(".x.engine.*")), "no partial file left"
    assert result.returncode == 4, result.stderr
    end = end_of(tmp_path / "b.jsonl")
    assert end.outcome is Outcome.FAILURE and end.error_type == "EngineWriteError"
    assert "No space left on device; the built plan was kept at" in end.detail
    assert list(keep.glob("x.engine.unsaved-*"))


def test_a_timing_cache_that_cannot_be_written_is_its_own_failure_after_the_engine(
    tmp_path: Path,
) -> None:
    """The engine reached its path: the failure names the timing cache (its own error type,
    so a dashboard does not count it as a lost engine) and keeps no plan, there being no
    need."""
    engine = tmp_path / "x.engine"
    cache = tmp_path / "gone" / "t.cache"
    failure = save_build(b"plan", engine, b"cache", cache)
    assert failure is not None
    assert failure.error_type == "TimingCacheWriteError"
    assert failure.kept is None
    assert engine.read_bytes() == b"plan"
    assert failure.detail == (
        f"cannot write timing cache {cache}: No such file or directory; "
        f"the engine was written to {engine}"
    )
    assert save_build(b"plan", engine, b"cache", tmp_path / "t.cache") is None


def test_an_engine_that_cannot_be_written_says_where_its_plan_was_kept(tmp_path: Path) -> None:
    """The failure carries the path the built plan was kept at (beside the engine's path, its
    folder taking new files), and that file holds the plan the detail names."""
    engine = tmp_path / "x.engine"
    engine.mkdir()  # the engine cannot replace a directory; its folder still takes a file
    failure = save_build(b"plan", engine)
    assert failure is not None
    assert failure.error_type == "EngineWriteError"
    assert failure.kept is not None
    assert failure.kept.parent == tmp_path
    assert failure.kept.name == f"x.engine.unsaved-{os.getpid()}"
    assert failure.kept.read_bytes() == b"plan"
    assert failure.detail.endswith(f"; the built plan was kept at {failure.kept}")


def test_two_spellings_of_an_output_not_yet_there_are_one_file(tmp_path: Path) -> None:
    """``sub/../out.engine`` and ``out.engine`` name one file before either exists: the engine
    and the journal would write over each other."""
    (tmp_path / "sub").mkdir()
    with pytest.raises(PreflightError, match="is also the --journal"):
        check_distinct(
            inputs=[],
            outputs=[
                ("-o", tmp_path / "sub" / ".." / "out.engine"),
                ("--journal", tmp_path / "out.engine"),
            ],
        )
    assert not (tmp_path / "out.engine").exists()


def test_an_output_over_the_trace_being_replayed_is_refused(tmp_path: Path) -> None:
    """``demo --trace T --journal T`` would empty the trace it is about to replay."""
    trace = tmp_path / "build.jsonl"
    trace.write_text("{}\n")
    with pytest.raises(PreflightError, match="is also the --trace"):
        check_build_files(
            model=None, engine=None, journal=tmp_path / "." / "build.jsonl", timing_cache=None,
            trace=trace,
        )  # fmt: skip
    assert trace.read_text() == "{}\n"


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
@pytest.mark.e2e
def test_engines_reports_and_caches_are_written_with_the_users_umask(
    tmp_path: Path, umask: int
) -> None:
    """Data files are ``0666`` less the umask, as any program's, so a server running as
    another user can read an engine or a report the umask lets it read (the HTTP view's cancel
    token stays its owner's alone: test_http)."""
    import stat

    engine, cache = tmp_path / "model.engine", tmp_path / "timing.cache"
    journal, page = tmp_path / "build.jsonl", tmp_path / "report.html"

    built = run_cli("demo", "--speed", "0", "--no-progress", "-o", str(engine),
                    "--timing-cache", str(cache), "--journal", str(journal),
                    timeout=120, cwd=tmp_path, umask=umask)  # fmt: skip
    assert built.returncode == 0, built.stderr
    reported = run_cli("report", str(journal), "-o", str(page), timeout=120, cwd=tmp_path,
                       umask=umask)  # fmt: skip
    assert reported.returncode == 0, reported.stderr
    for path in (engine, cache, journal, page):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    assert not list(tmp_path.glob(".*.partial"))
