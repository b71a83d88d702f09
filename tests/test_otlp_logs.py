"""TensorRT's messages as OpenTelemetry log records, each in the trace and span of the phase it came
in: from a real TensorRT-RTX build and from the simulator, decoded from the OTLP wire by a real
receiver, and exported again, identical, by ``replay``."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from opentelemetry._logs import SeverityNumber

from cli import CLI
from otlp_receiver import OtlpReceiver, ReceivedLog
from prometheus_server import free_port
from rtx_builds import import_rtx, write_conv
from trt_otel import BuildMonitor
from trt_otel.app.cli import main
from trt_otel.builder.onnx_models import CONV_SHAPES
from trt_otel.core.events import BuildStarted, LogMessage, PhaseFinished, PhaseStarted
from trt_otel.core.journal_reader import read_journal
from trt_otel.views.otlp_logs import SEVERITY_NUMBERS, LogProjection
from trt_otel.views.spans import SpanProjection
from trt_otel.views.trace_ids import phase_span_id


def open_phase_at_each_message(journal: Path) -> list[tuple[str, str, str | None, int | None]]:
    """(severity, message, innermost open phase, its id) for each log event, read from the
    journal by a walk of its own."""
    open_phases: dict[str, int] = {}
    found: list[tuple[str, str, str | None, int | None]] = []
    for event in read_journal(journal).events:
        if isinstance(event, PhaseStarted):
            open_phases[event.name] = event.seq
        elif isinstance(event, PhaseFinished):
            open_phases.pop(event.name, None)
        elif isinstance(event, LogMessage):
            if open_phases:
                name, seq = max(open_phases.items(), key=lambda item: item[1])
                found.append((event.severity, event.message, name, seq))
            else:
                found.append((event.severity, event.message, None, None))
    return found


def build_id_of(journal: Path) -> str:
    start = next(e for e in read_journal(journal).events if isinstance(e, BuildStarted))
    return start.build_id


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_builds_messages_are_log_records_in_their_phases_spans(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    import_rtx()
    model = write_conv(tmp_path / "conv.onnx")
    journal = tmp_path / "conv.jsonl"
    built = subprocess.run(
        [*CLI, "build", str(model), "-o", str(tmp_path / "conv.engine"), "--shapes", CONV_SHAPES,
         "--journal", str(journal), "--no-progress", "--no-gpu", "--otlp-protocol", "grpc",
         "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}", "--otlp-logs-level", "info"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    expected = open_phase_at_each_message(journal)
    assert len(expected) > 10 and any(phase for _, _, phase, _ in expected)
    records = receiver.wait_for_logs(len(expected))
    phases = sum(isinstance(e, PhaseStarted) for e in read_journal(journal).events)
    spans = receiver.wait_for_final(phases + 1)
    assert [(r.severity_text, r.body) for r in records] == [(s, m) for s, m, _, _ in expected]

    build_id = build_id_of(journal)
    spans_by_id = {s.span_id: s for s in spans}
    (build_span,) = [s for s in spans if not s.parent_span_id]
    for record, (_, _, phase, _) in zip(records, expected, strict=True):
        assert record.trace_id == build_id, "the build's trace"
        span = spans_by_id[record.span_id]  # a span that was exported
        assert span.name == (phase or build_span.name)
        assert record.attributes.get("trt.phase.name") == phase
        assert span.start_ns <= record.time_ns <= span.end_ns, "inside its span"
        assert record.severity_number == SeverityNumber.INFO.value
        assert record.event_name == "trt.log"
    assert {tuple(sorted(r.resource.items())) for r in records} == {
        tuple(sorted(build_span.resource.items()))
    }, "the spans' resource"
    assert build_span.events == (), "no span events: the messages are log records"


def exported_records(receiver: OtlpReceiver, count: int) -> list[ReceivedLog]:
    records = receiver.wait_for_logs(count)
    return sorted(records, key=lambda r: (r.time_ns, r.body))


@pytest.mark.e2e
def test_by_default_warnings_and_worse_arrive_and_replay_sends_the_same(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    journal = tmp_path / "cancelled.jsonl"
    url = f"http://127.0.0.1:{receiver.http_port}"
    cancelled = subprocess.run(
        [*CLI, "demo", "--no-progress", "--speed", "0", "--silence", "2s", "--timeout", "1s",
         "--journal", str(journal), "--otlp-endpoint", url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert cancelled.returncode == 3, cancelled.stderr
    messages = [e for e in read_journal(journal).events if isinstance(e, LogMessage)]
    worse = [e for e in messages if e.severity.lower() in ("error", "internal_error", "warning")]
    assert worse, "TensorRT says the build was cancelled"
    assert len(worse) < len(messages), "and info besides"
    # TensorRT's warnings and errors, and trt-otel's note of the cancel.
    live = exported_records(receiver, len(worse) + 1)
    assert sorted(r.body for r in live if r.event_name == "trt.log") == sorted(
        e.message for e in worse
    ), "info is left out"
    (cancel,) = [r for r in live if r.event_name == "trt.cancel"]
    assert cancel.severity_number == SeverityNumber.WARN.value, cancel
    assert "timeout" in cancel.body, cancel.body
    assert all(r.trace_id == build_id_of(journal) for r in live)
    assert all(r.severity_number == SEVERITY_NUMBERS[r.severity_text.lower()].value for r in live)

    receiver.clear_all()
    assert main(["replay", str(journal), "--otlp-endpoint", url]) == 3
    replayed = exported_records(receiver, len(live))
    assert [(r.trace_id, r.span_id, r.time_ns, r.body, r.severity_number) for r in replayed] == [
        (r.trace_id, r.span_id, r.time_ns, r.body, r.severity_number) for r in live
    ]


def test_a_phase_with_a_warning_is_never_folded_so_its_record_has_a_span() -> None:
    monitor = BuildMonitor()
    monitor.start()
    for index in range(6):  # short leaves, over a budget of 3: folded
        monitor.phase_start(f"leaf {index}", None, 1)
        if index == 4:
            monitor.log_message("WARNING", "weights are FP32")
        monitor.phase_finish(f"leaf {index}")
    monitor.end()
    events = list(monitor.log.recent())
    spans = SpanProjection(span_budget=3, keep_logged_from="warning")
    names = [s.name for e in events for s in spans.apply(e)]
    assert "leaf 4" in names and "leaf 5" not in names, "folded, except where a warning came"
    logs = LogProjection("warning")
    (record,) = [r for e in events if (r := logs.apply(e)) is not None]
    leaf = next(e for e in events if isinstance(e, PhaseStarted) and e.name == "leaf 4")
    assert record.span_id == phase_span_id(record.trace_id, monitor.build_id, leaf.seq)
    unkept = SpanProjection(span_budget=3)
    assert "leaf 4" not in [s.name for e in events for s in unkept.apply(e)]


def test_a_log_without_its_start_has_its_records_in_the_trace_its_spans_are_in() -> None:
    """A journal whose ``build_start`` is missing (cut, or its writer killed early): the span
    projection names its build after the first event, and so do the log records."""
    monitor = BuildMonitor()
    monitor.start()
    monitor.phase_start("Building engine", None, 2)
    monitor.log_message("WARNING", "weights are FP32")
    monitor.phase_finish("Building engine")
    monitor.end()
    events = [e for e in monitor.log.recent() if not isinstance(e, BuildStarted)]
    spans = SpanProjection()
    (span,) = [s for e in events for s in spans.apply(e) if s.name == "Building engine"]
    logs = LogProjection("warning")
    (record,) = [r for e in events if (r := logs.apply(e)) is not None]
    assert (record.trace_id, record.span_id) == (span.trace_id, span.span_id)


@pytest.mark.parametrize(
    ("severity", "number"),
    [
        ("INTERNAL_ERROR", SeverityNumber.FATAL),
        ("ERROR", SeverityNumber.ERROR),
        ("WARNING", SeverityNumber.WARN),
        ("INFO", SeverityNumber.INFO),
        ("VERBOSE", SeverityNumber.DEBUG),
    ],
)
def test_tensorrts_severities_map_to_opentelemetrys(severity: str, number: Any) -> None:
    monitor = BuildMonitor()
    monitor.start()
    monitor.log_message(severity, "a message")
    projection = LogProjection("verbose")
    (record,) = [r for e in monitor.log.recent() if (r := projection.apply(e)) is not None]
    assert record.severity_number == number and record.severity == severity
    quiet = LogProjection("warning")
    kept = [r for e in monitor.log.recent() if (r := quiet.apply(e)) is not None]
    assert bool(kept) == (number.value >= SeverityNumber.WARN.value)


@pytest.mark.e2e
def test_trt_otels_own_warnings_are_records_in_the_builds_span(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    dead = free_port()  # a Pushgateway that is not there: its warning comes at the end
    journal = tmp_path / "demo.jsonl"
    result = subprocess.run(
        [*CLI, "demo", "--no-progress", "--speed", "0", "--journal", str(journal),
         "--pushgateway", f"http://127.0.0.1:{dead}",
         "--otlp-endpoint", f"http://127.0.0.1:{receiver.grpc_port}", "--otlp-protocol", "grpc"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "cannot push metrics" in result.stderr
    records = receiver.wait_for_logs(1)
    (warning,) = [r for r in records if r.event_name == "trt_otel.warning"]
    assert "cannot push metrics" in warning.body
    assert warning.severity_number == SeverityNumber.WARN.value
    build_id = build_id_of(journal)
    (build_span,) = [s for s in receiver.wait_for(2) if not s.parent_span_id]
    assert (warning.trace_id, warning.span_id) == (build_id, build_span.span_id)


def test_each_signal_has_its_path_and_its_own_variables() -> None:
    from trt_otel.app.config import SpanConfig
    from trt_otel.views.otlp_settings import HTTP_PROTOBUF, LOGS, METRICS, TRACES

    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    endpoints = {
        signal: SpanConfig(metrics=True).settings(base, signal)
        for signal in (TRACES, LOGS, METRICS)
    }
    assert {s: (v.endpoint, v.protocol) for s, v in endpoints.items() if v is not None} == {
        TRACES: ("http://collector:4318/v1/traces", HTTP_PROTOBUF),
        LOGS: ("http://collector:4318/v1/logs", HTTP_PROTOBUF),
        METRICS: ("http://collector:4318/v1/metrics", HTTP_PROTOBUF),
    }
    own = {**base, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://loki:3100/otlp/v1/logs"}
    logs = SpanConfig().settings(own, LOGS)
    assert logs is not None and logs.endpoint == "http://loki:3100/otlp/v1/logs"
    assert SpanConfig().settings({**base, "OTEL_LOGS_EXPORTER": "none"}, LOGS) is None
    assert SpanConfig().settings(base, METRICS) is None, "metrics only with --otlp-metrics"
    # Without log records, the span projection keeps TensorRT's warnings as span events.
    quiet = SpanConfig(logs_level=None)
    traces = quiet.settings(base, TRACES)
    assert quiet.settings(base, LOGS) is None and traces is not None
    assert traces.logs_level is None
    spans = SpanConfig().settings(base, TRACES)
    assert spans is not None and spans.logs_level == "warning"


def test_a_severity_tensorrt_does_not_name_is_kept_or_left_out_as_info() -> None:
    """A message whose severity is none of TensorRT's (a program's own logger's ``NOTICE``)
    ranks as info: a record at the level ``info``, none at ``warning``."""
    monitor = BuildMonitor()
    monitor.start()
    monitor.log_message("NOTICE", "a message")
    events = list(monitor.log.recent())
    at_info = LogProjection("info")
    (record,) = [r for e in events if (r := at_info.apply(e)) is not None]
    assert (record.severity, record.severity_number) == ("NOTICE", SeverityNumber.INFO)
    at_warning = LogProjection("warning")
    assert all(at_warning.apply(e) is None for e in events)
