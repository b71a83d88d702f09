"""The trt-otel command, run as users run it: real files, real processes, real signals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import CLI, CLI_MODULE, HOLD, MID_BUILD, start_demo
from conftest import reference_tree, trace_params
from journals import final_state
from trt_otel import Outcome, read_journal
from trt_otel.app.cli import main
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.simulator import SIMULATED_ENGINE_MAGIC
from trt_otel.core.events import BuildFinished, CancelRequested
from trt_otel.core.state import BuildState
from waiting import wait_for_silence, wait_for_text


@pytest.mark.e2e
def test_demo_builds_the_generated_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal, engine = tmp_path / "demo.jsonl", tmp_path / "demo.engine"
    code = main(
        ["demo", "--speed", "0", "--no-progress", "--journal", str(journal), "-o", str(engine)]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "▶ Building engine (6 steps)" in err
    assert "build success" in err
    state = final_state(journal)
    assert state.outcome is Outcome.SUCCESS
    assert state.attributes["trt.backend"] == "simulator"
    assert len(state.attributes["model.sha256"]) == 64
    assert engine.read_bytes().startswith(SIMULATED_ENGINE_MAGIC)
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.e2e
@pytest.mark.parametrize("trace", trace_params())
def test_demo_replays_a_recorded_trace(tmp_path: Path, trace: Path) -> None:
    journal = tmp_path / "replay.jsonl"
    args = [
        "demo",
        "--trace",
        str(trace),
        "--speed",
        "0",
        "--no-progress",
        "--journal",
        str(journal),
    ]
    assert main(args) == 0
    state = final_state(journal)
    expected = reference_tree(trace)
    assert [state.phases[r].name for r in state.roots] == [r.name for r in expected]
    assert state.phases_started_total == trace.read_text().count('"phase_start"')
    # And the journal of that replay replays again, to the same tree.
    again = tmp_path / "again.jsonl"
    args = [
        "demo",
        "--trace",
        str(journal),
        "--speed",
        "0",
        "--no-progress",
        "--journal",
        str(again),
    ]
    assert main(args) == 0
    # The same phases in the same order (their ids, the events' seq, differ where the builder's
    # process samples fell elsewhere among the callbacks).
    assert _phase_list(final_state(again)) == _phase_list(state)


def _phase_list(state: BuildState) -> list[tuple[str, str | None, int, int]]:
    phases = state.phases
    return [
        (p.name, phases[p.parent_id].name if p.parent_id is not None else None, p.num_steps,
         p.steps_completed)
        for p in phases.values()
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--trace", "/nonexistent/trace.jsonl"], "cannot read trace"),
        (["demo", "--model", "/nonexistent/model.onnx"], "model not found"),
        (["demo", "--threads", "0"], "--threads must be at least 1"),
        (["build", "/nonexistent/model.onnx", "-o", "x.engine"], "model not found"),
        (["replay", "/nonexistent/journal.jsonl"], "cannot read journal"),
        (["demo", "--journal", "/proc/version/journal.jsonl"], "cannot write journal"),
    ],
)
def test_bad_input_is_a_clear_error_with_exit_code_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args", [["demo", "--speed", "-1"], ["demo", "--silence", "soon"], []])
def test_malformed_options_exit_2(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2


def test_a_garbage_trace_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "garbage.jsonl"
    trace.write_text('{"cb": "phase_start"}\n')
    assert main(["demo", "--trace", str(trace)]) == 2
    assert "not a trace callback" in capsys.readouterr().err


def test_build_without_either_library_names_both_extras(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("tensorrt", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, name, None)  # as if neither were installed
    model = tmp_path / "model.onnx"
    model.write_bytes(demo_model_bytes())
    assert main(["build", str(model), "-o", str(tmp_path / "m.engine")]) == 2
    err = capsys.readouterr().err
    assert "no TensorRT builder is installed" in err
    assert "trt-otel[tensorrt-rtx]" in err and "trt-otel[tensorrt]" in err
    assert not (tmp_path / "m.engine").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("content", [b"\x08\x01garbage that is not onnx", b"\x00" * 64])
def test_a_malformed_model_fails_with_4_and_keeps_the_old_engine(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    model, engine, journal = tmp_path / "bad.onnx", tmp_path / "old.engine", tmp_path / "j.jsonl"
    model.write_bytes(content)
    engine.write_bytes(b"the previous engine")
    args = ["demo", "--model", str(model), "-o", str(engine), "--no-progress"]
    assert main([*args, "--journal", str(journal)]) == 4
    assert engine.read_bytes() == b"the previous engine"
    assert "cannot parse bad.onnx" in capsys.readouterr().err
    state = final_state(journal)
    assert (state.outcome, state.error_type) == (Outcome.FAILURE, "ParserError")


def test_an_empty_model_is_refused_before_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "empty.onnx"
    model.write_bytes(b"")
    assert main(["demo", "--model", str(model)]) == 2
    assert "model file is empty" in capsys.readouterr().err


def start_held_demo(journal: Path, *extra: str) -> subprocess.Popen[str]:
    """A demo at full speed that holds still (2 s by default) where tactic timing begins;
    returned once it is there."""
    process = start_demo("--journal", journal, *HOLD, *extra)
    try:
        wait_for_text(journal, MID_BUILD, timeout_s=30)
    except AssertionError:
        process.kill()
        raise
    return process


REPOSITORY = Path(__file__).resolve().parents[1]
INTERRUPTED = (
    "trt-otel: interrupted before the build started",  # during the command's imports
    "trt-otel: interrupted",  # after them, before the build
    "received SIGINT",  # the build had begun: it was cancelled
)


def started_bare(launch: str) -> list[str]:
    """The command as ``python -S`` starts it: the interpreter without ``site``, whose ``.pth``
    files (an editable install's import hook takes most of a second on a loaded machine) are
    Python's start-up, not trt-otel's, so that the delays below fall in trt-otel's own."""
    if launch == "module":
        return [sys.executable, "-S", *CLI_MODULE]
    script = Path(sys.executable).with_name("trt-otel")
    if not script.exists():
        pytest.skip("the trt-otel console script is not installed beside this Python")
    return [sys.executable, "-S", str(script)]


PACKAGE_INIT = str(REPOSITORY / "trt_otel" / "__init__.py")
GUARD_INSTALLED_AT = next(
    number
    for number, line in enumerate(Path(PACKAGE_INIT).read_text().splitlines(), start=1)
    if "_startup_signal.signal(_startup_signal.SIGINT, _interrupted_starting)" in line
)
"""The line of the package's first lines that puts trt-otel's Ctrl-C handler in place."""


@pytest.mark.e2e
@pytest.mark.parametrize("launch", ["module", "script"])
def test_ctrl_c_at_any_moment_of_start_up_is_one_line_and_130(launch: str) -> None:
    """Ctrl-C at once after start and at every 20 ms up to 300 ms: one line and exit 130
    from trt-otel's first line on. Before it, only Python's own start-up can be interrupted
    (killed by SIGINT, which a shell reports as 130), never trt-otel's code."""
    paths = [str(REPOSITORY), *(p for p in sys.path if p.endswith("site-packages"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    answered_early = 0
    for delay_ms in range(0, 301, 20):
        process = subprocess.Popen(
            [*started_bare(launch), "demo", "--no-progress", "--speed", "0", "--silence", "5s"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        # The delay is what is tested: Ctrl-C at that moment of the start-up.
        time.sleep(delay_ms / 1000)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        said = f"{launch} at {delay_ms} ms: exit {process.returncode}\n{err}"
        if process.returncode != 130:
            # Python's own start-up (importing runpy, finding the package): killed by the
            # signal, or Python's "could not import" and exit 1; never in trt-otel's code past
            # the guard's own first lines (they run under Python's handler until they have put
            # trt-otel's in place: no guard can guard the bytecodes that install it).
            assert process.returncode in (-signal.SIGINT, 1), said
            assert not err or "KeyboardInterrupt" in err.strip().splitlines()[-1], said
            assert all(
                path == PACKAGE_INIT and int(line) <= GUARD_INSTALLED_AT
                for path, line in re.findall(r'File "([^"]+)", line (\d+)', err)
                if f"{os.sep}trt_otel{os.sep}" in path
            ), said
            continue
        assert process.returncode == 130, said
        assert "Traceback" not in err, said
        lines = err.strip().splitlines()
        assert lines and any(text in lines[-1] for text in INTERRUPTED), said
        answered_early += lines == [INTERRUPTED[0]]
    assert answered_early, "no Ctrl-C landed in the imports: the test showed nothing"


@pytest.mark.e2e
def test_ctrl_c_cancels_gracefully_and_exits_130(tmp_path: Path) -> None:
    journal = tmp_path / "interrupted.jsonl"
    process = start_held_demo(journal)
    os.kill(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130, err
    assert "cancelling at TensorRT's next step" in err
    events = read_journal(journal).events
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    assert (cancel.source, cancel.reason) == ("signal", "received SIGINT")
    end = events[-1]
    assert isinstance(end, BuildFinished) and end.outcome is Outcome.CANCELLATION
    assert final_state(journal).open_by_name == {}


# A build whose Ctrl-C comes as it ends: after the builder has returned its engine, and before
# the command has said how it ended.
CTRL_C_AS_IT_ENDS = """
import os, signal, sys
import trt_otel.builder.build as build
from trt_otel.app.cli import main

built = build.run_build
def built_then_interrupted(*args, **kwargs):
    result = built(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGINT)
    return result
build.run_build = built_then_interrupted
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.e2e
def test_a_ctrl_c_as_the_build_succeeds_keeps_the_engine_and_exits_0(tmp_path: Path) -> None:
    journal, engine = tmp_path / "ended.jsonl", tmp_path / "ended.engine"
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_AS_IT_ENDS, "demo", "--in-process", "--speed", "0",
         "--no-progress", "--journal", str(journal), "-o", str(engine)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Ctrl-C came as the build succeeded: the engine is kept" in done.stderr
    assert f"engine: {engine}" in done.stderr
    assert engine.read_bytes().startswith(SIMULATED_ENGINE_MAGIC)
    events = read_journal(journal).events
    assert isinstance(events[-1], BuildFinished) and events[-1].outcome is Outcome.SUCCESS
    # Nothing was left to cancel: no cancel recorded after the end, none announced.
    assert not any(isinstance(e, CancelRequested) for e in events)
    assert "cancelling at TensorRT's next step" not in done.stderr


@pytest.mark.e2e
def test_sigterm_cancels_and_exits_3(tmp_path: Path) -> None:
    journal = tmp_path / "terminated.jsonl"
    process = start_held_demo(journal)
    os.kill(process.pid, signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == 3
    assert final_state(journal).outcome is Outcome.CANCELLATION


@pytest.mark.e2e
def test_a_second_ctrl_c_stops_a_silent_build_at_once(tmp_path: Path) -> None:
    journal = tmp_path / "silent.jsonl"
    process = start_held_demo(journal, "--silence", "10m")
    wait_for_silence(journal)  # TensorRT would not call back for ten minutes
    os.kill(process.pid, signal.SIGINT)
    wait_for_text(journal, b'"type":"cancel"')  # the first Ctrl-C was taken
    # Time passing is what is tested here: a graceful cancel waits for a step that is not
    # coming (its grace is 30 s), so the build is still running half a second later.
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.5)
    os.kill(process.pid, signal.SIGINT)
    process.communicate(timeout=15)
    assert process.returncode == 130
    state = final_state(journal)
    assert state.outcome is Outcome.CANCELLATION
    assert state.open_by_name == {}


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("argv", "command", "named"),
    [
        (["build", "m.onnx", "-o", "m.engine", "--no-such-option"], "trt-otel build", "--no-such"),
        (["demo", "--no-such-option"], "trt-otel demo", "--no-such-option"),
        (["demo", "--speed", "fast"], "trt-otel demo", "--speed"),
    ],
)
def test_a_bad_option_says_so_in_one_line_not_the_whole_usage(
    tmp_path: Path, argv: list[str], command: str, named: str
) -> None:
    done = subprocess.run(
        [*CLI, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) <= 3, f"the usage came before the error:\n{done.stderr}"
    assert named in lines[0], done.stderr
    assert f"`{command} --help`" in done.stderr, done.stderr
    assert not list(tmp_path.iterdir()), "nothing was started"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "loaded",
    [
        "/_psutil_linux.",  # the command's own imports (psutil, to stop and sample the builder)
        "/libtensorrt_rtx.so",  # the builder library, imported after the preflight checks
    ],
)
def test_ctrl_c_during_start_up_is_one_line_and_130(tmp_path: Path, loaded: str) -> None:
    from rtx_builds import import_rtx, write_conv
    from trt_otel.builder.onnx_models import CONV_SHAPES

    import_rtx()
    model, journal = write_conv(tmp_path / "conv.onnx"), tmp_path / "conv.jsonl"
    child = subprocess.Popen(
        [*CLI, "build", str(model), "-o", str(tmp_path / "conv.engine"), "--journal",
         str(journal), "--no-progress", "--no-gpu", "--shapes", CONV_SHAPES],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while loaded not in Path(f"/proc/{child.pid}/maps").read_text():
            assert child.poll() is None, f"it ended before loading {loaded}"
            assert time.monotonic() < deadline, f"{loaded} never loaded"
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 130, err
    assert len(err.splitlines()) == 1 and "interrupted" in err, err
    assert not journal.exists(), "nothing started"
