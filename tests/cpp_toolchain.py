"""Where the C++ monitor's builds find NVIDIA's headers: TensorRT's (beside the project, in
``../shared/third_party``) and CUDA's runtime (the dev extra's nvidia-cuda-runtime wheel), and
the TensorRT-RTX libraries the C++ example links (the dev extra's tensorrt-rtx-cu12-libs
wheel). For the C++ tests and the C++ benchmarks alike; and, for the tests, what a missing
toolchain is and how the test driver (``cpp/tests/driver.cpp``) is compiled."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TENSORRT_INCLUDE = REPO_ROOT.parent / "shared" / "third_party" / "tensorrt-11.1" / "include"
CPP = REPO_ROOT / "cpp"
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-Wshadow", "-Wpedantic"]
"""The warnings every C++ unit of the tests is compiled with (as errors)."""
DRIVER_VARIANTS = {
    "plain": ["-O1"],
    "asan": ["-O0", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"],
    "tsan": ["-O0", "-fsanitize=thread"],
}
"""The test driver's variants: their optimization and sanitizer flags. The sanitized ones are
not optimized: the sanitizers check every access either way (unoptimized, none is folded away),
and g++ takes a quarter of the time (ASan and UBSan at -O1: 12 s of a run's CPU here, at -O0:
3.6 s). The plain variant is optimized for the warnings that only optimization finds
(``-Wmaybe-uninitialized``)."""


def cuda_include() -> Path | None:
    """``nvidia/cu13/include`` of the nvidia-cuda-runtime wheel (cuda_runtime_api.h)."""
    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cu13" / "include"
        if (candidate / "cuda_runtime_api.h").is_file():
            return candidate
    return None


def missing_toolchain() -> str | None:
    """Why the C++ monitor cannot be compiled here (no g++, no TensorRT or CUDA headers), or
    None where it can."""
    if shutil.which("g++") is None:
        return "g++ is not installed (.ci/run installs it)"
    if not (TENSORRT_INCLUDE / "NvInfer.h").is_file():
        return (
            f"NVIDIA's TensorRT headers are not at {TENSORRT_INCLUDE} (a clone outside the project)"
        )
    if cuda_include() is None:
        return (
            "no nvidia/cu13/include: install the dev extra (nvidia-cuda-runtime, nvidia-cuda-crt)"
        )
    return None


def include_flags() -> list[str]:
    """NVIDIA's headers as system headers, the monitor's own (``cpp/include``) as the unit's."""
    return [
        "-isystem",
        str(TENSORRT_INCLUDE),
        "-isystem",
        str(cuda_include()),
        f"-I{CPP / 'include'}",
    ]


CCACHE = shutil.which("ccache")
"""ccache, where it is installed (.ci/run installs it): a unit whose sources and flags did not
change since an earlier run is not compiled again (the sanitized ones take seconds each)."""


def compiler_environment() -> dict[str, str]:
    """The environment of a compile: ccache keys a ``-g`` build on its sources and flags, not
    on the folder it runs in (each test's is new)."""
    return {**os.environ, "CCACHE_NOHASHDIR": "1"}


def cmake_launcher() -> list[str]:
    """CMake's options that compile through ccache, where it is installed."""
    return [f"-DCMAKE_CXX_COMPILER_LAUNCHER={CCACHE}"] if CCACHE else []


def build_program(source: Path, binary: Path, flags: Sequence[str]) -> Path:
    """``source`` compiled with ``flags`` (through ccache, which caches compiles, not links)
    and linked into ``binary``; a compiler's complaint fails the test with its message. The
    compile runs in the source's folder and names it by its name alone: a source a test wrote
    into a folder of its own is then the same unit to ccache from run to run."""
    unit = binary.with_name(f"{binary.name}.o")
    compiler = [CCACHE, "g++"] if CCACHE else ["g++"]
    toolchain_step(
        [*compiler, "-std=c++17", *flags, "-c", source.name, "-o", str(unit)], cwd=source.parent
    )
    toolchain_step(["g++", *flags, str(unit), "-o", str(binary), "-pthread"])
    return binary


def toolchain_step(
    command: Sequence[str], *, cwd: Path | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """One step of a build (a compile, a link, ``cmake``) in the compilers' environment; a
    failure fails the test with what the tool said."""
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=cwd,
        env=compiler_environment(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def compile_driver(variant: str, directory: Path) -> Path:
    """The test driver, compiled in ``directory`` as one of :data:`DRIVER_VARIANTS`."""
    flags = ["-g", *WARNINGS, *DRIVER_VARIANTS[variant], *include_flags()]
    return build_program(CPP / "tests" / "driver.cpp", directory / f"driver-{variant}", flags)


def rtx_library_dir() -> Path | None:
    """The TensorRT-RTX libraries' wheel folder (``tensorrt_rtx_libs``: libtensorrt_rtx.so.1
    and libtensorrt_onnxparser_rtx.so.1), found without importing it (importing loads them)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    names = ("libtensorrt_rtx.so.1", "libtensorrt_onnxparser_rtx.so.1")
    return folder if all((folder / name).is_file() for name in names) else None


def header_version() -> str:
    """``MAJOR.MINOR.PATCH.BUILD`` of the TensorRT headers, read from NvInferVersion.h."""
    text = (TENSORRT_INCLUDE / "NvInferVersion.h").read_text(encoding="utf-8")
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH", "BUILD"):
        match = re.search(rf"#define TRT_{part}_ENTERPRISE (\d+)", text)
        assert match is not None, f"no TRT_{part}_ENTERPRISE in NvInferVersion.h"
        parts.append(match.group(1))
    return ".".join(parts)


def built_once(make: Callable[[str, Path], Path], directory: Path) -> Callable[[str], Path]:
    """Each variant (plain, a sanitizer) made by ``make`` once, when first asked for."""
    built: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in built:
            built[variant] = make(variant, directory)
        return built[variant]

    return get
