"""One build function for the real TensorRT and the simulator.

``run_build(trt, ...)`` takes the ``tensorrt`` module (or a
:class:`~trt_otel.simulator.SimulatedTensorRT`) and uses only the documented API: a builder, an
explicit-batch network, the ONNX parser, a builder config with ``progress_monitor``, and
``build_serialized_network``. So every line of it that the simulator exercises is the line the
real build runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trt_otel.events import Outcome
from trt_otel.monitor import BuildMonitor


class BuildSetupError(Exception):
    """A build that cannot start (missing model, no TensorRT, bad options): exit code 2."""


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """Builder options (named after ``trtexec`` where it has a name)."""

    max_threads: int | None = None
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict
    )


@dataclass(frozen=True, slots=True)
class SimulatorSettings:
    """The simulated builder's settings (see :class:`~trt_otel.simulator.SimulatedTensorRT`)."""

    speed: float = 1.0
    silence_s: float = 0.0
    trace: Path | None = None
    """A recorded callback trace or journal to replay instead of a generated plan."""


@dataclass(frozen=True, slots=True)
class BuildJob:
    """A build described by value, so that a worker process can run it."""

    model_path: Path
    model: bytes | None = None
    """The model itself; None to read ``model_path`` where the build runs."""
    engine_path: Path | None = None
    options: BuildOptions = field(default_factory=BuildOptions)
    simulator: SimulatorSettings | None = None
    """None builds with the real ``tensorrt``."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    outcome: Outcome
    detail: str
    engine_path: Path | None
    engine_bytes: int


def import_tensorrt() -> Any:
    """The real ``tensorrt`` module, or a BuildSetupError saying how to get it."""
    try:
        import tensorrt
    except ImportError as error:
        raise BuildSetupError(
            f"TensorRT is not installed ({error}); install it with "
            "`pip install 'trt-otel[tensorrt]'` on a machine with an NVIDIA GPU, "
            "or try `trt-otel demo` to run the same pipeline on the simulator"
        ) from None
    return tensorrt


def run_build_job(monitor: BuildMonitor, job: BuildJob) -> BuildResult:
    """Run ``job`` with ``monitor`` attached: the body of a build's worker process, and of an
    in-process build alike."""
    if job.simulator is None:
        trt = import_tensorrt()
    else:
        from trt_otel.simulator import SimulatedTensorRT, load_trace

        settings = job.simulator
        trace = load_trace(settings.trace) if settings.trace is not None else None
        trt = SimulatedTensorRT(speed=settings.speed, silence_s=settings.silence_s, trace=trace)
    model = job.model if job.model is not None else read_model(job.model_path)
    return run_build(
        trt, job.model_path, model, monitor, engine_path=job.engine_path, options=job.options
    )


def partial_files(engine_path: Path, pid: int) -> list[Path]:
    """Temporary files a build process ``pid`` may have left while writing ``engine_path``
    (if it was killed mid-write)."""
    directory = engine_path.parent if str(engine_path.parent) else Path(".")
    return sorted(directory.glob(f".{engine_path.name}.{pid}.*.partial"))


def model_attributes(model_path: Path, model: bytes) -> dict[str, Any]:
    """What the build record says about the model, so builds can be compared later."""
    return {
        "model.path": str(model_path),
        "model.sha256": hashlib.sha256(model).hexdigest(),
        "model.bytes": len(model),
    }


def read_model(model_path: Path) -> bytes:
    try:
        data = model_path.read_bytes()
    except FileNotFoundError:
        raise BuildSetupError(f"model not found: {model_path}") from None
    except IsADirectoryError:
        raise BuildSetupError(f"model path is a directory: {model_path}") from None
    except OSError as error:
        raise BuildSetupError(f"cannot read model {model_path}: {error.strerror}") from None
    if not data:
        raise BuildSetupError(f"model file is empty: {model_path}")
    return data


def run_build(
    trt: Any,
    model_path: Path,
    model: bytes,
    monitor: BuildMonitor,
    *,
    engine_path: Path | None = None,
    options: BuildOptions | None = None,
) -> BuildResult:
    """Parse ``model``, build it with ``monitor`` attached, record the end, write the engine.

    Returns the outcome; the monitor's log holds every event. The engine file is written only
    for a successful build, atomically, so a failed or cancelled build never leaves one behind
    nor touches an existing one.
    """
    options = options or BuildOptions()
    logger = _event_logger(trt, monitor)
    builder = trt.Builder(logger)
    if options.max_threads is not None:
        builder.max_threads = options.max_threads
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model, str(model_path)):
        errors = [_describe_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        detail = "; ".join(errors) or "the ONNX parser rejected the model"
        monitor.end(Outcome.FAILURE, f"cannot parse {model_path.name}: {detail}", "ParserError")
        return BuildResult(Outcome.FAILURE, detail, None, 0)

    config = builder.create_builder_config()
    _add_profiles(builder, config, network, options)
    config.progress_monitor = monitor
    serialized = builder.build_serialized_network(network, config)
    outcome = monitor.end_with_result(serialized)
    if serialized is None:
        return BuildResult(outcome, monitor.state.outcome_detail, None, 0)
    data = memoryview(serialized).tobytes()
    if engine_path is not None:
        write_atomically(engine_path, data)
    return BuildResult(outcome, "", engine_path, len(data))


def _add_profiles(builder: Any, config: Any, network: Any, options: BuildOptions) -> None:
    dynamic = list(getattr(network, "dynamic_inputs", []))
    if not options.shapes and not dynamic:
        return
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in options.shapes.items():
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)


def _describe_parser_error(error: Any) -> str:
    node = error.node()
    where = f"node {node}" if node >= 0 else "model"
    return f"{where}: {error.desc()}"


def _event_logger(trt: Any, monitor: BuildMonitor) -> Any:
    """A TensorRT logger that records the builder's messages as log events."""

    class EventLogger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            monitor.log_message(getattr(severity, "name", str(severity)), msg)

    return EventLogger()


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    directory = path.parent if str(path.parent) else Path(".")
    # The pid in the name lets a supervisor that killed this process find what it left.
    handle, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}.", suffix=".partial", dir=directory
    )
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
