"""Where the C++ monitor's builds find NVIDIA's headers: TensorRT's (beside the project, in
``../shared/third_party``) and CUDA's runtime (the dev extra's nvidia-cuda-runtime wheel). For
the C++ tests and the C++ benchmark alike."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TENSORRT_INCLUDE = REPO_ROOT.parent / "shared" / "third_party" / "tensorrt-11.1" / "include"


def cuda_include() -> Path | None:
    """``nvidia/cu13/include`` of the nvidia-cuda-runtime wheel (cuda_runtime_api.h)."""
    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cu13" / "include"
        if (candidate / "cuda_runtime_api.h").is_file():
            return candidate
    return None
