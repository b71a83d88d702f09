"""The build as one document: what ``GET /status`` answers, declared once as typed structs.

The structs are the document's one declaration: the HTTP view encodes them, and the JSON Schema
it serves (``GET /status.schema.json``) and docs/http.md publishes is derived from them, so the
docs, the schema and the answer cannot drift apart. A tree node
says what it is in ``kind``: a ``phase``, or a ``group`` (finished siblings of one name folded
into one node, as the terminal folds them).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import msgspec

from trt_otel.core.attempts import attempt_of
from trt_otel.core.eta import BuildEta
from trt_otel.core.eta import Estimate as CoreEstimate
from trt_otel.core.journal_codec import event_to_dict
from trt_otel.core.projection import project
from trt_otel.core.readmodel import ReadModel, SiblingGroup
from trt_otel.core.state import BuildState, Phase

MAX_TREE_DEPTH = 64
"""How deep ``/status`` nests the phase tree. TensorRT nests a handful of levels; a crafted
journal may nest thousands, which no JSON encoder or browser should be asked to recurse into.
A phase at this depth lists no children and says how many it has (``children_hidden``)."""


class Estimate(msgspec.Struct, frozen=True):
    """Seconds left, with what the estimate rests on, or null with why it is unknown."""

    seconds: float | None
    basis: str
    unknown: str | None

    @classmethod
    def of(cls, value: CoreEstimate) -> Estimate:
        """The document's form of an estimate of :mod:`trt_otel.core.eta`."""
        return cls(value.seconds, value.basis, value.unknown)


class Cancel(msgspec.Struct, frozen=True):
    """The first cancel asked for: why, what decided it (its source) and which policy."""

    reason: str
    source: str
    policy: str


class Builder(msgspec.Struct, frozen=True):
    """The builder's process, as last sampled, and the verdict on it."""

    state: str
    """``working``, ``idle``, ``stopped`` or ``gone``."""
    evidence: str
    since_s: float | None
    pid: int
    status: str
    cpu_percent: float | None
    busiest_thread_percent: float | None
    cpu_seconds: float | None
    rss_bytes: int | None
    peak_rss_bytes: int | None
    threads: int | None
    read_bytes: int | None
    write_bytes: int | None
    available_bytes: int | None


class Attempt(msgspec.Struct, frozen=True):
    """Which attempt of a retry ladder the build is."""

    number: int
    of: int
    previous_build_id: str | None
    retry_reason: str | None
    options: str | None


class Projection(msgspec.Struct, frozen=True):
    """When the open build is expected to end, as ``--deadline`` decides."""

    expected_s: float
    earliest_s: float
    basis: str
    """``history`` or ``progress``."""
    evidence: str


class PhaseNode(msgspec.Struct, tag="phase", tag_field="kind"):
    """One phase instance, its children under it."""

    name: str
    status: str
    """``open``, ``finished`` or ``aborted``."""
    num_steps: int
    steps_completed: int
    last_step: int
    progress: float
    elapsed_s: float
    close_reason: str | None = None
    """Why an aborted phase was closed."""
    eta: Estimate | None = None
    """Its time left, while it is open."""
    children: list[PhaseNode | GroupNode] = msgspec.field(default_factory=list)
    children_hidden: int | None = None
    """At the depth bound: how many children are not listed."""


class GroupNode(msgspec.Struct, tag="group", tag_field="kind"):
    """The finished phases of one name under one parent, folded into one node."""

    name: str
    count: int
    elapsed_s: float
    """Their time in all."""
    longest_s: float
    status: str = "finished"


class StatusDocument(msgspec.Struct):
    """The build, as ``GET /status`` answers it."""

    build_id: str | None
    status: str
    """``pending``, ``running``, ``cancelling`` or ``finished``."""
    outcome: str | None
    """``success``, ``failure``, ``cancellation`` or ``timeout``; null while it runs."""
    detail: str | None
    error_type: str | None
    elapsed_s: float | None
    progress: float
    steps_completed: int
    phases_started: int
    eta: Estimate
    eta_progress: Estimate
    eta_history: Estimate
    cancel: Cancel | None
    anomalies: dict[str, int]
    gpu: dict[str, Any] | None
    """The latest GPU sample (the ``gpu`` event's fields), where the GPU is sampled."""
    builder: Builder | None
    """Null where the builder's process is not sampled."""
    attributes: dict[str, Any]
    attempt: Attempt | None
    projection: Projection | None
    phases: list[PhaseNode | GroupNode]


def status_schema() -> dict[str, Any]:
    """The JSON Schema of :class:`StatusDocument`."""
    return msgspec.json.schema(StatusDocument)


def status_document(model: ReadModel, eta: BuildEta, now_mono_ns: int) -> StatusDocument:
    """The build as one document (hold the model's lock, or own it)."""
    state = model.state
    start = state.start_mono_ns
    end = state.end_mono_ns if state.end_mono_ns is not None else now_mono_ns
    cancel = state.cancel
    builder = state.activity.as_json()
    attempt = attempt_of(state.attributes)
    projected = project(state, model.boundaries, now_mono_ns, model.history)
    return StatusDocument(
        build_id=state.build_id,
        status=state.status.value,
        outcome=state.outcome.value if state.outcome is not None else None,
        detail=state.outcome_detail or None,
        error_type=state.error_type,
        elapsed_s=(end - start) / 1e9 if start is not None else None,
        progress=state.progress_ratio(),
        steps_completed=state.steps_completed_total,
        phases_started=state.phases_started_total,
        eta=Estimate.of(eta.build),
        eta_progress=Estimate.of(eta.progress),
        eta_history=Estimate.of(eta.history),
        cancel=None if cancel is None else Cancel(cancel.reason, cancel.source, cancel.policy),
        anomalies={kind.value: count for kind, count in state.anomalies.items()},
        gpu=_gpu(state),
        builder=None if builder is None else Builder(**builder),  # type: ignore[arg-type]
        attributes=state.attributes,
        attempt=None if attempt is None else Attempt(**dataclasses.asdict(attempt)),
        projection=None if projected is None else Projection(**dataclasses.asdict(projected)),
        phases=_tree(model, eta, now_mono_ns),
    )


def _gpu(state: BuildState) -> dict[str, Any] | None:
    if state.gpu is None:
        return None
    record = event_to_dict(state.gpu)
    for key in ("seq", "type", "mono_ns", "thread"):
        record.pop(key, None)
    return record


def _tree(model: ReadModel, eta: BuildEta, now: int) -> list[PhaseNode | GroupNode]:
    """The phase tree, repeated phases folded by the model's rule (the terminal folds them the
    same way). A stack, not recursion: a journal may nest phases as deep as it likes."""
    roots: list[PhaseNode | GroupNode] = []
    stack: list[tuple[list[PhaseNode | GroupNode], int | None, int]] = [(roots, None, 0)]
    while stack:
        into, parent_id, depth = stack.pop()
        for node in model.tree(parent_id):
            if isinstance(node, SiblingGroup):
                into.append(
                    GroupNode(node.name, node.count, node.total_ns / 1e9, node.longest_ns / 1e9)
                )
                continue
            phase = _phase(model, node, eta, now)
            into.append(phase)
            if not node.children:
                continue
            if depth + 1 < MAX_TREE_DEPTH:
                stack.append((phase.children, node.id, depth + 1))
            else:
                phase.children_hidden = len(model.tree(node.id))
    return roots


def _phase(model: ReadModel, phase: Phase, eta: BuildEta, now: int) -> PhaseNode:
    """One phase, its ``children`` left empty for the caller to fill."""
    estimate = eta.phases.get(phase.id)
    return PhaseNode(
        name=phase.name,
        status=phase.status.value,
        num_steps=phase.num_steps,
        steps_completed=phase.steps_completed,
        last_step=phase.last_step,
        progress=model.state.phase_progress(phase.id),
        elapsed_s=(phase.duration_ns(now) or 0) / 1e9,
        close_reason=phase.close_reason or None,
        eta=None if estimate is None else Estimate.of(estimate),
    )


def schema_text() -> str:
    """The schema as docs/schemas/status.schema.json holds it."""
    return json.dumps(status_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m trt_otel.views.status > docs/schemas/status.schema.json
    sys.stdout.write(schema_text())
