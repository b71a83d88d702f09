"""The C++ example (cpp/examples/build_engine.cpp) on TensorRT-RTX's real builder.

The example is built once per session with CMake against the TensorRT-RTX wheel in this
environment (cpp/cmake/FindTensorRT.cmake asks the venv's Python where ``tensorrt_rtx_libs``
is) and NVIDIA's headers beside the project; it builds real engines on the CPU with
trt_otel::ProgressMonitor attached. What it records is checked against the builder itself (a
plain Python ``IProgressMonitor`` on ``tensorrt_rtx`` for the same model), its cancel file and
timeout against real builds, and ``trt-otel watch`` against it as a build's exporter and, inside
TensorRT's real silent window, as the supervisor that stops it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli import CLI
from cpp_toolchain import (
    REPO_ROOT,
    TENSORRT_INCLUDE,
    built_once,
    cmake_launcher,
    cuda_include,
    header_version,
    missing_toolchain,
    rtx_library_dir,
    toolchain_step,
)
from journals import cancel_record, fold, read_clean, spans_of
from otlp_receiver import ReceivedSpan, otlp_receiver
from rtx_builds import callbacks_of, plain_build, write_conv
from trt_otel import BuildMonitor, JournalWriter, Outcome
from trt_otel.builder.onnx_models import (
    CONV_SHAPES,
    RESIDUAL_SHAPES,
    residual_net_bytes,
    write_quickstart_model,
)
from trt_otel.capture import backends
from trt_otel.core.events import Event, LogMessage, StepCompleted
from waiting import wait_for_text, write_at_once

EXAMPLES = REPO_ROOT / "cpp" / "examples"
CANCEL_BLOCKS = 300
"""Residual blocks of the cancel and timeout tests' model: a build of a few seconds, most of it
one silent step of "Determining refit engines", so a cancel lands before the build is over."""


def missing() -> str | None:
    if (reason := missing_toolchain()) is not None:
        return reason
    if shutil.which("cmake") is None:
        return "cmake is not installed (.ci/run installs it)"
    if rtx_library_dir() is None:
        return (
            "TensorRT-RTX's libraries are not installed: install the dev extra "
            "(tensorrt-rtx-cu12-libs)"
        )
    return None


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(missing() is not None, reason=str(missing())),
    # On one worker: the example's variants (built by a session fixture) are built once a run.
    pytest.mark.xdist_group("cpp-example"),
]

SANITIZERS = {
    "plain": "-O1",
    "asan": "-O0 -fsanitize=address,undefined -fno-omit-frame-pointer",
    "tsan": "-O0 -fsanitize=thread",
}
"""Each variant's flags; the sanitized ones unoptimized, as the test driver's
(:data:`cpp_toolchain.DRIVER_VARIANTS` says why)."""


def cmake_build(variant: str, directory: Path) -> Path:
    """Configures and builds the example as its README says, with the variant's flags."""
    build = directory / variant
    for step in (
        ["cmake", "-S", str(EXAMPLES), "-B", str(build), "-DCMAKE_BUILD_TYPE=",
         f"-DCMAKE_CXX_FLAGS=-g {SANITIZERS[variant]}", f"-DTensorRT_PYTHON={sys.executable}",
         f"-DTensorRT_INCLUDE_DIR={TENSORRT_INCLUDE}", *cmake_launcher()],
        ["cmake", "--build", str(build)],
    ):  # fmt: skip
        toolchain_step(step, timeout_s=600)
    return build / "build_engine"


@pytest.fixture(scope="session")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Builds each variant of the example once per session, when first asked for."""
    return built_once(cmake_build, tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="session")
def example(examples: Callable[[str], Path]) -> Path:
    return examples("plain")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tests' ONNX models, each written once per module when first asked for: ``conv`` (a
    build of a fraction of a second), ``residual`` (a few seconds, most of them one silent
    step) and ``quickstart`` (``make demo``'s, a silent window of 20-30 s)."""
    directory = tmp_path_factory.mktemp("models")
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            path = directory / f"{name}.onnx"
            if name == "conv":
                write_conv(path)
            elif name == "residual":
                path.write_bytes(residual_net_bytes(CANCEL_BLOCKS))
            else:
                write_quickstart_model(path)
            written[name] = path
        return written[name]

    return get


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def environment() -> dict[str, str]:
    """Sanitizers halt with a non-zero exit on their first report (leaks included)."""
    return {
        **os.environ,
        "ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "TSAN_OPTIONS": "halt_on_error=1",
    }


def run_example(binary: Path, *arguments: object, timeout_s: float = 300) -> Done:
    done = subprocess.run(
        [str(binary), *(str(a) for a in arguments)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=environment(),
        check=False,
    )
    return Done(done.returncode, done.stdout, done.stderr)


def attributes_of(events: list[Event]) -> dict[str, str]:
    started = events[0]
    assert started.type == "build_start"
    return dict(started.attributes)  # type: ignore[attr-defined]


def refused_step(events: list[Event]) -> StepCompleted:
    """The one step recorded after the cancel: the one TensorRT was refused, and its last."""
    cancel_seq = cancel_record(events)["seq"]
    after = [e for e in events if isinstance(e, StepCompleted) and e.seq > cancel_seq]
    assert len(after) == 1, [(e.name, e.step) for e in after]
    return after[0]


def build_canceled_logged(events: list[Event]) -> bool:
    return any(
        isinstance(e, LogMessage) and e.severity == "error" and "BuildCanceled" in e.message
        for e in events
    )


# -- building the example --------------------------------------------------------------------------


def test_cmake_links_the_example_to_the_wheels_libraries_with_an_rpath(example: Path) -> None:
    dynamic = subprocess.run(
        ["readelf", "-d", str(example)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert {"libtensorrt_rtx.so.1", "libtensorrt_onnxparser_rtx.so.1"} <= set(needed)
    runpath = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]+)\]", dynamic)
    assert runpath is not None and str(rtx_library_dir()) in runpath.group(1).split(":")
    # It runs with nothing on LD_LIBRARY_PATH.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run(
        [str(example), "--help"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0 and "usage: build_engine" in done.stdout, done.stderr


@pytest.mark.slow
def test_cmake_finds_an_sdk_laid_out_as_nvidia_ships_it(
    models: Callable[[str], Path], tmp_path: Path
) -> None:
    """-DTensorRT_ROOT: an SDK's include/ and lib/ (here the wheel's libraries and NVIDIA's
    headers, in an SDK's layout). The journal names the library loaded from there."""
    sdk = tmp_path / "TensorRT-RTX-1.7.1"
    (sdk / "lib").mkdir(parents=True)
    wheel = rtx_library_dir()
    assert wheel is not None
    for name in ("libtensorrt_rtx", "libtensorrt_onnxparser_rtx"):
        (sdk / "lib" / f"{name}.so.1").symlink_to(wheel / f"{name}.so.1")
        (sdk / "lib" / f"{name}.so").symlink_to(f"{name}.so.1")
    (sdk / "include").symlink_to(TENSORRT_INCLUDE)
    build = tmp_path / "build"
    outputs = []
    for step in (
        ["cmake", "-S", str(EXAMPLES), "-B", str(build), f"-DTensorRT_ROOT={sdk}",
         f"-DTensorRT_CUDA_INCLUDE_DIR={cuda_include()}", "-DTensorRT_PYTHON=/nonexistent",
         *cmake_launcher()],
        ["cmake", "--build", str(build)],
    ):  # fmt: skip
        outputs.append(toolchain_step(step, timeout_s=600).stdout)
    assert f"TensorRT: tensorrt-rtx in {sdk / 'lib'}; headers {sdk / 'include'};" in outputs[0]
    journal_path = tmp_path / "build.jsonl"
    ran = run_example(build / "build_engine", models("conv"), "--journal", journal_path,
                      "--shapes", CONV_SHAPES)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    attributes = attributes_of(read_clean(journal_path).events)
    assert attributes["trt.library"] == str(sdk / "lib" / "libtensorrt_rtx.so.1")
    assert attributes["trt.backend"] == "tensorrt-rtx"


# -- the journal of a real build -------------------------------------------------------------------


def test_the_journal_is_the_builders_own_callbacks_and_names_the_loaded_runtime(
    example: Path, models: Callable[[str], Path], tmp_path: Path
) -> None:
    import tensorrt_rtx

    model = models("conv")
    journal_path, engine = tmp_path / "build.jsonl", tmp_path / "conv.engine"
    done = run_example(example, model, "-o", engine, "--journal", journal_path,
                       "--shapes", CONV_SHAPES, "--attribute", "ci.job=42")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert engine.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build.jsonl", "conv.engine"]

    events = read_clean(journal_path).events
    # The same callbacks, in the same order, as TensorRT-RTX makes to a plain monitor.
    plain = plain_build(tensorrt_rtx, model.read_bytes(), CONV_SHAPES)
    assert plain.engine is not None
    assert callbacks_of(events) == plain.callbacks
    assert len(plain.callbacks) > 50 and plain.callbacks[0][:2] == (
        "phase_start",
        "Building engine",
    )

    # The runtime that built it, not the headers it was compiled with.
    attributes = attributes_of(events)
    library = Path(attributes.pop("trt.library"))
    assert library.resolve() == (rtx_library_dir() / "libtensorrt_rtx.so.1").resolve()  # type: ignore[operator]
    assert attributes == {
        "ci.job": "42",
        "model.path": str(model),
        "trt.backend": "tensorrt-rtx",
        "trt.version": tensorrt_rtx.__version__,
        "trt.header_version": header_version(),
    }
    assert attributes["trt.version"] != attributes["trt.header_version"]
    # What `trt-otel build --backend tensorrt-rtx` records of the same builder.
    python = backends.record_attributes(backends.TENSORRT_RTX, tensorrt_rtx)
    assert python == {k: attributes[k] for k in ("trt.backend", "trt.version")}
    assert done.stdout.splitlines()[0].startswith(f"TensorRT-RTX {tensorrt_rtx.__version__} (")

    state = fold(events)
    assert state.outcome is Outcome.SUCCESS and not state.open_by_name


# -- stopping a real build -------------------------------------------------------------------------


def test_the_cancel_file_stops_a_real_build_at_its_next_step(
    example: Path, models: Callable[[str], Path], tmp_path: Path
) -> None:
    journal_path, control, engine = tmp_path / "build.jsonl", tmp_path / "stop", tmp_path / "e"
    build = subprocess.Popen(
        [str(example), str(models("residual")), "-o", str(engine), "--journal", str(journal_path),
         "--cancel-file", str(control), "--poll-interval", "20ms", "--shapes", RESIDUAL_SHAPES],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # The silent step has begun: the cancel is there before TensorRT's next step.
        wait_for_text(journal_path, b'"name":"Determining refit engines","parent"')
        write_at_once(control, "stopped by the operator\n")
        out, err = build.communicate(timeout=300)
    finally:
        build.kill()
        build.wait(30)
    assert build.returncode == 3, err
    assert "cancellation after" in out
    assert not engine.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "build.jsonl",
        "stop",
    ]

    events = read_clean(journal_path).events
    cancel = cancel_record(events)
    assert (cancel["reason"], cancel["source"], cancel["timeout"]) == (
        "stopped by the operator",
        "file",
        False,
    )
    assert (refused_step(events).name, refused_step(events).step) == (
        "Determining refit engines",
        0,
    )
    assert build_canceled_logged(events), "TensorRT's own BuildCanceled error is in the journal"
    state = fold(events)
    assert (
        state.outcome is Outcome.CANCELLATION and state.outcome_detail == "stopped by the operator"
    )
    assert not state.open_by_name
    assert spans_of(events)[-1].attributes["cicd.pipeline.result"] == "cancellation"


def test_the_timeout_stops_a_real_build_at_its_next_step(
    example: Path, models: Callable[[str], Path], tmp_path: Path
) -> None:
    journal_path = tmp_path / "build.jsonl"
    done = run_example(example, models("residual"), "--journal", journal_path, "--timeout", "300ms",
                       "--poll-interval", "20ms", "--shapes", RESIDUAL_SHAPES)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "timeout after" in done.stdout and "BuildCanceled" in done.stderr

    events = read_clean(journal_path).events
    cancel = cancel_record(events)
    assert (cancel["reason"], cancel["source"], cancel["timeout"], cancel["policy"]) == (
        "the build ran past its timeout of 0.3s",
        "timeout",
        True,
        "timeout(0.3s)",
    )
    assert cancel["mono_ns"] - events[0].mono_ns >= 300_000_000
    refused = refused_step(events)
    assert refused.mono_ns > cancel["mono_ns"]
    assert build_canceled_logged(events)
    state = fold(events)
    assert state.outcome is Outcome.TIMEOUT and state.error_type == "timeout"
    assert not state.open_by_name


@pytest.mark.slow
def test_watch_stops_the_example_inside_tensorrts_silent_window(
    example: Path, models: Callable[[str], Path], tmp_path: Path
) -> None:
    """The quick start's model: 20-30 s inside one step of "Determining refit engines", no
    callback to refuse. watch's cancel reaches the monitor (recorded), and --terminate-after
    stops the process and completes its journal, long before the window is over."""
    journal_path, control = tmp_path / "build.jsonl", tmp_path / "control"
    build = subprocess.Popen(
        [str(example), str(models("quickstart")), "--journal", str(journal_path),
         "--cancel-file", str(control), "--poll-interval", "20ms", "--shapes", RESIDUAL_SHAPES],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_text(journal_path, b'"name":"Determining refit engines","parent"', timeout_s=120)
        window_began = time.monotonic()
        done = subprocess.run(
            [*CLI, "watch", str(journal_path), "--no-progress",
             "--no-gpu", "--control-file", str(control), "--timeout", "1s",
             "--terminate-after", "2s"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        took = time.monotonic() - window_began
        assert done.returncode == 3, done.stderr
        assert build.wait(30) == -signal.SIGTERM
    finally:
        build.kill()
        build.wait(30)
    assert took < 15, f"watch took {took:.1f}s to stop a build it had cancelled"

    events = read_clean(journal_path).events
    cancel = cancel_record(events)
    assert cancel["source"] == "timeout", "the C++ monitor recorded watch's decision"
    before = [e for e in events if e.seq < cancel["seq"]]
    assert (before[-1].type, getattr(before[-1], "name", None)) == (
        "phase_start",
        "Determining refit engines",
    ), "cancelled inside the silent step"
    assert not any(isinstance(e, StepCompleted) and e.seq > cancel["seq"] for e in events)
    state = fold(events)
    assert state.outcome is Outcome.TIMEOUT and state.error_type == "timeout"
    assert state.outcome_detail is not None and state.outcome_detail.endswith(
        "TensorRT had not stopped 2.0s later, so its process was stopped with SIGTERM"
    )
    assert not state.open_by_name
    assert spans_of(events)[-1].attributes["cicd.pipeline.result"] == "timeout"


# -- watch as the exporter of a real C++ build -----------------------------------------------------


def span_tree(spans: list[ReceivedSpan]) -> list[tuple[Any, ...]]:
    """Each span as (its name, its parent's name, steps, steps completed, status), sorted."""
    names = {s.span_id: s.name for s in spans}
    return sorted(
        (
            s.name,
            names.get(s.parent_span_id),
            s.attributes.get("trt.phase.num_steps"),
            s.attributes.get("trt.phase.steps_completed"),
            s.status_code,
        )
        for s in spans
        if s.parent_span_id
    )


def python_build_journal(model: Path, path: Path) -> None:
    """trt-otel's Python monitor on a real TensorRT-RTX build of the same model."""
    import tensorrt_rtx

    from rtx_builds import configured_build

    logger = tensorrt_rtx.Logger(tensorrt_rtx.Logger.ERROR)
    builder, network, config = configured_build(
        tensorrt_rtx, logger, model.read_bytes(), RESIDUAL_SHAPES, 1
    )
    attributes = {
        "model.path": str(model),
        **backends.record_attributes(backends.TENSORRT_RTX, tensorrt_rtx),
    }
    monitor = BuildMonitor(attributes=attributes, backend=tensorrt_rtx)
    monitor.log.follow(JournalWriter(path))
    config.progress_monitor = monitor
    monitor.end_with_result(builder.build_serialized_network(network, config))
    assert monitor.close(30)


@pytest.fixture
def small_residual(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "residual100.onnx"
    path.write_bytes(residual_net_bytes(100))
    yield path


def test_watch_exports_a_real_cpp_builds_spans_as_a_python_builds(
    example: Path, small_residual: Path, tmp_path: Path
) -> None:
    journal_path = tmp_path / "cpp.jsonl"
    with otlp_receiver() as receiver:
        build = subprocess.Popen(
            [str(example), str(small_residual), "--journal", str(journal_path),
             "--shapes", RESIDUAL_SHAPES],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for_text(journal_path, b'"type":"build_start"')
            watched = subprocess.run(
                [*CLI, "watch", str(journal_path),
                 "--no-progress", "--no-gpu",
                 "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}",
                 "--otlp-protocol", "grpc"],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            _, err = build.communicate(timeout=300)
        finally:
            build.kill()
            build.wait(30)
        assert build.returncode == 0, err
        assert watched.returncode == 0, watched.stderr
        events = read_clean(journal_path).events
        phases = sum(1 for e in events if e.type == "phase_start")
        cpp_spans = receiver.wait_for_final(phases + 1)
        assert len(cpp_spans) == phases + 1

        receiver.clear()
        python_journal = tmp_path / "python.jsonl"
        python_build_journal(small_residual, python_journal)
        replay = subprocess.run(
            [*CLI, "replay", str(python_journal),
             "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}",
             "--otlp-protocol", "grpc"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert replay.returncode == 0, replay.stderr
        python_spans = receiver.wait_for_final(phases + 1)

    assert span_tree(cpp_spans) == span_tree(python_spans)
    assert {s.trace_id for s in cpp_spans} == {events[0].build_id}  # type: ignore[attr-defined]
    cpp_root = next(s for s in cpp_spans if not s.parent_span_id)
    python_root = next(s for s in python_spans if not s.parent_span_id)
    assert cpp_root.name == python_root.name == f"BUILD {small_residual.name}"
    for key in ("trt.backend", "trt.version", "cicd.pipeline.result"):
        assert cpp_root.attributes[key] == python_root.attributes[key], key
    assert cpp_root.attributes["trt.header_version"] == header_version()


# -- what the example refuses ----------------------------------------------------------------------


def test_the_example_checks_its_command_line_before_building(
    example: Path, models: Callable[[str], Path], tmp_path: Path
) -> None:
    model = models("conv")
    journal = tmp_path / "build.jsonl"
    cases: list[tuple[list[object], str]] = [
        ([], "no model given"),
        ([tmp_path / "missing.onnx"], "is not a readable file"),
        ([tmp_path], "is not a readable file"),
        ([model, "--journal", tmp_path / "no" / "such" / "j.jsonl"], "does not exist"),
        ([model, "--journal", tmp_path], "is a folder"),
        ([model, "-o", model], "would overwrite the model"),
        ([model, "--cancel-file", tmp_path / "no" / "stop"], "does not exist"),
        ([model, "--timeout", "soon"], "is not a duration"),
        ([model, "--timeout", "0s"], "is not a duration longer than 0"),
        ([model, "--timeout", "-5s"], "is not a duration"),
        ([model, "--shapes", "input:1x8x16x16,2x8x16x16"], "needs three shapes"),
        ([model, "--shapes", "input:4x8x16x16,2x8x16x16,1x8x16x16"], "MIN <= OPT <= MAX"),
        ([model, "--shapes", "input:1xax16x16,2x8x16x16,4x8x16x16"], "is not a shape"),
        ([model, "--attribute", "novalue"], "is not KEY=VALUE"),
        ([model, "--attribute", "trt.version=9"], "is the monitor's own"),
        ([model, "--build-id", "XYZ"], "is not 32 lowercase hex digits"),
        ([model, "--no-monitor", "--journal", journal], "--no-monitor"),
        ([model, "--frobnicate"], "unknown option --frobnicate"),
    ]
    for arguments, message in cases:
        done = run_example(example, *arguments, timeout_s=60)
        assert done.returncode == 2 and message in done.stderr, (arguments, done.stderr)
        assert "usage: build_engine" in done.stderr
        assert not journal.exists()
    # Found only once the model is read: an input it does not have. The journal says why.
    done = run_example(example, model, "--journal", journal, "--shapes",
                       "image:1x8x16x16,2x8x16x16,4x8x16x16", timeout_s=120)  # fmt: skip
    assert done.returncode == 2 and "the model has no input 'image'" in done.stderr
    state = fold(read_clean(journal).events)
    assert state.outcome is Outcome.FAILURE
    assert state.outcome_detail == "--shapes: the model has no input 'image'"


def test_a_model_that_does_not_parse_or_build_is_a_failed_build(
    example: Path, tmp_path: Path
) -> None:
    model, journal = tmp_path / "bad.onnx", tmp_path / "build.jsonl"
    model.write_bytes(b"\xff" * 64)  # not a protobuf message
    done = run_example(example, model, "--journal", journal, timeout_s=120)
    assert done.returncode == 4, done.stderr
    state = fold(read_clean(journal).events)
    assert state.outcome is Outcome.FAILURE and state.error_type == "BuildFailed"
    assert state.outcome_detail is not None and state.outcome_detail.startswith(
        f"cannot parse {model}: "
    )
    # A model the parser takes but TensorRT cannot build (no output): its error in the journal.
    model.write_bytes(b"")
    done = run_example(example, model, "--journal", journal, timeout_s=120)
    assert done.returncode == 4, done.stderr
    events = read_clean(journal).events
    state = fold(events)
    assert state.outcome is Outcome.FAILURE
    assert state.outcome_detail == "TensorRT returned no engine"
    errors = [e.message for e in events if isinstance(e, LogMessage) and e.severity == "error"]
    assert any("Network must have at least one output" in m for m in errors), errors


# -- sanitizers ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)  # the sanitized example is built (CMake) inside
@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_sanitized_example_builds_and_cancels_cleanly(
    examples: Callable[[str], Path], models: Callable[[str], Path], variant: str, tmp_path: Path
) -> None:
    """The monitor inside a real build under AddressSanitizer (with UBSan and leak checks) and
    ThreadSanitizer, which halt with a non-zero exit on any report of theirs."""
    binary = examples(variant)
    journal = tmp_path / "built.jsonl"
    done = run_example(binary, models("conv"), "--journal", journal, "--shapes", CONV_SHAPES,
                       timeout_s=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert fold(read_clean(journal).events).outcome is Outcome.SUCCESS
    journal = tmp_path / "timeout.jsonl"
    done = run_example(binary, models("residual"), "--journal", journal, "--timeout", "1s",
                       "--poll-interval", "20ms", "--shapes", RESIDUAL_SHAPES,
                       timeout_s=600)  # fmt: skip
    assert done.returncode == 3, done.stderr[-5000:]
    events = read_clean(journal).events
    assert fold(events).outcome is Outcome.TIMEOUT
    refused_step(events)
