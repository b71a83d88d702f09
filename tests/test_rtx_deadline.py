"""Deadlines on TensorRT-RTX's real builder: a build whose history says it cannot make its deadline
costs nothing (refused, with the projection in its reason), and one that can is built.

The history is a real build's journal, and copies of it with its times stretched: the same
build on a slower machine. Skipped only where ``tensorrt_rtx`` does not import, with the reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli import run_cli
from rtx_builds import import_rtx, write_conv
from trt_otel import read_journal
from trt_otel.builder.onnx_models import CONV_SHAPES
from trt_otel.core.events import BuildFinished, CancelRequested, PhaseStarted

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def build(model: Path, directory: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "build", model, "-o", directory / "conv.engine", "--no-progress", "--no-gpu",
        "--shapes", CONV_SHAPES, "--journal", directory / "build.jsonl", *options, timeout=300,
    )  # fmt: skip


def stretched(journal: Path, factor: float, into: Path) -> Path:
    """``journal``'s build as if it had run ``factor`` times slower."""
    lines, first = [], None
    for line in journal.read_text().splitlines():
        record = json.loads(line)
        if "mono_ns" in record:
            first = first or (record["mono_ns"], record["wall_ns"])
            for key, origin in (("mono_ns", first[0]), ("wall_ns", first[1])):
                record[key] = origin + round((record[key] - origin) * factor)
        lines.append(json.dumps(record))
    into.write_text("\n".join(lines) + "\n")
    return into


def test_a_real_build_its_history_says_cannot_fit_is_refused_and_one_that_can_is_built(
    tmp_path: Path,
) -> None:
    import_rtx()
    model = write_conv(tmp_path / "conv.onnx")
    first = tmp_path / "first"
    first.mkdir()
    done = build(model, first)
    assert done.returncode == 0, done.stderr
    real = first / "build.jsonl"
    events = read_journal(real).events
    end = next(e for e in events if isinstance(e, BuildFinished))
    took_s = (end.mono_ns - events[0].mono_ns) / 1e9

    slower = tmp_path / "slower"
    slower.mkdir()
    for factor in (20, 25, 30):
        stretched(real, factor, slower / f"x{factor}.jsonl")
    deadline_s = took_s * 5  # the real build would fit; its history says it cannot
    refused_dir = tmp_path / "refused"
    refused_dir.mkdir()
    refused = build(model, refused_dir, "--history", str(slower), "--deadline", f"{deadline_s}s")
    assert refused.returncode == 3, refused.stderr
    assert "history: 3 earlier builds of this model" in refused.stderr
    assert "(3 earlier builds: " in refused.stderr
    assert "deadline; not started" in refused.stderr
    assert not (refused_dir / "conv.engine").exists()
    events = read_journal(refused_dir / "build.jsonl").events
    assert not any(isinstance(e, PhaseStarted) for e in events), "the builder never ran"
    cancel = next(e for e in events if isinstance(e, CancelRequested))
    assert cancel.source == "deadline" and cancel.reason.startswith("expected to end at ")

    # Its own real history says it fits: built, not cancelled.
    fits = tmp_path / "fits"
    fits.mkdir()
    built = build(model, fits, "--history", str(first), "--deadline", "5m")
    assert built.returncode == 0, built.stderr
    assert (fits / "conv.engine").stat().st_size > 0
    assert not any(
        isinstance(e, CancelRequested) for e in read_journal(fits / "build.jsonl").events
    )
