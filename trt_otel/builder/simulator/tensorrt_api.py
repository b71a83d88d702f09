"""The slice of the ``tensorrt`` Python API that trt-otel's build code uses, simulated.

``SimulatedTensorRT(...)`` stands where ``import tensorrt as trt`` would: ``trt.Builder``,
``trt.Logger``, ``trt.OnnxParser``, ``trt.NetworkDefinitionCreationFlag``, ``trt.BuilderFlag``,
``trt.MemoryPoolType``, and a builder config whose ``progress_monitor`` receives the callbacks
of a build generated from the parsed network's size (or of a recorded trace). The ONNX model is
really parsed with the ``onnx`` package, so malformed models fail as they would in TensorRT's
parser. The "engine" is a small, clearly labelled JSON document, never a real engine.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from typing import Any

from trt_otel.builder.simulator.callbacks import Callback, InternedPlan
from trt_otel.builder.simulator.driver import Driver, NoOpMonitor
from trt_otel.builder.simulator.plan import (
    TENSORRT_10,
    TENSORRT_RTX,
    TimeModel,
    generate_plan,
    generate_rtx_plan,
    silent_step_index,
)
from trt_otel.core.startup import native_import

SIMULATED_ENGINE_MAGIC = b"TRT-OTEL-SIMULATED-ENGINE\n"
SIMULATOR_VERSION = "simulated"
"""What ``trt.version`` says of a simulated build."""


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class ILogger:
    """Base of builder loggers; subclasses override ``log(severity, msg)``."""

    Severity = _Severity

    def log(self, severity: _Severity, msg: str) -> None:  # pragma: no cover - overridden
        pass


class Logger(ILogger):
    """TensorRT's default logger: prints messages at or above ``min_severity``."""

    def __init__(self, min_severity: _Severity = _Severity.WARNING) -> None:
        self.min_severity = min_severity

    def log(self, severity: _Severity, msg: str) -> None:
        if severity <= self.min_severity:
            print(f"[TRT] [{severity.name[0]}] {msg}")


class NetworkDefinitionCreationFlag(enum.IntEnum):
    EXPLICIT_BATCH = 0
    STRONGLY_TYPED = 1


class BuilderFlag(enum.IntEnum):
    FP16 = 0
    INT8 = 1
    BF16 = 2
    FP8 = 3


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3
    TACTIC_DRAM = 4
    TACTIC_SHARED_MEMORY = 5


class ITensor:
    def __init__(self, name: str, shape: Sequence[int]) -> None:
        self.name = name
        self.shape = tuple(shape)


class ITimingCache:
    """Timing results by layer name; serialized as JSON (the real one is opaque bytes)."""

    def __init__(self, entries: dict[str, float]) -> None:
        self.entries = entries

    def serialize(self) -> bytes:
        return b"TRT-OTEL-SIMULATED-TIMING-CACHE\n" + json.dumps(self.entries).encode()


_CACHE_MAGIC = b"TRT-OTEL-SIMULATED-TIMING-CACHE\n"


class ParserError:
    def __init__(self, node: int, message: str, code: int = 1) -> None:
        self._node = node
        self._message = message
        self._code = code

    def node(self) -> int:
        return self._node

    def desc(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __str__(self) -> str:
        return f"In node {self._node}: {self._message}"


class INetworkDefinition:
    def __init__(self, flags: int) -> None:
        self.flags = flags
        self.layer_names: list[str] = []
        self.inputs: list[ITensor] = []

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> ITensor:
        return self.inputs[index]

    @property
    def dynamic_inputs(self) -> list[str]:
        return [t.name for t in self.inputs if any(d < 0 for d in t.shape)]


class IOptimizationProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Sequence[int], Sequence[int], Sequence[int]]] = {}

    def set_shape(
        self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]
    ) -> None:
        self.shapes[input] = (min, opt, max)

    def get_shape(self, input: str) -> list[Sequence[int]]:
        return list(self.shapes[input])


class IBuilderConfig:
    def __init__(self) -> None:
        self._progress_monitor: Any = None
        self.flags: set[BuilderFlag] = set()
        self.memory_pool_limits: dict[MemoryPoolType, int] = {}
        self.builder_optimization_level = 3
        self.profiles: list[IOptimizationProfile] = []
        self.timing_cache: ITimingCache | None = None

    @property
    def progress_monitor(self) -> Any:
        return self._progress_monitor

    @progress_monitor.setter
    def progress_monitor(self, monitor: Any) -> None:
        for method in ("phase_start", "step_complete", "phase_finish"):
            if not callable(getattr(monitor, method, None)):
                raise TypeError(f"progress_monitor needs a {method} method")
        self._progress_monitor = monitor

    def set_flag(self, flag: BuilderFlag) -> None:
        self.flags.add(flag)

    def get_flag(self, flag: BuilderFlag) -> bool:
        return flag in self.flags

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.memory_pool_limits[pool] = size

    def get_memory_pool_limit(self, pool: MemoryPoolType) -> int:
        return self.memory_pool_limits.get(pool, 0)

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, serialized: bytes) -> ITimingCache | None:
        """A cache from serialized bytes (empty: a new one); None for bytes that are not one."""
        if not serialized:
            return ITimingCache({})
        if not serialized.startswith(_CACHE_MAGIC):
            return None
        try:
            entries = json.loads(serialized[len(_CACHE_MAGIC) :])
        except ValueError:
            return None
        return ITimingCache(entries) if isinstance(entries, dict) else None

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache | None:
        return self.timing_cache


class OnnxParser:
    """Parses ONNX with the ``onnx`` package and checks it as TensorRT's parser would."""

    def __init__(self, network: INetworkDefinition, logger: ILogger) -> None:
        self._network = network
        self._logger = logger
        self._errors: list[ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()

    def parse_from_file(self, model: str) -> bool:
        with open(model, "rb") as handle:
            return self.parse(handle.read(), model)

    def parse(self, model: bytes, path: str | None = None) -> bool:
        with native_import():  # imported here: only a simulated parse needs it
            import onnx

        try:
            proto = onnx.load_model_from_string(model)
            onnx.checker.check_model(proto)
        except Exception as error:
            message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            self._errors.append(ParserError(-1, f"ModelImporter: failed to parse ONNX: {message}"))
            return False
        if not proto.graph.node:
            self._errors.append(ParserError(-1, "ModelImporter: the network has no layers"))
            return False
        for index, node in enumerate(proto.graph.node):
            if node.domain not in ("", "ai.onnx"):
                self._errors.append(
                    ParserError(index, f"No importer registered for op: {node.op_type}", code=8)
                )
        self._network.layer_names = [
            n.name or f"{n.op_type}_{i}" for i, n in enumerate(proto.graph.node)
        ]
        initializers = {t.name for t in proto.graph.initializer}
        for tensor in proto.graph.input:
            if tensor.name in initializers:
                continue
            dims = tensor.type.tensor_type.shape.dim
            shape = [-1 if d.dim_param or d.dim_value <= 0 else d.dim_value for d in dims]
            self._network.inputs.append(ITensor(tensor.name, shape))
        self._logger.log(
            _Severity.INFO, f"parsed ONNX model with {self._network.num_layers} layers"
        )
        return not self._errors


class Builder:
    def __init__(self, logger: ILogger, *, simulation: SimulatedTensorRT) -> None:
        self.logger = logger
        self.max_threads = 1
        self._simulation = simulation

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(
        self, network: INetworkDefinition, config: IBuilderConfig
    ) -> bytes | None:
        """Run the simulated build; ``None`` when it was cancelled, as TensorRT does."""
        simulation = self._simulation
        if network.num_layers == 0 and simulation.trace is None:
            self.logger.log(_Severity.ERROR, "Network must have at least one output")
            return None
        if network.dynamic_inputs and not config.profiles:
            self.logger.log(
                _Severity.ERROR,
                f"Network has dynamic or shape inputs ({', '.join(network.dynamic_inputs)}), "
                "but no optimization profile has been defined",
            )
            return None
        strongly_typed = network.flags & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        precision = {BuilderFlag.FP16, BuilderFlag.BF16, BuilderFlag.INT8, BuilderFlag.FP8}
        if strongly_typed and config.flags & precision:
            self.logger.log(
                _Severity.ERROR,
                "precision builder flags are not allowed for a strongly typed network",
            )
            return None
        profiles = max(1, len(config.profiles))
        silence_at = None
        if simulation.trace is not None:
            plan = simulation.trace
        elif simulation.shape == TENSORRT_RTX:
            plan = generate_rtx_plan(network.num_layers, num_profiles=profiles)
            silence_at = silent_step_index(plan)  # where TensorRT-RTX goes silent
        else:
            plan = generate_plan(
                network.num_layers,
                num_profiles=profiles,
                seed=simulation.seed,
                optimization_level=config.builder_optimization_level,
            )
        monitor = config.progress_monitor or NoOpMonitor()
        result = simulation.driver(self.max_threads, silence_at).run(monitor, plan)
        if not result.completed:
            self.logger.log(_Severity.ERROR, "Build was cancelled by the progress monitor")
            return None
        cache = config.timing_cache
        cached = 0
        if cache is not None:
            cached = sum(1 for name in network.layer_names if name in cache.entries)
            for name in network.layer_names:
                cache.entries.setdefault(name, 1.0)
        summary = {
            "simulated": True,
            "layers": network.num_layers,
            "flags": sorted(f.name for f in config.flags),
            "strongly_typed": bool(strongly_typed),
            "memory_pools": {p.name: size for p, size in config.memory_pool_limits.items()},
            "optimization_level": config.builder_optimization_level,
            "max_threads": self.max_threads,
            "profiles": [
                {name: [list(s) for s in shapes] for name, shapes in profile.shapes.items()}
                for profile in config.profiles
            ],
            "timing_cache_hits": cached,
            "callbacks": result.callbacks_made,
        }
        return SIMULATED_ENGINE_MAGIC + json.dumps(summary).encode()


_ILogger = ILogger


class SimulatedTensorRT:
    """A stand-in for the ``tensorrt`` module, configured with the simulation's knobs."""

    __version__ = SIMULATOR_VERSION
    ILogger = ILogger
    Logger = Logger
    NetworkDefinitionCreationFlag = NetworkDefinitionCreationFlag
    BuilderFlag = BuilderFlag
    MemoryPoolType = MemoryPoolType
    OnnxParser = OnnxParser
    IBuilderConfig = IBuilderConfig

    def __init__(
        self,
        *,
        speed: float = 1.0,
        silence_s: float = 0.0,
        shape: str = TENSORRT_10,
        trace: Sequence[Callback] | None = None,
        time_model: TimeModel | None = None,
        seed: int = 0,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.speed = speed
        self.silence_s = silence_s
        self.shape = shape
        """Whose phase tree a generated plan has: ``tensorrt-10`` or ``tensorrt-rtx``."""
        # A long interned trace stays interned (4 bytes a callback); anything else is copied.
        self.trace = trace if trace is None or isinstance(trace, InternedPlan) else list(trace)
        self.time_model = time_model or TimeModel()
        self.seed = seed
        self._sleep = sleep

    def Builder(self, logger: _ILogger) -> Builder:  # noqa: N802 - mirrors tensorrt.Builder
        return Builder(logger, simulation=self)

    def driver(self, threads: int, silence_at: int | None = None) -> Driver:
        kwargs: dict[str, Any] = {}
        if self._sleep is not None:
            kwargs["sleep"] = self._sleep
        return Driver(
            speed=self.speed,
            time_model=self.time_model,
            silence_s=self.silence_s,
            silence_at=silence_at,
            threads=threads,
            **kwargs,
        )
