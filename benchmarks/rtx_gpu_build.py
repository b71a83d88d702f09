"""TensorRT-RTX on a machine with a GPU: build the generated models with the real builder, time
each phase, sample the GPU through NVML (where it is present) beside the build, try to
deserialize each engine, and print a summary.

Not part of CI (it wants a GPU); run it on the GPU machine with the repository on PYTHONPATH:

    PYTHONPATH=. python benchmarks/rtx_gpu_build.py [--blocks 1500] [--journal-dir DIR]

It needs ``tensorrt_rtx`` (``pip install 'trt-otel[tensorrt-rtx]'``) and, for GPU samples,
``nvidia-ml-py``. Without a GPU it still builds (TensorRT-RTX builds ahead of time on the CPU),
and says that sampling and deserializing were not possible, and why.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trt_otel import BuildMonitor, JournalWriter
from trt_otel.builder.build import run_build
from trt_otel.builder.onnx_models import conv_net_bytes, demo_model_bytes, residual_net_bytes
from trt_otel.builder.options import BuildOptions
from trt_otel.capture.gpu import GpuSampler, open_reader
from trt_otel.core.events import GpuSample, LogMessage, PhaseFinished, PhaseStarted, StepCompleted

Shape = tuple[int, ...]


@dataclass
class Report:
    name: str
    seconds: float = 0.0
    outcome: str = ""
    engine_bytes: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    """Total seconds per phase name."""
    longest_silence_s: float = 0.0
    silent_phase: str = ""
    gpu_samples: int = 0
    peak_memory_mib: float | None = None
    peak_utilization: float | None = None
    deserialized: str = ""


def models(blocks: int) -> list[tuple[str, bytes, dict[str, tuple[Shape, Shape, Shape]]]]:
    conv = ((1, 8, 16, 16), (2, 8, 16, 16), (4, 8, 16, 16))
    residual = ((1, 8, 32, 32), (4, 8, 32, 32), (8, 8, 32, 32))
    mnist = ((1, 1, 28, 28), (4, 1, 28, 28), (8, 1, 28, 28))
    return [
        ("mnist-like", demo_model_bytes(), {"input": mnist}),
        ("conv8", conv_net_bytes(8), {"input": conv}),
        ("residual100", residual_net_bytes(100), {"input": residual}),
        (f"residual{blocks}", residual_net_bytes(blocks), {"input": residual}),
    ]


def build_one(
    rtx: Any, name: str, model: bytes, shapes: dict[str, Any], journal_dir: Path | None
) -> Report:
    report = Report(name)
    monitor = BuildMonitor(backend=rtx, attributes={"trt.backend": "tensorrt-rtx",
                                                    "trt.version": rtx.__version__})  # fmt: skip
    if journal_dir is not None:
        monitor.log.follow(JournalWriter(journal_dir / f"{name}.jsonl"))
    reader, line = open_reader()
    print(f"{name}: {line}", file=sys.stderr)
    sampler = GpuSampler(monitor, reader, interval_s=0.2) if reader is not None else None
    began = time.monotonic()
    if sampler is not None:
        sampler.start()
    with tempfile.TemporaryDirectory() as directory:
        engine_path = Path(directory) / f"{name}.engine"
        try:
            result = run_build(
                rtx, Path(f"{name}.onnx"), model, monitor, engine_path=engine_path,
                options=BuildOptions(shapes=shapes),
            )  # fmt: skip
        finally:
            if sampler is not None:
                sampler.stop()
        serialized = engine_path.read_bytes() if engine_path.exists() else None
    report.seconds = time.monotonic() - began
    report.outcome = result.outcome.value
    events = monitor.log.recent()
    monitor.close()
    _phase_times(report, events)
    report.engine_bytes = len(serialized or b"")
    report.deserialized = _deserialize(rtx, serialized) if serialized else "no engine"
    failures = [e.message for e in events if isinstance(e, LogMessage) and e.severity == "ERROR"]
    if failures:
        print(f"{name}: builder errors: {failures[:3]}", file=sys.stderr)
    return report


def _phase_times(report: Report, events: list[Any]) -> None:
    open_at: dict[str, int] = {}
    totals: dict[str, float] = defaultdict(float)
    last_ns: int | None = None
    innermost: list[str] = []
    for event in events:
        if isinstance(event, PhaseStarted | StepCompleted | PhaseFinished):
            if last_ns is not None and (event.mono_ns - last_ns) / 1e9 > report.longest_silence_s:
                report.longest_silence_s = (event.mono_ns - last_ns) / 1e9
                report.silent_phase = innermost[-1] if innermost else "-"
            last_ns = event.mono_ns
        if isinstance(event, PhaseStarted):
            open_at[event.name] = event.mono_ns
            innermost.append(event.name)
        elif isinstance(event, PhaseFinished) and event.name in open_at:
            totals[event.name] += (event.mono_ns - open_at.pop(event.name)) / 1e9
            if event.name in innermost:
                innermost.remove(event.name)
        elif isinstance(event, GpuSample):
            report.gpu_samples += 1
            if event.memory_used_bytes is not None:
                used = event.memory_used_bytes / 2**20
                report.peak_memory_mib = max(report.peak_memory_mib or 0.0, used)
            if event.utilization is not None:
                report.peak_utilization = max(report.peak_utilization or 0.0, event.utilization)
    report.phases = dict(totals)


def _deserialize(rtx: Any, engine: bytes) -> str:
    messages: list[str] = []

    class Capture(rtx.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            rtx.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            messages.append(msg)

    try:
        runtime = rtx.Runtime(Capture())
        deserialized = runtime.deserialize_cuda_engine(engine)
    except Exception as error:
        return f"failed: {type(error).__name__}: {error}"
    if deserialized is None:
        return "failed: " + (messages[-1] if messages else "no engine, no message")[:200]
    return f"ok ({deserialized.num_io_tensors} I/O tensors)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--blocks", type=int, default=1500, help="residual blocks of the large model"
    )
    parser.add_argument("--journal-dir", type=Path, help="write each build's journal here")
    args = parser.parse_args(argv)
    try:
        import tensorrt_rtx as rtx
    except ImportError as error:
        print(f"needs tensorrt_rtx ({error}): pip install 'trt-otel[tensorrt-rtx]'")
        return 2
    if args.journal_dir is not None:
        args.journal_dir.mkdir(parents=True, exist_ok=True)
    print(f"TensorRT-RTX {rtx.__version__}")
    reports = [build_one(rtx, *spec, args.journal_dir) for spec in models(args.blocks)]
    for report in reports:
        phases = ", ".join(f"{n} {s:.2f}s" for n, s in sorted(report.phases.items(),
                                                              key=lambda i: -i[1])[:4])  # fmt: skip
        gpu = (
            f"{report.gpu_samples} GPU samples, peak {report.peak_memory_mib or 0:.0f} MiB, "
            f"peak util {report.peak_utilization or 0:.0%}"
            if report.gpu_samples
            else "no GPU samples"
        )
        print(
            f"{report.name}: {report.outcome} in {report.seconds:.2f}s, engine "
            f"{report.engine_bytes:,} bytes; longest silence {report.longest_silence_s:.2f}s "
            f"in {report.silent_phase!r}; {gpu}; deserialize: {report.deserialized}\n"
            f"  slowest phases: {phases}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
