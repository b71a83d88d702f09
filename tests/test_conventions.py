"""The spans speak OpenTelemetry's CI/CD conventions: a build is a pipeline run, each phase a task
run. Checked against the ``opentelemetry-semantic-conventions`` package's own registry (its
constants and enumerations, imported here independently of trt-otel), on spans decoded from the
OTLP wire by a real receiver."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.semconv._incubating.attributes import cicd_attributes
from opentelemetry.semconv._incubating.attributes.cicd_attributes import (
    CICD_PIPELINE_ACTION_NAME,
    CICD_PIPELINE_NAME,
    CICD_PIPELINE_RESULT,
    CICD_PIPELINE_RUN_ID,
    CICD_PIPELINE_TASK_NAME,
    CICD_PIPELINE_TASK_RUN_ID,
    CICD_PIPELINE_TASK_RUN_RESULT,
    CicdPipelineActionNameValues,
    CicdPipelineResultValues,
    CicdPipelineTaskRunResultValues,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.schemas import Schemas

from journals import spans_of
from otlp_receiver import OtlpReceiver, ReceivedSpan
from trt_otel import BuildMonitor
from trt_otel.builder.simulator import Driver, generate_plan
from trt_otel.core.events import Outcome
from trt_otel.views.conventions import SEMCONV_VERSION, task_run_result
from trt_otel.views.otlp import OtlpSpanExport
from trt_otel.views.otlp_settings import GRPC, OtlpSettings
from trt_otel.views.spans import UNFINISHED, SpanRecord

SERVER = ProtoSpan.SpanKind.SPAN_KIND_SERVER
INTERNAL = ProtoSpan.SpanKind.SPAN_KIND_INTERNAL
STATUS_ERROR = 2

REGISTRY = {
    value
    for name, value in vars(cicd_attributes).items()
    if name.startswith("CICD_") and isinstance(value, str)
}
"""Every ``cicd.*`` attribute the conventions define."""


def exported(monitor: BuildMonitor, receiver: OtlpReceiver) -> list[ReceivedSpan]:
    settings = OtlpSettings.resolve(
        f"http://127.0.0.1:{receiver.grpc_port}", GRPC, environ={}, span_budget=10**6
    )
    assert settings is not None
    warnings: list[str] = []
    export = OtlpSpanExport(settings, warn=warnings.append)
    export.handle(monitor.log.recent())
    export.close()
    health = export.shutdown(10.0)
    assert (health.failed, health.dropped, warnings) == (0, 0, [])
    return receiver.wait_for(health.exported)


def test_a_build_is_a_pipeline_run_and_each_phase_a_task_run(receiver: OtlpReceiver) -> None:
    monitor = BuildMonitor(attributes={"model.path": "/models/resnet50.onnx"})
    monitor.start()
    Driver(speed=0).run(monitor, generate_plan(5))
    monitor.end_with_result(b"engine")
    monitor.close()
    spans = exported(monitor, receiver)
    (build,) = [s for s in spans if not s.parent_span_id]
    phases = [s for s in spans if s.parent_span_id]
    assert len(phases) == monitor.state.phases_started_total > 10

    # The pipeline run: "{action} {pipeline}", kind SERVER.
    action = CicdPipelineActionNameValues.BUILD.value
    assert build.name == f"{action} resnet50.onnx"
    assert build.kind == SERVER
    assert build.attributes[CICD_PIPELINE_ACTION_NAME] == action
    assert build.attributes[CICD_PIPELINE_NAME] == "resnet50.onnx"
    assert build.attributes[CICD_PIPELINE_RUN_ID] == monitor.build_id
    assert build.attributes[CICD_PIPELINE_RESULT] == CicdPipelineResultValues.SUCCESS.value
    assert ERROR_TYPE not in build.attributes and build.status_code == 0
    assert build.attributes["trt.build.id"] == monitor.build_id, "trt.* attributes stay"

    # Each task run: named as its phase, kind INTERNAL, run ids unique within the pipeline run.
    assert all(s.kind == INTERNAL for s in phases)
    assert all(s.attributes[CICD_PIPELINE_TASK_NAME] == s.name for s in phases)
    run_ids = [s.attributes[CICD_PIPELINE_TASK_RUN_ID] for s in phases]
    assert len(set(run_ids)) == len(run_ids)
    success = CicdPipelineTaskRunResultValues.SUCCESS.value
    assert {s.attributes[CICD_PIPELINE_TASK_RUN_RESULT] for s in phases} == {success}
    assert "trt.phase.num_steps" in phases[0].attributes

    # The version of the conventions followed is the package's newest schema, on the scope.
    newest = max(Schemas, key=lambda s: [int(n) for n in s.name[1:].split("_")])
    assert {s.scope_schema_url for s in spans} == {newest.value}
    assert_in_registry(spans)


def assert_in_registry(spans: list[ReceivedSpan] | list[SpanRecord]) -> None:
    """Every ``cicd.*`` attribute is one the conventions define, with a value they list."""
    enumerations: dict[str, type[Enum]] = {
        CICD_PIPELINE_ACTION_NAME: CicdPipelineActionNameValues,
        CICD_PIPELINE_RESULT: CicdPipelineResultValues,
        CICD_PIPELINE_TASK_RUN_RESULT: CicdPipelineTaskRunResultValues,
    }
    for span in spans:
        for key, value in span.attributes.items():
            if key.startswith("cicd."):
                assert key in REGISTRY, key
                if key in enumerations:
                    assert value in {v.value for v in enumerations[key]}, (key, value)


def results(spans: list[SpanRecord]) -> dict[str, Any]:
    return {s.name: s.attributes[CICD_PIPELINE_TASK_RUN_RESULT] for s in spans if not s.server}


@pytest.mark.parametrize("timeout", [False, True], ids=["cancelled", "timed-out"])
def test_phases_unwound_by_a_cancel_are_cancelled_or_timed_out_task_runs(timeout: bool) -> None:
    monitor = BuildMonitor()
    monitor.phase_start("Done before", None, 1)
    monitor.step_complete("Done before", 0)
    monitor.phase_finish("Done before")
    monitor.phase_start("Outer", None, 3)
    monitor.phase_start("Inner", "Outer", 3)
    monitor.cancel("over its limit" if timeout else "asked to", source="timeout", timeout=timeout)
    assert monitor.step_complete("Inner", 0) is False  # refused: TensorRT unwinds
    monitor.phase_finish("Inner")
    monitor.phase_finish("Outer")
    monitor.end()
    spans = spans_of(monitor.log.recent())
    expected = (
        CicdPipelineTaskRunResultValues.TIMEOUT
        if timeout
        else CicdPipelineTaskRunResultValues.CANCELLATION
    ).value
    assert results(spans) == {"Done before": "success", "Inner": expected, "Outer": expected}
    build = spans[-1]
    assert build.server
    assert build.attributes[CICD_PIPELINE_RESULT] == expected
    unwound = [s for s in spans if s.name in ("Inner", "Outer")]
    if timeout:  # a timeout is an error, as the build's is
        assert all(s.error and s.attributes[ERROR_TYPE] == "timeout" for s in unwound)
    else:  # a cancellation is not
        assert all(s.error is None and ERROR_TYPE not in s.attributes for s in unwound)
    assert_in_registry(spans)


def test_phases_open_when_a_build_fails_are_failed_task_runs() -> None:
    monitor = BuildMonitor()
    monitor.phase_start("Finished", None, 1)
    monitor.phase_finish("Finished")
    monitor.phase_start("Open", None, 2)
    monitor.end_with_result(None)  # TensorRT returned no engine, nothing cancelled
    spans = spans_of(monitor.log.recent())
    assert results(spans) == {"Finished": "success", "Open": "failure"}
    (open_phase,) = [s for s in spans if s.name == "Open"]
    assert open_phase.attributes[ERROR_TYPE] == spans[-1].attributes[ERROR_TYPE]
    assert open_phase.error is not None
    assert spans[-1].attributes[CICD_PIPELINE_RESULT] == "failure"
    assert_in_registry(spans)


def test_a_log_that_ends_early_is_an_errored_run_of_errored_tasks() -> None:
    monitor = BuildMonitor()
    monitor.phase_start("A", None, 3)
    monitor.phase_start("B", "A", 3)
    spans = spans_of(monitor.log.recent())  # no build_end: the process died
    error = CicdPipelineResultValues.ERROR.value
    assert results(spans) == {"A": error, "B": error}
    assert all(s.attributes[ERROR_TYPE] == UNFINISHED and s.error for s in spans)
    assert spans[-1].attributes[CICD_PIPELINE_RESULT] == error
    assert spans[-1].name == CicdPipelineActionNameValues.BUILD.value, "no model: {action} alone"
    assert_in_registry(spans)


def test_the_docs_name_the_version_of_the_conventions_followed() -> None:
    repo = Path(__file__).resolve().parents[1]
    for page in ("README.md", "docs/spans.md"):
        assert f"semantic conventions {SEMCONV_VERSION}" in (repo / page).read_text(), page


def test_attributes_that_are_not_one_scalar_type_become_their_text() -> None:
    """OpenTelemetry takes lists of one scalar type only: a list of names stays a list, a mixed
    one (from a build record) is written as its text rather than dropped by the exporter."""
    monitor = BuildMonitor(
        attributes={"network.inputs": ["a: FLOAT[1]", "b: INT32[2]"], "odd": ["a", 1]}
    )
    monitor.phase_start("Building engine", None, 1)
    monitor.phase_finish("Building engine")
    monitor.end()
    (build,) = [span for span in spans_of(monitor.log.recent()) if span.server]
    assert build.attributes["network.inputs"] == ["a: FLOAT[1]", "b: INT32[2]"]
    assert build.attributes["odd"] == "['a', 1]"


@pytest.mark.parametrize(
    ("finished", "refused", "cancel_timeout", "build_outcome", "result"),
    [
        (False, True, False, Outcome.CANCELLATION, "cancellation"),  # a step refused
        (False, True, True, Outcome.TIMEOUT, "timeout"),
        (True, False, False, Outcome.SUCCESS, "success"),
        (True, False, False, Outcome.FAILURE, "success"),  # it ended well, the build did not
        # Closed for it: by the build's end, as the build ended...
        (False, False, False, Outcome.FAILURE, "failure"),
        (False, False, False, Outcome.CANCELLATION, "cancellation"),
        (False, False, False, Outcome.TIMEOUT, "timeout"),
        # ...except where the build succeeded around a phase TensorRT never finished, or has
        # no end at all: something went wrong with the phase, not with the build.
        (False, False, False, Outcome.SUCCESS, "error"),
        (False, False, False, None, "error"),
    ],
)
def test_each_way_a_phase_ends_is_one_task_run_result(
    finished: bool, refused: bool, cancel_timeout: bool, build_outcome: Outcome | None, result: str
) -> None:
    assert (
        task_run_result(
            finished=finished,
            refused=refused,
            cancel_timeout=cancel_timeout,
            build_outcome=build_outcome,
        )
        == result
    )
