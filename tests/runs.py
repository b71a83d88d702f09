"""``trt-otel run -- PROGRAM`` as the tests drive it: the build scripts of ``tests/programs``
(ordinary programs that never import trt_otel), a deep model for them to build, a run started
in the background, and a run's journal cut into its builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli import start_cli
from trt_otel.builder.onnx_models import residual_net_bytes
from trt_otel.core.events import BuildStarted, Event

PROGRAMS = Path(__file__).parent / "programs"
"""The build scripts that ``trt-otel run`` runs in the tests."""

PYTHON = sys.executable
"""The interpreter the programs run in (the tests', which has TensorRT-RTX where they do)."""


def residual_net(blocks: int, tmp_path: Path) -> Path:
    """``blocks`` residual blocks: TensorRT-RTX spends most of the build of a deep one inside a
    single step of "Determining refit engines", with no callback at all."""
    path = tmp_path / f"residual{blocks}.onnx"
    path.write_bytes(residual_net_bytes(blocks))
    return path


def start_run(
    tmp_path: Path, *args: str, options: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], Path]:
    """``trt-otel run OPTIONS -- python plain_build.py ARGS`` started in its own process group
    (as a terminal's foreground job), its journal in ``tmp_path``; the process and the journal."""
    journal = tmp_path / "run.jsonl"
    process = start_cli(
        "run", "--journal", journal, *options, "--", PYTHON, PROGRAMS / "plain_build.py", *args,
        start_new_session=True,
    )  # fmt: skip
    return process, journal


def builds_in(events: list[Event]) -> list[list[Event]]:
    """The journal cut into builds, each from its build_start to its build_end."""
    builds: list[list[Event]] = []
    for event in events:
        if isinstance(event, BuildStarted):
            builds.append([])
        if builds:
            builds[-1].append(event)
    return builds


def start_of(build: list[Event]) -> BuildStarted:
    """A build's first event, its build_start (one of :func:`builds_in`'s builds)."""
    first = build[0]
    assert isinstance(first, BuildStarted)
    return first
