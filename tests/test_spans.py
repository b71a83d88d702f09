"""Span export against a real OTLP receiver (gRPC and HTTP/protobuf, decoded from the wire)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cli import CLI, MID_BUILD, run_demo
from conftest import ReferencePhase, reference_tree, trace_params
from otlp_receiver import (
    OtlpReceiver,
    ReceivedSpan,
    dead_port,
    hanging_collector,
)
from trt_otel import BuildMonitor, Outcome
from trt_otel.app.cli import main
from trt_otel.builder.simulator import Callback, Driver, generate_plan, load_trace
from trt_otel.core.journal_reader import read_journal
from trt_otel.core.state import BuildState
from trt_otel.views.otlp import OtlpSpanExport, SpanExportQueue
from trt_otel.views.otlp_settings import (
    DEFAULT_REQUEST_TIMEOUT_S,
    GRPC,
    HTTP_PROTOBUF,
    OtlpConfigError,
    OtlpSettings,
)
from trt_otel.views.spans import MAX_SPAN_EVENTS, UNFINISHED, SpanProjection, SpanRecord
from trt_otel.views.trace_ids import (
    TRACEPARENT_ATTRIBUTE,
    PhaseSpanIds,
    parse_traceparent,
    phase_span_id,
)
from waiting import wait_for_text, wait_until

STATUS_ERROR = 2


def endpoint(receiver: OtlpReceiver, protocol: str) -> str:
    port = receiver.grpc_port if protocol == GRPC else receiver.http_port
    return f"http://127.0.0.1:{port}"


DEMO_SPANS = sum(c.kind == "phase_start" for c in generate_plan(13)) + 1
"""The demo's spans: one per phase of its 13-layer model's build, and the build's own."""


@given(
    trace_id=st.integers(min_value=1, max_value=2**128 - 1),
    build_id=st.text(max_size=40),
    phase_ids=st.lists(st.integers(min_value=0, max_value=2**40), max_size=5),
)
def test_a_phase_has_one_span_id_whichever_view_names_it(
    trace_id: int, build_id: str, phase_ids: list[int]
) -> None:
    """The span projection names its spans with the build's part of the hash taken once; the
    log records and the live snapshots name the same spans one at a time."""
    ids = PhaseSpanIds(trace_id, build_id)
    for phase_id in phase_ids:
        assert ids(phase_id) == phase_span_id(trace_id, build_id, phase_id)


def test_the_budget_is_exact_until_the_first_fold() -> None:
    budget = 20
    projection = SpanProjection(span_budget=budget, fold_under_ns=10**12)
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(13))
    monitor.end()
    emitted_before_fold = None
    for event in monitor.log.recent():
        projection.apply(event)
        if projection.folded and emitted_before_fold is None:
            emitted_before_fold = projection.emitted
    assert emitted_before_fold == budget - 1, "the build's own span is the budget's last"
    assert projection.emitted + projection.folded == monitor.state.phases_started_total + 1


def export_to(
    url: str,
    protocol: str,
    warnings: list[str],
    span_budget: int = 10_000,
    fold_under_ns: int = 1_000_000_000,
) -> OtlpSpanExport:
    resolved = OtlpSettings.resolve(
        url, protocol, environ={}, span_budget=span_budget, fold_under_ns=fold_under_ns
    )
    assert resolved is not None
    return OtlpSpanExport(resolved, warn=warnings.append)


def tree_of(spans: list[ReceivedSpan]) -> tuple[ReceivedSpan, dict[str, list[ReceivedSpan]]]:
    """The build's root span and children by parent id (in start order)."""
    children: dict[str, list[ReceivedSpan]] = collections.defaultdict(list)
    for span in sorted(spans, key=lambda s: (s.start_ns, s.span_id)):
        children[span.parent_span_id].append(span)
    (root,) = children[""]
    return root, children


def span_shape(span: ReceivedSpan, children: dict[str, list[ReceivedSpan]]) -> tuple[object, ...]:
    return (
        span.name,
        span.attributes["trt.phase.num_steps"],
        span.attributes["trt.phase.steps_completed"],
        tuple(span_shape(child, children) for child in children[span.span_id]),
    )


def reference_shape(phase: ReferencePhase) -> tuple[object, ...]:
    return (
        phase.name,
        phase.num_steps,
        len(phase.steps),
        tuple(reference_shape(child) for child in phase.children),
    )


def assert_nested(spans: list[ReceivedSpan]) -> None:
    by_id = {span.span_id: span for span in spans}
    assert len(by_id) == len(spans), "span ids are unique"
    for span in spans:
        assert 0 < span.start_ns <= span.end_ns, span.name
        parent = by_id.get(span.parent_span_id)
        if parent is not None:
            assert parent.start_ns <= span.start_ns and span.end_ns <= parent.end_ns, span.name
            assert parent.trace_id == span.trace_id


@pytest.mark.parametrize("protocol", [GRPC, HTTP_PROTOBUF])
@pytest.mark.parametrize("trace", trace_params())
def test_each_recorded_trace_arrives_as_its_phase_tree(
    trace: Path, protocol: str, receiver: OtlpReceiver
) -> None:
    warnings: list[str] = []
    export = export_to(endpoint(receiver, protocol), protocol, warnings)
    monitor = BuildMonitor(attributes={"model.path": "/models/mnist.onnx"})
    monitor.log.follow(export, capacity=1_000_000)
    monitor.start()
    result = Driver(speed=0).run(monitor, load_trace(trace))
    monitor.end_with_result(b"engine" if result.completed else None)
    monitor.close()
    health = export.shutdown(10.0)

    expected = reference_tree(trace)
    phases = sum(1 for _ in _walk(expected))
    spans = receiver.wait_for_final(phases + 1)
    assert (health.exported, health.failed, health.dropped, warnings) == (phases + 1, 0, 0, [])
    assert len(spans) == phases + 1
    root, children = tree_of(spans)
    assert root.name == "BUILD mnist.onnx"
    assert root.trace_id == monitor.build_id, "the build id is the trace id"
    assert root.attributes["cicd.pipeline.result"] == "success"
    assert root.attributes["trt.build.phases_started"] == phases
    assert root.status_code == 0
    assert root.resource["service.name"] == "trt-otel"
    assert [span_shape(s, children) for s in children[root.span_id]] == [
        reference_shape(r) for r in expected
    ]
    assert_nested(spans)
    assert all(s.attributes.get("trt.phase.status", "finished") == "finished" for s in spans)


def _walk(roots: list[ReferencePhase]) -> Iterator[ReferencePhase]:
    stack = list(roots)
    while stack:
        phase = stack.pop()
        yield phase
        stack.extend(phase.children)


FLUSH_TIMEOUT = ("--otlp-flush-timeout", "60s")
"""For a collector that answers: its last spans are sent however loaded the machine (the flush
ends as soon as they are; the default 3 s gave up on the build's own span, sent last, once in a
few dozen runs on a loaded machine). A test of a collector that does not answer gives its own."""


@pytest.mark.e2e
@pytest.mark.parametrize("protocol", [GRPC, HTTP_PROTOBUF])
def test_replay_exports_exactly_the_live_spans(
    tmp_path: Path, protocol: str, receiver: OtlpReceiver
) -> None:
    journal = tmp_path / "build.jsonl"
    url = endpoint(receiver, protocol)
    live = run_demo(
        *FLUSH_TIMEOUT, "--speed", "0", "--journal", str(journal), "--otlp-endpoint", url,
        "--otlp-protocol", protocol,
    )  # fmt: skip
    assert live.returncode == 0, live.stderr
    assert f"spans: {DEMO_SPANS} exported" in live.stderr
    live_spans = receiver.wait_for(DEMO_SPANS)
    receiver.clear()

    replay = subprocess.run(
        [
            *CLI,
            "replay",
            str(journal),
            "--otlp-endpoint",
            url,
            "--otlp-protocol",
            protocol,
            *FLUSH_TIMEOUT,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    replayed = receiver.wait_for(len(live_spans))
    assert comparable(replayed) == comparable(live_spans)
    assert {s.resource["service.instance.id"] for s in replayed + live_spans} == {
        live_spans[0].resource["service.instance.id"],
        replayed[0].resource["service.instance.id"],
    }, "the spans are the same; the process that sent them is not"


def comparable(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The spans, less what describes the process that sent them (its instance, its pid)."""
    return sorted(
        (
            dataclasses.replace(
                s,
                resource={
                    k: v
                    for k, v in s.resource.items()
                    if k != "service.instance.id" and not k.startswith("process.")
                },
            )
            for s in spans
        ),
        key=lambda s: s.span_id,
    )


@pytest.mark.e2e
def test_a_cancelled_build_ends_every_span_and_says_why(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    journal = tmp_path / "cancelled.jsonl"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--journal", str(journal), "--speed", "0",
         "--silence", "2s", "--otlp-endpoint", endpoint(receiver, GRPC), "--otlp-protocol", GRPC],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for_text(journal, MID_BUILD, timeout_s=30)
    # Cancelled in the silence before tactic timing; refused at the first step after it, in
    # "Timing graph nodes".
    os.kill(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 3, err

    started = sum(1 for e in read_journal(journal).events if e.type == "phase_start")
    spans = receiver.wait_for_final(started + 1)
    assert len(spans) == started + 1, "one span per phase and one for the build"
    root, _ = tree_of(spans)
    assert root.attributes["cicd.pipeline.result"] == "cancellation"
    assert root.attributes["trt.cancel.reason"] == "received SIGTERM"
    assert root.status_code == 0, "a cancellation is not an error"
    # TensorRT finishes the open phases itself once a step is refused: each is marked.
    cancelled = {s.name for s in spans if s.attributes.get("trt.phase.cancelled")}
    assert {"Building engine", "Timing graph nodes"} <= cancelled
    cancelled_ends = {s.end_ns for s in spans if s.attributes.get("trt.phase.cancelled")}
    assert max(cancelled_ends) <= root.end_ns
    assert_nested(spans)


@pytest.mark.e2e
def test_a_killed_build_replays_with_every_span_ended(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    journal = tmp_path / "killed.jsonl"
    process = subprocess.Popen(
        [*CLI, "demo", "--no-progress", "--journal", str(journal), "--speed", "0",
         "--silence", "10m"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_text(journal, MID_BUILD, timeout_s=30)
    process.kill()
    process.wait(timeout=10)

    code = main(["replay", str(journal), "--otlp-endpoint", endpoint(receiver, HTTP_PROTOBUF)])
    assert code == 4  # a build with no end did not build
    events = read_journal(journal).events
    started = sum(1 for e in events if e.type == "phase_start")
    spans = receiver.wait_for_final(started + 1)
    assert len(spans) == started + 1
    root, _ = tree_of(spans)
    assert root.attributes["cicd.pipeline.result"] == "error"
    assert root.attributes["error.type"] == UNFINISHED
    assert root.status_code == STATUS_ERROR
    unfinished = [s for s in spans if s.attributes.get("trt.phase.status") == "aborted"]
    left_open = BuildState()
    for event in events:
        left_open.apply(event)
    assert len(left_open.open_by_name) >= 3
    assert sorted(s.name for s in unfinished) == sorted(left_open.open_by_name)
    last_event_ns = max(s.end_ns for s in spans)
    assert root.end_ns == last_event_ns
    assert_nested(spans)


@pytest.mark.e2e
def test_a_failed_build_is_an_error_span(tmp_path: Path, receiver: OtlpReceiver) -> None:
    model = tmp_path / "broken.onnx"
    model.write_bytes(b"\x08\x01 not a model")
    result = run_demo(
        *FLUSH_TIMEOUT, "--model", str(model), "--otlp-endpoint", endpoint(receiver, GRPC),
        "--otlp-protocol", GRPC,
    )  # fmt: skip
    assert result.returncode == 4
    (root,) = receiver.wait_for(1)
    assert root.attributes["cicd.pipeline.result"] == "failure"
    assert root.attributes["error.type"] == "ParserError"
    assert root.status_code == STATUS_ERROR and "cannot parse" in root.status_message


@pytest.mark.parametrize("protocol", [GRPC, HTTP_PROTOBUF])
@pytest.mark.parametrize("collector", ["down", "hanging"])
def test_an_unreachable_collector_costs_the_build_nothing(protocol: str, collector: str) -> None:
    plan = load_trace(next(iter(trace_files_or_plan())))
    with hanging_collector() as hanging_port:
        port = dead_port() if collector == "down" else hanging_port
        warnings: list[str] = []
        export = export_to(f"http://127.0.0.1:{port}", protocol, warnings)
        monitor = BuildMonitor()
        monitor.log.follow(export, capacity=1_000_000)
        monitor.start()
        began = time.monotonic()
        result = Driver(speed=0).run(monitor, plan)
        built_s = time.monotonic() - began
        monitor.end_with_result(b"engine" if result.completed else None)
        # The follower exports itself: it waits on the network, once, the build never does.
        assert monitor.close(timeout_s=DEFAULT_REQUEST_TIMEOUT_S + 10)
        began = time.monotonic()
        health = export.shutdown(2.0)
        took = time.monotonic() - began
    assert result.completed and result.cancelled_at is None, "every step answered True"
    assert built_s < 3.0, f"the build took {built_s:.1f}s"
    assert took < 4.0, f"shutdown took {took:.1f}s"
    assert health.exported == 0
    assert health.failed + health.dropped == monitor.state.phases_started_total + 1
    assert len(warnings) == 1, "a failure is reported, once"
    reason = "no answer within" if collector == "hanging" else "Connection refused"
    assert reason in warnings[0] and health.last_error is not None and reason in health.last_error


def build_through(export: OtlpSpanExport, plan: list[Callback]) -> BuildMonitor:
    """A build of ``plan`` whose spans go to ``export`` (a follower of its log), ended, its
    log closed."""
    monitor = BuildMonitor()
    monitor.log.follow(export, capacity=1_000_000)
    monitor.start()
    Driver(speed=0).run(monitor, plan)
    monitor.end()
    assert monitor.close(timeout_s=10.0)
    return monitor


@pytest.mark.parametrize("protocol", [GRPC, HTTP_PROTOBUF])
def test_a_collector_that_cannot_be_connected_to_is_not_waited_for_at_the_end(
    protocol: str,
) -> None:
    """At the end, spans still queued or in flight for a collector that cannot be connected
    to are given up at once: the exporter would only wait out its retries (3 s here)."""
    warnings: list[str] = []
    export = export_to(f"http://127.0.0.1:{dead_port()}", protocol, warnings)
    monitor = build_through(export, generate_plan(13, num_profiles=2))
    began = time.monotonic()
    health = export.shutdown(30.0)
    took = time.monotonic() - began
    assert took < 1.5, f"shutdown waited {took:.1f}s for a collector that is down"
    assert health.exported == 0
    assert health.failed + health.dropped == monitor.state.phases_started_total + 1
    assert len(warnings) == 1 and "Connection refused" in warnings[0], warnings


def test_a_refusing_collector_is_reported_once_and_every_span_counted() -> None:
    """A collector that answers 400 to every export (a failure the exporter does not retry):
    one warning with the reason, however many batches fail; every span counted as lost."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    posts: list[str] = []

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            posts.append(self.path)
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        warnings: list[str] = []
        export = export_to(f"http://127.0.0.1:{server.server_port}", HTTP_PROTOBUF, warnings)
        monitor = build_through(export, generate_plan(40, num_profiles=2))
        # The first batch (of 512 spans) is refused before the shutdown's last attempt, so two
        # batches fail whatever the machine's speed (a first failure after the shutdown began
        # would rightly give the rest up at once).
        wait_until(lambda: export.health().failed > 0, "the first batch's refusal", 10)
        health = export.shutdown(10.0)
    finally:
        server.shutdown()
        server.server_close()
    assert len(posts) >= 2, "several batches, each refused"
    assert health.failed >= 1 and health.exported == 0
    # Exports are held back while they fail: what was not tried by the deadline is dropped.
    assert health.failed + health.dropped == monitor.state.phases_started_total + 1
    assert len(warnings) == 1, warnings
    assert "OTLP export to" in warnings[0]


@contextlib.contextmanager
def redirecting_collector(status: int, target: str) -> Iterator[tuple[int, list[str]]]:
    """A real HTTP server that answers every POST with ``status``, to ``target`` + its path
    (an http-to-https ingress in front of a collector); its port and the paths posted."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    posts: list[str] = []

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            posts.append(self.path)
            self.send_response(status)
            self.send_header("Location", target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port, posts
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [307, 302])
@pytest.mark.e2e
def test_a_collector_that_redirects_is_a_failure_and_nothing_is_counted_exported(
    status: int, receiver: OtlpReceiver
) -> None:
    """A redirect (an ingress sending http to https) is no acceptance: the SDK counts any answer
    under 400 as one. Spans, log records and metrics are each said not exported, with what the
    collector answered, once; nothing is followed to the target."""
    target = endpoint(receiver, HTTP_PROTOBUF)
    with redirecting_collector(status, target) as (port, posts):
        result = run_demo(
            *FLUSH_TIMEOUT, "--speed", "0", "--otlp-endpoint", f"http://127.0.0.1:{port}",
            "--otlp-protocol", HTTP_PROTOBUF, "--otlp-logs-level", "info", "--otlp-metrics",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert {"/v1/traces", "/v1/logs", "/v1/metrics"} <= set(posts), posts
    err = result.stderr
    assert re.search(r"spans: [\d,]+ exported", err) is None, "no span is said exported"
    assert "records exported" not in err
    assert err.count("OTLP export to") == 1, "the spans' failure is said once"
    assert f"{DEMO_SPANS:,} spans not exported ({DEMO_SPANS:,} refused" in err, err
    assert "log records not exported (the collector answered" in err, err
    assert "OTLP metric exports failed (the collector answered" in err, err
    assert err.count(f"answered {status} ") >= 3 and f"to '{target}/v1/traces'" in err
    assert "Traceback" not in err
    assert receiver.spans == [] and receiver.logs == [] and receiver.points == []


def test_the_final_flush_waits_until_a_failed_export_has_been_said() -> None:
    """The final flush begins before it is waited for: an export that fails at once is done
    with only once its failure is counted and said, not as soon as its answer came (the build
    said "N spans not exported" and exited before the warning with the reason)."""
    warnings: list[str] = []

    def slow_warn(message: str) -> None:  # a terminal that takes its time
        time.sleep(0.5)
        warnings.append(message)

    with redirecting_collector(307, "https://collector.example") as (port, _):
        settings = OtlpSettings.resolve(f"http://127.0.0.1:{port}", HTTP_PROTOBUF, environ={})
        assert settings is not None
        export = OtlpSpanExport(settings, warn=slow_warn)
        build_through(export, generate_plan(3))
        export.begin_shutdown(10.0)
        # Answered and counted: its warning on its way.
        wait_until(lambda: export.health().failed != 0, "no export failed", 10)
        health = export.shutdown(10.0)
    assert health.failed > 0 and health.exported == 0
    assert len(warnings) == 1 and "answered 307" in warnings[0], warnings


def trace_files_or_plan() -> list[Path]:
    from conftest import trace_files

    files = trace_files()
    if not files:
        pytest.skip("no recorded traces")
    return files


@pytest.mark.e2e
@pytest.mark.parametrize("collector", ["down", "hanging"])
def test_the_cli_exits_promptly_when_the_collector_is_unreachable(collector: str) -> None:
    # The same demo with no export, timed in the same run: what is measured is what the
    # collector adds, which the 2 s flush timeout bounds (an exporter waiting out its own
    # timeouts and retries would add half a minute and more).
    began = time.monotonic()
    assert run_demo(*FLUSH_TIMEOUT, "--speed", "0").returncode == 0
    baseline = time.monotonic() - began
    with hanging_collector() as hanging_port:
        port = dead_port() if collector == "down" else hanging_port
        began = time.monotonic()
        result = run_demo(
            *FLUSH_TIMEOUT, "--speed", "0", "--otlp-endpoint", f"http://127.0.0.1:{port}",
            "--otlp-protocol", HTTP_PROTOBUF, "--otlp-flush-timeout", "2s",
        )  # fmt: skip
        took = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    assert "build success" in result.stderr
    assert "spans not exported" in result.stderr
    assert result.stderr.count("OTLP export to") == 1
    assert result.stderr.count("spans not exported") == 1, "the loss is said once"
    assert "Traceback" not in result.stderr
    assert took - baseline < 10.0, (
        f"{took:.1f}s with the collector {collector}, {baseline:.1f}s alone"
    )


def test_a_build_over_the_budget_folds_short_leaves_and_the_totals_add_up(
    receiver: OtlpReceiver,
) -> None:
    plan = generate_plan(num_layers=40, num_profiles=2, seed=7)
    warnings: list[str] = []
    export = export_to(
        endpoint(receiver, GRPC), GRPC, warnings, span_budget=50, fold_under_ns=10**12
    )
    monitor = BuildMonitor()
    monitor.log.follow(export, capacity=1_000_000)
    monitor.start()
    Driver(speed=0).run(monitor, plan)
    monitor.end()
    monitor.close()
    export.shutdown(10.0)
    state = monitor.state
    started = state.phases_started_total
    expected_spans = export.projection.emitted
    spans = receiver.wait_for_final(expected_spans)
    assert len(spans) == expected_spans < started
    folded = sum(s.attributes.get("trt.folded.count", 0) for s in spans)
    root, children = tree_of(spans)
    assert root.attributes["trt.spans.folded"] == folded
    assert len(spans) - 1 + folded == started, "every phase is a span or counted in a fold"
    # Phases with children are never folded, so the tree keeps every inner node.
    inner = sum(1 for p in state.phases.values() if p.children)
    parents = [
        s
        for s in spans
        if s is not root and (s.span_id in children or "trt.folded.count" in s.attributes)
    ]
    assert len(parents) == inner
    for span in spans:
        if "trt.folded.count" in span.attributes:
            assert (
                span.attributes["trt.folded.duration_max_s"]
                <= (span.attributes["trt.folded.duration_total_s"])
            )
            assert span.attributes["trt.folded.names"]
    assert_nested(spans)


@pytest.mark.parametrize("trace", trace_params())
def test_the_default_budget_keeps_the_recorded_traces_whole(trace: Path) -> None:
    """Every phase of a recorded build is a span of its own, with its own name and parent."""
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, load_trace(trace))
    monitor.end()
    projection, spans = projected(monitor)
    assert projection.folded == 0
    phases = [phase for phase in monitor.state.phases.values()]
    assert len(spans) == len(phases) + 1
    build = spans[-1]
    assert build.parent_span_id is None
    by_id = {span.span_id: span for span in spans}
    assert len(by_id) == len(spans), "span ids are unique"
    names = sorted(span.name for span in spans if span is not build)
    assert names == sorted(phase.name for phase in phases)
    assert all("trt.folded.count" not in span.attributes for span in spans)
    assert all(span.parent_span_id in by_id for span in spans if span is not build)


@pytest.mark.e2e
def test_a_build_inside_a_traced_job_joins_its_trace(receiver: OtlpReceiver) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    result = run_demo(
        *FLUSH_TIMEOUT, "--speed", "0", "--otlp-endpoint", endpoint(receiver, HTTP_PROTOBUF),
        env={**os.environ, "TRACEPARENT": traceparent},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"spans: {DEMO_SPANS} exported" in result.stderr
    spans = receiver.wait_for(DEMO_SPANS)
    assert len(spans) == DEMO_SPANS
    assert {s.trace_id for s in spans} == {"0af7651916cd43dd8448eb211c80319c"}
    (build,) = [s for s in spans if s.parent_span_id == "b7ad6b7169203331"]
    assert build.name == "BUILD trt-otel-demo-mnist.onnx"
    assert build.parent_is_remote is True, "the job's span is in another process"
    by_id = {s.span_id: s for s in spans}
    phases = [s for s in spans if s is not build]
    assert all(by_id[s.parent_span_id].trace_id == build.trace_id for s in phases)
    assert all(s.parent_is_remote is False for s in phases), "their parents are ours"
    assert [s.name for s in phases if s.parent_span_id == build.span_id] == ["Building engine"]
    assert build.status_code == 0 and build.attributes["cicd.pipeline.result"] == "success"
    assert_nested(spans)


@pytest.mark.e2e
def test_standard_environment_variables_configure_the_export(receiver: OtlpReceiver) -> None:
    result = run_demo(
        *FLUSH_TIMEOUT, "--speed", "0",
        env={
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint(receiver, GRPC),
            "OTEL_EXPORTER_OTLP_PROTOCOL": GRPC,
            "OTEL_SERVICE_NAME": "engine-builds",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=ci,team=ml",
        },
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    spans = receiver.wait_for(DEMO_SPANS)
    resource = spans[0].resource
    assert resource["service.name"] == "engine-builds"
    assert (resource["deployment.environment.name"], resource["team"]) == ("ci", "ml")


def test_settings_resolution() -> None:
    assert OtlpSettings.resolve(environ={}) is None
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    settings = OtlpSettings.resolve(environ=base)
    assert settings is not None
    assert settings.endpoint == "http://collector:4318/v1/traces"
    assert settings.protocol == HTTP_PROTOBUF
    grpc = OtlpSettings.resolve("http://collector:4317", environ={})
    assert grpc is not None and (grpc.endpoint, grpc.protocol) == ("http://collector:4317", GRPC)
    signal_url = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://x.example/otlp/traces"}
    exact = OtlpSettings.resolve(environ=signal_url)
    assert exact is not None and exact.endpoint == "https://x.example/otlp/traces"
    assert OtlpSettings.resolve(environ={**base, "OTEL_SDK_DISABLED": "true"}) is None
    assert OtlpSettings.resolve(environ={**base, "OTEL_TRACES_EXPORTER": "none"}) is None
    with pytest.raises(OtlpConfigError, match="not an http"):
        OtlpSettings.resolve("collector:4317", environ={})
    with pytest.raises(OtlpConfigError, match="not supported"):
        OtlpSettings.resolve(environ={**base, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--otlp-endpoint", "localhost:4317"], "is not an http:// or https:// URL"),
        (["--otlp-endpoint", "http://host:99999"], "is not a valid URL (Port out of range"),
        (["--otlp-endpoint", "http://[::1"], "is not a valid URL (Invalid IPv6 URL)"),
    ],
)
def test_a_bad_endpoint_is_refused_before_the_build(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--speed", "0", "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_traceparent_parsing() -> None:
    parent = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
    assert parent is not None and not parent.sampled
    for bad in (
        "",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        "ff-" + "1" * 32 + "-" + "1" * 16 + "-01",
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        "junk",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
    ):
        assert parse_traceparent(bad) is None, bad
    # A later version may append fields; what version 00 defines is still read.
    future = parse_traceparent("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-09-what")
    assert future is not None and future.sampled
    assert (future.trace_id, future.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )


def test_export_health_is_in_the_monitors_own_metrics() -> None:
    from prometheus_client import generate_latest

    from trt_otel.views.prometheus import MetricSources, MetricsServer, metrics_registry

    warnings: list[str] = []
    export = export_to(f"http://127.0.0.1:{dead_port()}", HTTP_PROTOBUF, warnings)
    monitor = BuildMonitor()
    monitor.log.follow(export)
    server = MetricsServer(
        metrics_registry(MetricSources(monitor, span_health=export.queue.health)), 0
    )
    try:
        Driver(speed=0).run(monitor, generate_plan(num_layers=2, num_profiles=1, seed=1))
        monitor.end()
        monitor.close()
        health = export.shutdown(3.0)
        text = generate_latest(server.registry).decode()
    finally:
        server.close()
    lost = health.failed + health.dropped
    assert lost == monitor.state.phases_started_total + 1
    assert f"trt_otel_spans_failed_total {float(health.failed)}" in text
    assert f"trt_otel_spans_dropped_total {float(health.dropped)}" in text
    assert "trt_otel_spans_exported_total 0.0" in text


def test_one_export_thread_the_outcome_from_the_exporter_and_logging_left_alone(
    receiver: OtlpReceiver,
) -> None:
    loggers = [logging.getLogger(name) for name in ("", "opentelemetry", "opentelemetry.exporter")]
    before = [(lg.propagate, list(lg.handlers), lg.level) for lg in loggers]
    warnings: list[str] = []
    threads_before = {t.name for t in threading.enumerate()}
    export = export_to(endpoint(receiver, HTTP_PROTOBUF), HTTP_PROTOBUF, warnings)
    monitor = BuildMonitor()
    monitor.log.follow(export)
    Driver(speed=0).run(monitor, generate_plan(num_layers=2, num_profiles=1, seed=1))
    during = {t.name for t in threading.enumerate()} - threads_before
    monitor.end()
    assert monitor.close(10)
    health = export.shutdown(10.0)
    assert during == {"trt-otel-otlp", "trt-otel-otlp-export"}, "the follower's, and one more"
    assert (health.exported, health.failed, health.dropped) == (
        monitor.state.phases_started_total + 1,
        0,
        0,
    )
    assert len(receiver.wait_for(health.exported)) == health.exported
    assert [(lg.propagate, list(lg.handlers), lg.level) for lg in loggers] == before
    assert warnings == []


class CountingExporter(SpanExporter):
    """A real exporter, with its calls counted."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        return self.inner.export(spans)

    def shutdown(self) -> None:
        self.inner.shutdown()


def test_a_failing_collector_is_retried_with_growing_pauses() -> None:
    settings = OtlpSettings.resolve(f"http://127.0.0.1:{dead_port()}", HTTP_PROTOBUF, environ={})
    assert settings is not None
    settings = dataclasses.replace(settings, request_timeout_s=0.2)  # its retries stop sooner
    exporter = CountingExporter(settings.make_exporter())
    warnings: list[str] = []
    export = OtlpSpanExport(
        settings, warn=warnings.append, exporter=exporter, interval_s=0.02, retry_after_s=0.4
    )
    monitor = BuildMonitor()
    monitor.log.follow(export)
    monitor.start()
    began = time.monotonic()
    phases = 0
    while time.monotonic() - began < 3.0:  # a phase ends every 10 ms, each a span to export
        monitor.phase_start("p", None, 1)
        monitor.phase_finish("p")
        phases += 1
        time.sleep(0.01)
    calls = exporter.calls
    monitor.end()
    assert monitor.close(10)
    health = export.shutdown(2.0)
    # Every 20 ms without the pauses (over a hundred tries); with them, tried at once, then
    # after 0.4 s, 0.8 s more, 1.6 s more: four or five tries in three seconds.
    assert 3 <= calls <= 6, calls
    assert len(warnings) == 1 and "Connection refused" in warnings[0]
    assert health.exported == 0 and health.failed + health.dropped == phases + 1


def projected(monitor: BuildMonitor) -> tuple[SpanProjection, list[SpanRecord]]:
    projection = SpanProjection()
    spans = [span for event in monitor.log.recent() for span in projection.apply(event)]
    return projection, spans


def test_a_build_span_under_a_traceparent_has_a_remote_parent() -> None:
    monitor = BuildMonitor()
    monitor.start(
        **{TRACEPARENT_ATTRIBUTE: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    )
    monitor.phase_start("A", None, 1)
    monitor.phase_finish("A")
    monitor.end()
    _, spans = projected(monitor)
    phase, build = spans
    assert build.parent_span_id == 0xB7AD6B7169203331 and build.parent_is_remote
    assert phase.parent_span_id == build.span_id and not phase.parent_is_remote
    plain = BuildMonitor()
    plain.end()
    (alone,) = projected(plain)[1]
    assert alone.parent_span_id is None and not alone.parent_is_remote


def test_a_timed_out_build_is_an_error_span() -> None:
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 3)
    monitor.cancel("over its 10 s limit", source="timeout", timeout=True)
    monitor.end()
    _, spans = projected(monitor)
    build = spans[-1]
    assert monitor.state.outcome is Outcome.TIMEOUT
    assert build.error is not None
    assert build.attributes["error.type"] == "timeout"
    assert build.attributes["cicd.pipeline.result"] == "timeout"


def test_the_spans_a_log_left_open_end_innermost_first() -> None:
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 3)
    monitor.phase_start("B", "A", 3)
    monitor.phase_start("C", "B", 3)
    projection, spans = projected(monitor)
    assert spans == []
    ended = projection.finish()
    assert [span.name for span in ended] == ["C", "B", "A", "BUILD"]
    assert ended[-1].error is not None and ended[-1].attributes["error.type"] == UNFINISHED


def test_span_ids_are_a_function_of_the_build() -> None:
    monitor = BuildMonitor()
    Driver(speed=0).run(monitor, generate_plan(3))
    monitor.end()
    live, first = projected(monitor)
    replay, second = projected(monitor)  # both held: two projections at once
    assert live is not replay
    assert [s.span_id for s in first] == [s.span_id for s in second], "a replay gives the same ids"
    other = BuildMonitor()
    Driver(speed=0).run(other, generate_plan(3))
    other.end()
    assert {s.span_id for s in projected(other)[1]}.isdisjoint(s.span_id for s in first)


def test_a_job_that_does_not_sample_its_trace_has_the_build_unsampled() -> None:
    """The traceparent's sampled flag is the traced job's choice: every span of the build
    keeps it."""
    for flags, sampled in (("01", True), ("00", False)):
        monitor = BuildMonitor()
        parent = f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"
        monitor.start(**{TRACEPARENT_ATTRIBUTE: parent})
        monitor.phase_start("A", None, 1)
        monitor.phase_finish("A")
        monitor.end()
        _, spans = projected(monitor)
        assert [span.sampled for span in spans] == [sampled, sampled], flags


def test_the_build_span_counts_every_anomaly() -> None:
    """Two of one kind and one of another: three anomalies, not two kinds."""
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 1)
    monitor.phase_finish("B")
    monitor.phase_finish("C")
    monitor.step_complete("D", 0)
    monitor.end()
    build = projected(monitor)[1][-1]
    assert build.attributes["trt.anomalies"] == 3


def test_a_phase_span_keeps_its_first_anomalies_as_events_and_counts_the_rest() -> None:
    """Forty anomalies in one phase: its span carries the first MAX_SPAN_EVENTS as span
    events, in the order they happened, counts all forty, and says how many were dropped."""
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 1)
    for step in range(1, 41):
        monitor.step_complete("A", step)  # outside [0, 1): an anomaly of A
    monitor.phase_finish("A")
    monitor.end()
    phase = projected(monitor)[1][0]
    assert phase.name == "A"
    assert len(phase.events) == MAX_SPAN_EVENTS
    details = [event.attributes["trt.anomaly.detail"] for event in phase.events]
    assert details[0] == "step 1 of 'A' outside [0, 1)"
    assert details[-1] == f"step {MAX_SPAN_EVENTS} of 'A' outside [0, 1)"
    assert phase.attributes["trt.phase.anomalies"] == 40
    assert phase.attributes["trt.span_events_dropped"] == 40 - MAX_SPAN_EVENTS


def test_the_builders_errors_and_warnings_are_events_of_the_build_span() -> None:
    monitor = BuildMonitor()
    monitor.start()
    for severity in ("error", "warning", "info"):
        monitor.log_message(severity, f"an {severity}")
    monitor.end()
    build = projected(monitor)[1][-1]
    said = [
        (e.name, e.attributes["log.severity"], e.attributes["log.message"]) for e in build.events
    ]
    assert said == [("trt.log", "error", "an error"), ("trt.log", "warning", "an warning")]


class _RefusingAfterRelease(SpanExporter):
    """Refuses every batch; each export answers only once ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.exporting = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append(len(spans))
        self.exporting.set()
        self.release.wait(30)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_a_close_begun_while_an_export_fails_still_makes_its_last_attempt() -> None:
    """The close's one last attempt is owed to what is queued even when it begins while an
    earlier export is failing: that failure is not the last attempt's, and gives nothing up."""
    exporter = _RefusingAfterRelease()
    warnings: list[str] = []
    queue = SpanExportQueue(
        exporter, describe="a collector", warn=warnings.append, batch_size=2, interval_s=60
    )
    for name in ("a", "b", "c"):
        queue.on_end(ReadableSpan(name=name))
    assert exporter.exporting.wait(30), "the first batch is being exported"
    queue.begin_close(10.0)
    exporter.release.set()
    queue.close(10.0)
    assert exporter.batches == [2, 1], "the first batch, then the last attempt with the rest"
    health = queue.health()
    assert (health.failed, health.dropped) == (3, 0), health
    assert queue.failed_exports == 2, "each failed export counted (the live view sends again)"
    assert len(warnings) == 1, warnings


def test_a_full_export_queue_drops_its_oldest_span_to_keep_the_newest() -> None:
    """A queue of two holds two: a third span makes room by dropping the oldest, counted, and
    the two newest are those exported."""
    exporter = InMemorySpanExporter()
    queue = SpanExportQueue(
        exporter, describe="a collector", warn=lambda message: None, capacity=2, interval_s=60
    )
    for name in ("a", "b", "c"):
        queue.on_end(ReadableSpan(name=name))
    health = queue.health()
    assert (health.queued, health.dropped) == (2, 1), health
    assert queue.close(10.0)
    assert [span.name for span in exporter.get_finished_spans()] == ["b", "c"]
    assert queue.health().exported == 2


def test_spans_in_an_export_under_way_are_counted_queued_until_it_answers() -> None:
    exporter = _RefusingAfterRelease()
    queue = SpanExportQueue(
        exporter, describe="a collector", warn=lambda message: None, batch_size=2, interval_s=60
    )
    for name in ("a", "b", "c"):
        queue.on_end(ReadableSpan(name=name))
    assert exporter.exporting.wait(30), "the first batch is being exported"
    assert queue.health().queued == 3, "two in the export under way, one waiting"
    exporter.release.set()
    queue.close(10.0)
    assert queue.health().queued == 0
