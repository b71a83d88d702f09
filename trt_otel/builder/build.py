"""One build function for TensorRT, TensorRT-RTX and the simulator.

``run_build(trt, ...)`` takes the builder library's module (``tensorrt``, ``tensorrt_rtx``, or a
:class:`~trt_otel.builder.simulator.SimulatedTensorRT`) and uses only the API the two libraries
share:
a builder, a network, the ONNX parser, a builder config with ``progress_monitor``, and
``build_serialized_network``. So the line the tests run on TensorRT-RTX's real builder is the
line a TensorRT build runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trt_otel.builder import preflight
from trt_otel.builder.options import BuildOptions, ShapeRange, unsupported_options
from trt_otel.builder.provenance import output_attributes
from trt_otel.builder.saving import save_build
from trt_otel.capture import backends
from trt_otel.capture.backends import Backend
from trt_otel.capture.binding import ProgressMonitorBase
from trt_otel.core.events import Outcome
from trt_otel.core.files import glob_escape

_SEVERITY_RANK = {"internal_error": 0, "error": 1, "warning": 2, "info": 3, "verbose": 4}


class BuildSetupError(Exception):
    """A build that cannot start (missing model, no builder library, an option the library
    does not have): exit code 2."""


@dataclass(frozen=True, slots=True)
class SimulatorSettings:
    """The simulated builder's settings (see
    :class:`~trt_otel.builder.simulator.SimulatedTensorRT`)."""

    speed: float = 1.0
    silence_s: float = 0.0
    shape: str = "tensorrt-10"
    """Whose phase tree to simulate: ``tensorrt-10`` (the recorded TensorRT 10.16 builds) or
    ``tensorrt-rtx`` (TensorRT-RTX 1.7's, with its silent window)."""
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
    """None builds with a real builder library: ``backend``."""
    plan: Sequence[Any] | None = None
    """The simulator's trace, already parsed (the demo parses it once, to check it before the
    build, and hands it over, interned, rather than have the worker parse it again)."""
    backend: str | None = None
    """The backend's name (``tensorrt``, ``tensorrt-rtx``); None for the default one."""

    @property
    def monitor_backend(self) -> str | None:
        """What the build's monitor must be an ``IProgressMonitor`` of: the backend, or no
        library at all for a simulated build."""
        return "none" if self.simulator is not None else self.backend


@dataclass(frozen=True, slots=True)
class BuildResult:
    outcome: Outcome
    detail: str
    engine_path: Path | None
    engine_bytes: int


def select_backend(name: str | None = None) -> tuple[Backend, Any]:
    """The backend to build with (``name``, else the default one) and its imported module, or a
    BuildSetupError saying how to install one."""
    if name is None:
        backend = backends.default_backend()
        if backend is None:
            raise BuildSetupError(backends.install_hint())
    else:
        try:
            backend = backends.backend_named(name)
        except ValueError as error:
            raise BuildSetupError(str(error)) from None
    try:
        return backend, backends.import_module(backend)
    except ImportError as error:
        hint = "" if name is None else f" (or leave out --backend {name})"
        raise BuildSetupError(f"{error}{hint}") from None


def check_builder_options(trt: Any, options: BuildOptions) -> None:
    """Refuse (BuildSetupError) the options that the library ``trt`` does not have."""
    problems = unsupported_options(trt, options)
    if problems:
        raise BuildSetupError("; ".join(problems))


def run_build_job(monitor: ProgressMonitorBase, job: BuildJob) -> BuildResult:
    """Run ``job`` with ``monitor`` attached: the body of a build's worker process, and of an
    in-process build alike."""
    if job.simulator is None:
        _, trt = select_backend(job.backend)
    else:
        from trt_otel.builder.simulator import SimulatedTensorRT, load_trace

        settings = job.simulator
        trace = job.plan
        if trace is None and settings.trace is not None:
            trace = load_trace(settings.trace)
        trt = SimulatedTensorRT(
            speed=settings.speed, silence_s=settings.silence_s, trace=trace, shape=settings.shape
        )
    model = job.model if job.model is not None else read_model(job.model_path)
    return run_build(
        trt, job.model_path, model, monitor, engine_path=job.engine_path, options=job.options
    )


def partial_files(engine_path: Path, pid: int) -> list[Path]:
    """Temporary files a build process ``pid`` may have left while writing ``engine_path``
    (if it was killed mid-write)."""
    directory = engine_path.parent if str(engine_path.parent) else Path(".")
    return sorted(directory.glob(f".{glob_escape(engine_path.name)}.{pid}.*.partial"))


def model_attributes(model_path: Path, model: bytes) -> dict[str, Any]:
    """What the build record says about the model, so builds can be compared later."""
    return {
        "model.path": str(model_path),
        "model.sha256": hashlib.sha256(model).hexdigest(),
        "model.bytes": len(model),
    }


def read_model(model_path: Path) -> bytes:
    """The model, only from a regular file of a sane size (:func:`preflight.read_model`)."""
    try:
        return preflight.read_model(model_path)
    except preflight.PreflightError as error:
        raise BuildSetupError(str(error)) from None


def run_build(
    trt: Any,
    model_path: Path,
    model: bytes,
    monitor: ProgressMonitorBase,
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
    check_builder_options(trt, options)
    logger = _event_logger(trt, monitor, options.log_level)
    builder = trt.Builder(logger)
    if options.max_threads is not None:
        builder.max_threads = options.max_threads
    network = builder.create_network(_network_flags(trt, options))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model, str(model_path)):
        errors = [_describe_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        detail = "; ".join(errors) or "the ONNX parser rejected the model"
        monitor.end(Outcome.FAILURE, f"cannot parse {model_path.name}: {detail}", "ParserError")
        return BuildResult(Outcome.FAILURE, detail, None, 0)

    config = builder.create_builder_config()
    _configure(trt, config, options)
    profile, inputs = _add_profile(builder, config, network, options, monitor)
    timing_cache = _load_timing_cache(config, options.timing_cache, monitor)
    if _SEVERITY_RANK[options.log_level] >= _SEVERITY_RANK["info"]:
        monitor.log_message("INFO", _config_summary(trt, builder, config, profile, inputs))
    config.progress_monitor = _attachable(trt, monitor)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        outcome = monitor.end_with_result(serialized)
        return BuildResult(outcome, monitor.outcome_detail, None, 0)
    data = memoryview(serialized).tobytes()
    cache_data = None
    if timing_cache is not None and options.timing_cache is not None:
        cache_data = memoryview(config.get_timing_cache().serialize()).tobytes()
    # The build has not succeeded until its files are written: its end is recorded after.
    failure = save_build(data, engine_path, cache_data, options.timing_cache)
    if failure is not None:
        monitor.end(Outcome.FAILURE, failure.detail, error_type=failure.error_type)
        return BuildResult(Outcome.FAILURE, failure.detail, None, 0)
    monitor.record_output(output_attributes(data, engine_path, cache_data))
    outcome = monitor.end_with_result(serialized)
    return BuildResult(outcome, "", engine_path, len(data))


def _network_flags(trt: Any, options: BuildOptions) -> int:
    flags = 0
    creation = trt.NetworkDefinitionCreationFlag
    if hasattr(creation, "EXPLICIT_BATCH"):  # the default, and deprecated, from TensorRT 10
        flags |= 1 << int(creation.EXPLICIT_BATCH)
    if options.strongly_typed:
        flags |= 1 << int(creation.STRONGLY_TYPED)
    return flags


def _configure(trt: Any, config: Any, options: BuildOptions) -> None:
    """Set the options on ``config`` (checked by :func:`check_builder_options` already)."""
    for precision in options.precisions:
        config.set_flag(getattr(trt.BuilderFlag, precision.upper()))
    for pool_name, size in options.memory_pools.items():
        config.set_memory_pool_limit(getattr(trt.MemoryPoolType, pool_name), size)
    if options.optimization_level is not None:
        config.builder_optimization_level = options.optimization_level


def _add_profile(
    builder: Any, config: Any, network: Any, options: BuildOptions, monitor: ProgressMonitorBase
) -> tuple[Any, list[str]]:
    """One optimization profile: the given shapes, and for a dynamic input given none, its
    dynamic dimensions set to 1 (as trtexec does), said in a log event."""
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    names = {tensor.name for tensor in inputs}
    unknown = sorted(set(options.shapes) - names)
    if unknown:
        raise BuildSetupError(
            f"no input named {', '.join(map(repr, unknown))}; the model's inputs are "
            f"{', '.join(map(repr, sorted(names))) or 'none'}"
        )
    ranges: dict[str, ShapeRange] = dict(options.shapes)
    for tensor in inputs:
        dims = tuple(int(d) for d in tensor.shape)
        if tensor.name in ranges:
            if len(ranges[tensor.name][0]) != len(dims):
                raise BuildSetupError(
                    f"input {tensor.name!r} has {len(dims)} dimensions, its shapes have "
                    f"{len(ranges[tensor.name][0])}"
                )
        elif any(d < 0 for d in dims):
            fixed = tuple(1 if d < 0 else d for d in dims)
            ranges[tensor.name] = (fixed, fixed, fixed)
            monitor.log_message(
                "WARNING",
                f"input {tensor.name!r} is dynamic and no shapes were given: building for "
                f"{'x'.join(map(str, fixed))} (give --shapes for a range)",
            )
    if not ranges:
        return None, []
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in ranges.items():
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
    return profile, sorted(ranges)


def _config_summary(trt: Any, builder: Any, config: Any, profile: Any, inputs: list[str]) -> str:
    """What the builder's config holds, read back from the library's own objects, so that the
    journal shows what the build got, not only what was asked for."""
    try:
        parts = [
            f"optimization level {config.builder_optimization_level}",
            f"max threads {builder.max_threads}",
        ]
        for name in ("WORKSPACE", "TACTIC_DRAM", "TACTIC_SHARED_MEMORY"):
            pool = getattr(trt.MemoryPoolType, name, None)
            if pool is not None:
                parts.append(f"{name.lower()} pool {config.get_memory_pool_limit(pool)}")
        for name in inputs:
            shapes = ("x".join(str(int(d)) for d in dims) for dims in profile.get_shape(name))
            parts.append(f"profile {name} {'/'.join(shapes)}")
    except Exception as error:  # a library without one of these getters: say so, build on
        return f"builder config: cannot be read back ({type(error).__name__}: {error})"
    return "builder config: " + ", ".join(parts)


def _attachable(trt: Any, monitor: ProgressMonitorBase) -> Any:
    """``monitor`` as the library's ``IProgressMonitor``: itself when it is one (the usual
    case), else a forwarder that is (a monitor bound to the other library, where both are
    installed: the build's worker creates its monitor before it knows the library)."""
    base: Any = getattr(trt, "IProgressMonitor", None)
    if not isinstance(base, type) or isinstance(monitor, base):
        return monitor

    class Forwarder(base):  # type: ignore[misc]
        def __init__(self) -> None:
            base.__init__(self)  # pybind11 requires it when __init__ is overridden

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            monitor.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return monitor.step_complete(phase_name, step)

        def phase_finish(self, phase_name: str) -> None:
            monitor.phase_finish(phase_name)

    return Forwarder()


def _load_timing_cache(config: Any, path: Path | None, monitor: ProgressMonitorBase) -> Any:
    """The timing cache from ``path`` (a new one if it does not exist or cannot be used)."""
    if path is None:
        return None
    data = b""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as error:
        raise BuildSetupError(f"cannot read timing cache {path}: {error.strerror}") from None
    cache = config.create_timing_cache(data)
    if cache is None and data:
        monitor.log_message("WARNING", f"timing cache {path} is unusable; starting a new one")
        cache = config.create_timing_cache(b"")
    config.set_timing_cache(cache, False)
    return cache


def _describe_parser_error(error: Any) -> str:
    """``node 1 (fancy, FancyOp): ...``: the node's index, and its name and operator where the
    parser says them (TensorRT 10 and TensorRT-RTX do)."""
    node = error.node()
    if node < 0:
        return f"model: {error.desc()}"
    names = []
    for getter in ("node_name", "node_operator"):
        text = str(getattr(error, getter)()) if hasattr(error, getter) else ""
        if text:
            names.append(text)
    where = f"node {node} ({', '.join(names)})" if names else f"node {node}"
    return f"{where}: {error.desc()}"


def _event_logger(trt: Any, monitor: ProgressMonitorBase, level: str = "info") -> Any:
    """A TensorRT logger that records the builder's messages, ``level`` and more severe, as
    log events."""
    least = _SEVERITY_RANK[level]

    class EventLogger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            name = str(getattr(severity, "name", severity)).lower()
            if _SEVERITY_RANK.get(name, 0) <= least:
                monitor.log_message(name.upper(), msg)

    return EventLogger()
