"""The cancel sources: one enum in ``core``, the plain strings of the journal and ``/status``.

The kinds of decider (``timeout``, ``memory``, ``signal``, ...) are a metric's bounded label
values, a retry ladder's test and what a journal records. They are :class:`CancelSource`'s
members wherever the package names one, and the wire stays the strings it always was: a journal
written before the enum reads the same, and one written now holds no enum.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import msgspec
import pytest
from prometheus_client import generate_latest

from trt_otel import BuildMonitor, ManualClock, read_journal
from trt_otel.control import registry
from trt_otel.core.events import CancelRequested, CancelSource
from trt_otel.core.journal import JournalWriter
from trt_otel.core.journal_codec import decode_event, encode_event
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.prometheus import CANCEL_REASONS, MetricSources, metrics_registry
from trt_otel.views.status import status_document

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trt_otel"
RECORDED = REPO / "tests" / "data" / "rtx-residual400-cancelled.jsonl"
CPP_MONITOR = REPO / "cpp" / "include" / "trt_otel" / "progress_monitor.h"


def test_the_sources_are_the_strings_they_always_were() -> None:
    # Dashboards, journals on disk and the C++ monitor know these strings.
    assert [s.value for s in CancelSource][:8] == [
        "timeout", "deadline", "stall", "memory", "file", "http", "signal", "user"
    ]  # fmt: skip
    assert CancelSource("memory") is CancelSource.MEMORY and f"{CancelSource.MEMORY}" == "memory"


def test_a_cancel_named_by_the_enum_is_journaled_and_read_back_as_a_plain_string(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "build.jsonl"
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(journal))
    monitor.start()
    assert monitor.cancel("over the limit", source=CancelSource.MEMORY)
    live = monitor.state.cancel
    assert live is not None and type(live.source) is str and live.source == "memory"
    monitor.end()
    monitor.close()
    (line,) = [line for line in journal.read_text().splitlines() if '"type":"cancel"' in line]
    assert json.loads(line)["source"] == "memory"
    (read,) = [e for e in read_journal(journal).events if isinstance(e, CancelRequested)]
    assert type(read.source) is str and CancelSource(read.source) is CancelSource.MEMORY
    assert read == live


def test_a_journal_written_before_the_enum_reads_its_source_as_it_was() -> None:
    (cancel,) = [e for e in read_journal(RECORDED).events if isinstance(e, CancelRequested)]
    assert cancel.source == "file" and CancelSource(cancel.source) is CancelSource.FILE
    # A source no member names (a program's own monitor, an older writer) reads as it is.
    other = CancelRequested(
        seq=3, wall_ns=cancel.wall_ns, mono_ns=cancel.mono_ns, thread="t", reason="why",
        source="made-up",
    )  # fmt: skip
    assert decode_event(encode_event(other)) == other


def test_status_and_metrics_show_the_plain_string() -> None:
    clock = ManualClock()
    monitor = BuildMonitor(clock=clock)
    monitor.start()
    monitor.cancel("no progress", source=CancelSource.STALL)
    model = ReadModel()
    model.handle(monitor.log.recent())
    now = clock.mono_ns()
    document = status_document(model, model.estimate_locked(now), now)
    assert json.loads(msgspec.json.encode(document))["cancel"]["source"] == "stall"
    text = generate_latest(metrics_registry(MetricSources(monitor))).decode()
    assert 'trt_build_cancellations_total{reason="stall"} 1.0' in text
    for reason in CANCEL_REASONS:
        assert f'trt_build_cancellations_total{{reason="{reason}"}}' in text


def test_the_metrics_label_set_is_every_source() -> None:
    assert tuple(s.value for s in CancelSource) == CANCEL_REASONS
    assert all(type(reason) is str for reason in CANCEL_REASONS)


# -- no source outside the enum ------------------------------------------------------------------


def _source_literals(code: str, name: str) -> list[str]:
    """Every cancel source ``code`` writes as a string literal: a ``source=`` argument, a
    ``source`` class attribute, a ``Decision``'s second argument, a ``cancel_all``'s second."""
    found = []
    for node in ast.walk(ast.parse(code)):
        values: list[ast.expr] = []
        if isinstance(node, ast.Call):
            values += [k.value for k in node.keywords if k.arg == "source"]
            function = node.func
            called: str | None = None
            if isinstance(function, ast.Attribute):
                called = function.attr
            elif isinstance(function, ast.Name):
                called = function.id
            if called in ("Decision", "cancel_all") and len(node.args) > 1:
                values.append(node.args[1])
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(t, ast.Name) and t.id in ("source", "PROGRAM_SOURCE") for t in targets
            ):
                values += [node.value] if node.value is not None else []
        for value in values:
            for inner in ast.walk(value):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                    found.append(f"{name}:{inner.lineno}: {inner.value!r}")
    return found


def test_the_package_names_every_source_by_the_enum_not_by_a_string() -> None:
    """A source written as a string could be one the metrics, the ladder and the docs do not
    know ("memroy"): every one is a :class:`CancelSource` member instead."""
    literals = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        for hit in _source_literals(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert literals == []


@pytest.mark.parametrize(
    "code",
    [
        'monitor.cancel("why", source="memroy")',
        'Decision("why", "stal")',
        'class Guard(Policy):\n    source = "gpu"',
        'builds.cancel_all("why", "signal")',
    ],
)
def test_the_scan_finds_a_source_written_as_a_string(code: str) -> None:
    assert len(_source_literals(code, "example.py")) == 1


def test_the_cpp_monitor_records_every_source_watch_may_send_it() -> None:
    """``trt-otel watch`` cancels a C++ build through its control file, naming the source; the
    C++ monitor keeps a source it knows and records any other as ``file``. It must know every
    source of the registered policies, ``POST /cancel``'s and a signal's, or a memory limit
    decided by watch would be recorded (and counted, and not retried) as a cancel file."""
    text = CPP_MONITOR.read_text(encoding="utf-8")
    (listed,) = re.findall(r"kSources\[\] = \{([^}]*)\}", text)
    known = set(re.findall(r'"([^"]+)"', listed))
    sent = {entry.source.value for entry in registry.policies()}
    sent |= {CancelSource.HTTP, CancelSource.SIGNAL, CancelSource.USER}
    assert sorted(sent - known) == []
    assert sorted(known - {s.value for s in CancelSource}) == []
