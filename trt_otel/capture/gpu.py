"""GPU telemetry beside the phases: the build's GPU, sampled through NVML into the event log.

A :class:`GpuSampler` reads the GPU at a fixed rate on a thread of its own and appends each reading
as a ``gpu`` event, so samples are journaled, replayed and projected like everything else: the
latest values become gauges, and each phase span gets the peak memory used and the mean
utilization while it was open.

NVML comes from NVIDIA's ``nvidia-ml-py`` (the ``gpu`` extra). Where it is missing, or finds no
driver or no such GPU, sampling is off and :func:`open_reader` says why in one line; a reading
that fails mid-build is counted and reported once, and never touches the build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from trt_otel.core.events import GpuSample

if TYPE_CHECKING:
    from trt_otel.capture.monitor import BuildMonitor

_logger = logging.getLogger(__name__)

Warn = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One reading; a value the device does not report is None."""

    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization: float | None = None
    memory_utilization: float | None = None
    sm_clock_hz: int | None = None
    memory_clock_hz: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    process_memory_used_bytes: int | None = None


class GpuReader(Protocol):
    index: int

    def read(self) -> GpuReading: ...

    def process_memory_bytes(self, pid: int) -> int | None:
        """The GPU memory process ``pid`` holds on this GPU (None: it holds none, or the
        device does not say)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Build attributes: the GPU's name, memory, driver."""
        ...

    def close(self) -> None: ...


class NvmlUnavailableError(Exception):
    """NVML cannot sample this GPU here; the message says why, in words for one line."""


def selected_gpu(environ: dict[str, str] | None = None) -> str:
    """The GPU a build will use: the first of ``CUDA_VISIBLE_DEVICES`` (an index or a UUID),
    else 0. NVML numbers GPUs without regard to that variable, hence the translation."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


GPU_IDENTITY = ("gpu.name", "gpu.compute_capability")
"""What names a GPU for a TensorRT engine: its model and architecture (an engine runs only on the
GPU model it was built for)."""


def identify_gpu(device: str) -> dict[str, str]:
    """``device``'s :data:`GPU_IDENTITY`, read once through NVML (whether or not the build's GPU
    is sampled); NvmlUnavailableError where NVML cannot say."""
    reader = NvmlReader(device)
    try:
        described = reader.describe()
    finally:
        reader.close()
    missing = [key for key in GPU_IDENTITY if key not in described]
    if missing:
        raise NvmlUnavailableError(f"GPU {device!r} does not say its {' or '.join(missing)}")
    return {key: str(described[key]) for key in GPU_IDENTITY}


class NvmlReader:
    """Reads one GPU through NVML (``pynvml`` from ``nvidia-ml-py``)."""

    def __init__(self, device: str = "0") -> None:
        self._closed = False
        try:
            self._nvml: Any = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailableError(
                "nvidia-ml-py is not installed (pip install 'trt-otel[gpu]')"
            ) from None
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as error:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            if getattr(error, "value", None) == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", -1):
                # No NVIDIA driver at all: a CPU-only machine (TensorRT-RTX builds there), not
                # a fault to report as one.
                raise NvmlUnavailableError(
                    "no NVIDIA driver on this machine (NVML's library is not there): a CPU-only "
                    "build"
                ) from None
            raise NvmlUnavailableError(f"NVML cannot start: {error}") from None
        try:
            if device.startswith(("GPU-", "MIG-")):
                self._handle = nvml.nvmlDeviceGetHandleByUUID(device)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(int(device))
            self.index = int(nvml.nvmlDeviceGetIndex(self._handle))
        except Exception as error:
            nvml.nvmlShutdown()
            raise NvmlUnavailableError(f"no GPU {device!r}: {error}") from None

    def _get(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(self._handle, *args)
        except Exception:  # NVMLError_NotSupported and kin: this device does not say
            return None

    def read(self) -> GpuReading:
        nvml = self._nvml
        memory = self._get("nvmlDeviceGetMemoryInfo")
        rates = self._get("nvmlDeviceGetUtilizationRates")
        sm_mhz = self._get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
        memory_mhz = self._get("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)
        power_mw = self._get("nvmlDeviceGetPowerUsage")
        temperature = self._get("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
        return GpuReading(
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            utilization=rates.gpu / 100 if rates is not None else None,
            memory_utilization=rates.memory / 100 if rates is not None else None,
            sm_clock_hz=int(sm_mhz) * 1_000_000 if sm_mhz is not None else None,
            memory_clock_hz=int(memory_mhz) * 1_000_000 if memory_mhz is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
        )

    def process_memory_bytes(self, pid: int) -> int | None:
        held = [
            process.usedGpuMemory
            for function in ("nvmlDeviceGetComputeRunningProcesses",
                             "nvmlDeviceGetGraphicsRunningProcesses")
            for process in self._get(function) or ()
            if process.pid == pid and process.usedGpuMemory is not None
        ]  # fmt: skip
        return int(sum(held)) if held else None

    def describe(self) -> dict[str, Any]:
        name = self._get("nvmlDeviceGetName")
        memory = self._get("nvmlDeviceGetMemoryInfo")
        attributes: dict[str, Any] = {"gpu.index": self.index}
        if name is not None:
            attributes["gpu.name"] = name.decode() if isinstance(name, bytes) else str(name)
        if memory is not None:
            attributes["gpu.memory_total_bytes"] = int(memory.total)
        uuid = self._get("nvmlDeviceGetUUID")
        if uuid is not None:  # the GPU's identity on the host: the resource's hw.id
            attributes["gpu.uuid"] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        capability = self._get("nvmlDeviceGetCudaComputeCapability")
        if capability is not None:
            attributes["gpu.compute_capability"] = f"{capability[0]}.{capability[1]}"
        with contextlib.suppress(Exception):
            version = int(self._nvml.nvmlSystemGetCudaDriverVersion())
            attributes["cuda.driver.version"] = f"{version // 1000}.{version % 1000 // 10}"
        try:
            driver = self._nvml.nvmlSystemGetDriverVersion()
            attributes["gpu.driver"] = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            pass
        return attributes

    def close(self) -> None:
        # Both the sampler and the session that opened the reader close it; NVML counts its
        # initializations, so a second shutdown would end someone else's.
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


def open_reader(device: str | None = None) -> tuple[NvmlReader | None, str]:
    """A reader for the build's GPU, or None; and one line saying which, or why not."""
    chosen = device if device is not None else selected_gpu()
    try:
        reader = NvmlReader(chosen)
    except NvmlUnavailableError as reason:
        return None, f"gpu: no telemetry: {reason}"
    name = reader.describe().get("gpu.name", "a GPU")
    return reader, f"gpu: sampling {name} (NVML index {reader.index})"


class GpuSampler:
    """Records a ``gpu`` event through the build's ``monitor`` every ``interval_s``, on its own
    thread."""

    def __init__(
        self,
        monitor: BuildMonitor,
        reader: GpuReader,
        *,
        interval_s: float = 1.0,
        warn: Warn | None = None,
        build_open: Callable[[], bool] | None = None,
    ) -> None:
        """``build_open``: whether the build has not ended yet (asked under the log's lock), so
        that no sample follows its end."""
        if not interval_s > 0:
            raise ValueError("the sampling interval must be longer than 0s")
        self.monitor = monitor
        self.reader = reader
        self.build_open = build_open
        self.interval_s = interval_s
        self.samples = 0
        self.errors = 0
        self.last_error: str | None = None
        self.pid: int | None = None
        """The builder's process, once known (:meth:`watch`): its own GPU memory is sampled."""
        self._warn = warn or (lambda message: _logger.warning("%s", message))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trt-otel-gpu", daemon=True)

    def watch(self, pid: int) -> None:
        """Sample the GPU memory ``pid`` holds too (the worker, once it has started)."""
        self.pid = pid

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5.0)
        self.reader.close()

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def sample_once(self) -> GpuSample | None:
        try:
            reading = self.reader.read()
            if self.pid is not None:
                held = self.reader.process_memory_bytes(self.pid)
                reading = dataclasses.replace(reading, process_memory_used_bytes=held)
        except Exception as error:  # a failing reader costs this sample, nothing else
            self.errors += 1
            self.last_error = f"{type(error).__name__}: {error}"
            if self.errors == 1:
                self._warn(
                    f"reading the GPU failed ({self.last_error}); the build goes on, "
                    "further failures are only counted"
                )
            return None
        fields = dataclasses.asdict(reading)
        sample = self.monitor.sample(GpuSample, self.build_open, index=self.reader.index, **fields)
        if sample is not None:
            self.samples += 1
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)
