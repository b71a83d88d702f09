"""Every capture mode enters the log the same way: each callback, wherever it was made, is one
record taken by ``BuildMonitor._take_locked`` (checked against the protocol once, stamped with
its own time and thread). A new capture mode is one recorder that makes such records and one
call of :meth:`BuildMonitor.record`.

Each test counts the records taken while one capture mode runs a build, and holds that every
callback event in the build's journal came through them. The C++ monitor only records: its
callbacks are taken when trt-otel reads its journal (replay, watch, report...), so its test
counts the records taken while the journal is read.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cpp_toolchain import compile_driver, missing_toolchain
from runs import PROGRAMS
from trt_otel.app.cli import main
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.journal_reader import read_journal

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
CALLBACK_EVENTS = {"phase_start": "phase_start", "step": "step", "phase_finish": "phase_finish"}
"""A taken record's kind, and the journal event type it becomes."""


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """The kinds of the records ``_take_locked`` took, in this process."""
    counts: Counter[str] = Counter()
    original = BuildMonitor._take_locked

    def counting(self: BuildMonitor, record: tuple[Any, ...]) -> BaseException | None:
        counts[str(record[0])] += 1
        return original(self, record)

    monkeypatch.setattr(BuildMonitor, "_take_locked", counting)
    yield counts


def assert_every_callback_was_taken(journal: Path, taken: Counter[str]) -> None:
    events = Counter(event.type for event in read_journal(journal).events)
    assert events["step"] > 0, "the build made callbacks"
    for kind, event_type in CALLBACK_EVENTS.items():
        assert taken[kind] == events[event_type], (kind, taken, events)


@pytest.mark.parametrize("where", ["--in-process", pytest.param("worker", marks=pytest.mark.e2e)])
def test_a_simulated_build_in_process_and_in_its_worker(
    where: str, taken: Counter[str], tmp_path: Path
) -> None:
    journal = tmp_path / "demo.jsonl"
    options = [where] if where != "worker" else []
    code = main(["demo", "--speed", "0", "--no-progress", "--journal", str(journal), *options])
    assert code == 0
    assert_every_callback_was_taken(journal, taken)


@pytest.mark.e2e
def test_a_recorded_trace(taken: Counter[str], tmp_path: Path) -> None:
    traces = sorted(TRACES.glob("*.jsonl"))
    if not traces:
        pytest.skip(f"no recorded TensorRT traces in {TRACES} (a clone without ../shared)")
    journal = tmp_path / "trace.jsonl"
    code = main(
        [
            "demo",
            "--trace",
            str(traces[0]),
            "--speed",
            "0",
            "--no-progress",
            "--journal",
            str(journal),
        ]
    )
    assert code == 0
    assert_every_callback_was_taken(journal, taken)


@pytest.mark.e2e
def test_a_program_that_trt_otel_run_instruments(taken: Counter[str], tmp_path: Path) -> None:
    pytest.importorskip("tensorrt_rtx", reason="the program builds with TensorRT-RTX")
    model, journal = tmp_path / "mnist.onnx", tmp_path / "run.jsonl"
    model.write_bytes(demo_model_bytes())
    program = [sys.executable, str(PROGRAMS / "plain_build.py"), str(model)]
    code = main(["run", "--journal", str(journal), "--no-progress", "--", *program])
    assert code == 0
    assert_every_callback_was_taken(journal, taken)


@pytest.mark.e2e
def test_a_cpp_build_read_back(taken: Counter[str], tmp_path: Path) -> None:
    if missing_toolchain() is not None:
        pytest.skip(str(missing_toolchain()))
    traces = sorted(TRACES.glob("*.jsonl"))
    if not traces:
        pytest.skip(f"no recorded TensorRT traces in {TRACES} (a clone without ../shared)")
    driver = compile_driver("plain", tmp_path)
    journal = tmp_path / "cpp.jsonl"
    subprocess.run(
        [str(driver), "trace", f"trace={traces[0]}", f"journal={journal}"],
        stdout=subprocess.DEVNULL,
        timeout=120,
        check=True,
    )
    assert sum(taken.values()) == 0, "the C++ monitor takes nothing itself"
    assert main(["replay", str(journal)]) == 0
    assert_every_callback_was_taken(journal, taken)
