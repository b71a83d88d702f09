"""The OpenTelemetry semantic conventions trt-otel follows, in one place: a build is a CI/CD
pipeline run, each TensorRT phase a task run of it.

Every attribute name and enumerated value here is the ``opentelemetry-semantic-conventions``
package's own constant (its incubating registry included, where the CI/CD conventions still are),
never a string typed by hand, so a rename in the conventions is a failure at import, not a silent
divergence. :data:`SEMCONV_VERSION` names the release of the conventions the package carries.

From the CI/CD spans convention: the pipeline run's span is ``{action} {pipeline}`` (``BUILD
resnet.onnx``), of kind SERVER, with ``cicd.pipeline.result`` always and ``error.type`` when the
result is a failure or an error; a task run's span is named after the task (the phase), of kind
INTERNAL, with ``cicd.pipeline.task.run.result``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from opentelemetry.semconv.version import __version__ as _semconv_package_version

from trt_otel.core.events import Outcome

__all__ = [
    "CICD_PIPELINE_ACTION_NAME",
    "CICD_PIPELINE_NAME",
    "CICD_PIPELINE_RESULT",
    "CICD_PIPELINE_RUN_ID",
    "CICD_PIPELINE_TASK_NAME",
    "CICD_PIPELINE_TASK_RUN_ID",
    "CICD_PIPELINE_TASK_RUN_RESULT",
    "ERROR_TYPE",
    "RUN_ACTION",
    "SCHEMA_URL",
    "SEMCONV_VERSION",
    "pipeline_name",
    "pipeline_result",
    "pipeline_run_attributes",
    "pipeline_span_name",
    "task_run_attributes",
    "task_run_result",
]

BUILD_ACTION = CicdPipelineActionNameValues.BUILD.value
"""``cicd.pipeline.action.name`` of every build: ``BUILD``."""
RUN_ACTION = CicdPipelineActionNameValues.RUN.value
"""``cicd.pipeline.action.name`` of ``trt-otel run``'s program: ``RUN``."""

# The task runs' results as text, read once (an enum's ``value`` is a call in Python, and a
# build has a span per phase).
_TASK_SUCCESS = str(CicdPipelineTaskRunResultValues.SUCCESS.value)
_TASK_ERROR = str(CicdPipelineTaskRunResultValues.ERROR.value)
_TASK_TIMEOUT = str(CicdPipelineTaskRunResultValues.TIMEOUT.value)
_TASK_CANCELLATION = str(CicdPipelineTaskRunResultValues.CANCELLATION.value)


def _schema_version(schema: Schemas) -> tuple[int, ...]:
    return tuple(int(part) for part in schema.name.removeprefix("V").split("_"))


SCHEMA_URL: str = max(Schemas, key=_schema_version).value
"""The newest schema the installed conventions package knows (``.../schemas/1.x.y``): the
version of the conventions the telemetry follows, set as the instrumentation scope's
``schema_url`` so a backend can translate names if they change."""

SEMCONV_VERSION = SCHEMA_URL.rsplit("/", 1)[-1]
"""The conventions' version, as the schema URL names it (``1.44.0``)."""

SEMCONV_PACKAGE_VERSION: str = _semconv_package_version
"""The Python package that carries them (``0.66b2``)."""

ERROR = CicdPipelineResultValues.ERROR.value
"""The result of a run that the CI/CD system (here: its process, or the protocol) broke."""

_FAILED_RESULTS = frozenset(
    {
        CicdPipelineResultValues.FAILURE.value,
        CicdPipelineResultValues.ERROR.value,
        CicdPipelineResultValues.TIMEOUT.value,
    }
)


def pipeline_result(outcome: Outcome | None) -> str:
    """``cicd.pipeline.result`` of a build that ended with ``outcome`` (None: it never ended,
    its process died: an error of the system, not of the model)."""
    if outcome is None:
        return ERROR
    return str(CicdPipelineResultValues(outcome.value).value)


def is_failed(result: str) -> bool:
    """Whether a run with this result is an error span (status Error, ``error.type`` set)."""
    return result in _FAILED_RESULTS


def pipeline_name(attributes: Mapping[str, Any]) -> str | None:
    """The pipeline's name: the model's file name, the same for every build of that model (a
    low-cardinality name, as the span name wants); None when the build names no model."""
    model = str(attributes.get("model.path", "")).replace("\\", "/").rsplit("/", 1)[-1]
    return model or None


def pipeline_span_name(name: str | None) -> str:
    """``{action} {pipeline}``, or ``{action}`` when there is no pipeline name."""
    return f"{BUILD_ACTION} {name}" if name else BUILD_ACTION


def pipeline_run_attributes(
    build_id: str, name: str | None, result: str, error_type: str | None
) -> dict[str, Any]:
    """The pipeline run's attributes; ``error_type`` is used only when ``result`` is a failed
    one (falling back to the result itself)."""
    attributes: dict[str, Any] = {
        CICD_PIPELINE_ACTION_NAME: BUILD_ACTION,
        CICD_PIPELINE_RUN_ID: build_id,
        CICD_PIPELINE_RESULT: result,
    }
    if name:
        attributes[CICD_PIPELINE_NAME] = name
    if is_failed(result):
        attributes[ERROR_TYPE] = error_type or result
    return attributes


def task_run_result(
    *, finished: bool, refused: bool, cancel_timeout: bool, build_outcome: Outcome | None
) -> str:
    """``cicd.pipeline.task.run.result`` of one phase.

    ``refused``: open when the monitor refused a step (TensorRT finished it because of the
    cancel); ``finished``: TensorRT called ``phase_finish``; otherwise the phase was closed
    for it, by the build's end (its outcome) or by a broken protocol or a dead process (an
    error)."""
    if refused:
        return _TASK_TIMEOUT if cancel_timeout else _TASK_CANCELLATION
    if finished:  # most phases
        return _TASK_SUCCESS
    if build_outcome is None or build_outcome is Outcome.SUCCESS:
        return _TASK_ERROR
    return str(CicdPipelineTaskRunResultValues(build_outcome.value).value)


def task_run_attributes(
    name: str, run_id: int, result: str, error_type: str | None
) -> dict[str, Any]:
    """A task run's attributes (``error.type`` when the result is a failed one)."""
    attributes: dict[str, Any] = {
        CICD_PIPELINE_TASK_NAME: name,
        CICD_PIPELINE_TASK_RUN_ID: str(run_id),
        CICD_PIPELINE_TASK_RUN_RESULT: result,
    }
    if is_failed(result):
        attributes[ERROR_TYPE] = error_type or result
    return attributes
