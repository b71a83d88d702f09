"""What a fleet is asked and what it answers, declared once as typed structs.

A request to start a build (:class:`BuildRequest`) and every answer of a fleet (a build's
status, the list, a page of events, a wait, a cancel, a fit) are declared here, for the local
fleet and Ray's alike: the MCP server's tools take and return them, and publish as each tool's
output schema the JSON Schema derived from them (:func:`output_schema`), which MCP clients check
every answer against; ``trt-otel fleet --json`` prints them. An agent reads one shape whichever
fleet serves it: a field that only one fleet knows (Ray's job status, the local build's HTTP
address) is null on the other.

The sub-documents a build's own ``/status`` also has (its estimates, its builder's process, its
projection) are :mod:`trt_otel.views.status`'s structs, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from trt_otel.app.engine_store import StoreStatus, engines_summary
from trt_otel.control.deadline import FitAnswerWord
from trt_otel.views.status import Builder, Estimate, Projection

State = Literal[
    "starting",
    "pending",
    "running",
    "cancelling",
    "retrying",
    "finished",
    "failed_to_start",
    "lost",
    "unknown",
]
"""Where a build is in its life: ``pending`` (Ray has not started it), ``starting`` (its
process has not begun the build), ``running``, ``cancelling``, ``retrying`` (a retry ladder's
attempt ended and the next may follow), ``finished`` (its journal records its end),
``failed_to_start``, ``lost`` (its process ended without an end), ``unknown`` (Ray cannot be
asked)."""
ENDED: tuple[State, ...] = ("finished", "failed_to_start", "lost")
"""The states a build never leaves."""


class BuildRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A build to start: MCP's ``start_build`` and ``trt-otel fleet submit``. Every field is
    checked by the fleet before anything else looks at it (bounded, paths confined, options read
    by ``trt-otel``'s own parser)."""

    kind: str
    """``build`` (a real engine from an ONNX model) or ``demo`` (simulated)."""
    model: str | None = None
    output: str | None = None
    options: tuple[str, ...] = ()
    """More ``trt-otel`` options, as on its command line."""
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    """More ``trt-otel`` options, typed: by long name without its dashes (``stall-timeout``),
    ``true`` for a flag, a value, or a list for an option given more than once (see
    :func:`~trt_otel.app.fleet_requests.settings_options`)."""
    overwrite: bool = False
    deadline: str | None = None
    """``--deadline``: the build must end within this."""
    retries: tuple[str | dict[str, Any], ...] = ()
    """``--retry`` rungs, in order: each as on the command line, or typed as ``settings``
    are (of the options a rung may give)."""


class CancelNote(msgspec.Struct, frozen=True):
    """The first cancel asked for: why, and what decided it."""

    reason: str
    source: str


class OpenPhase(msgspec.Struct, frozen=True):
    """One open phase, on the path from the outermost to the innermost."""

    name: str
    steps: str
    """Steps done of its steps: ``3/10``."""
    elapsed_s: float | None


class ForecastStatus(msgspec.Struct, frozen=True):
    """What the build was expected to take before it started, from earlier builds."""

    expected_s: float
    p90_s: float
    peak_rss_bytes: int | None
    builds: int
    basis: str
    """``history`` (its own earlier builds) or ``scaled`` (other models', by size)."""
    said: str
    error: float | None
    """Once it succeeded: how far off it was, ``(took - expected) / expected``."""


class AttemptStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of a retry ladder, and how it ended."""

    build_id: str | None
    number: int
    of: int
    previous_build_id: str | None
    retry_reason: str | None
    options: str | None
    cancel: CancelNote | None = None
    outcome: str | None = None
    exit_code: int | None = None
    detail: str | None = None


class BuildStatus(msgspec.Struct, kw_only=True):
    """A build of a fleet, as its journal, its process (or Ray) and, while it runs, its own
    HTTP view tell it."""

    id: str
    """The fleet's id of the build (12 hex digits)."""
    kind: str
    state: State
    model: str | None
    engine: str | None
    journal: str
    build_id: str | None
    """The build's own id, from its journal (a retry ladder's latest attempt's)."""
    last_seq: int
    progress: float
    steps_completed: int
    elapsed_s: float | None = None
    eta: Estimate | None = None
    """Its time left, with what that rests on, while it runs."""
    open_phases: list[OpenPhase] = []
    projection: Projection | None = None
    """While it runs with a deadline: when it is expected to end, as the deadline decides."""
    outcome: str | None = None
    exit_code: int | None = None
    """0 (success), 3 (cancelled or timed out), 4 (failed)."""
    detail: str | None = None
    cancel: CancelNote | None = None
    builder: Builder | None = None
    gpu: dict[str, Any] | None = None
    """The latest GPU sample, where the GPU is sampled."""
    forecast: ForecastStatus | None = None
    store: StoreStatus | None = None
    attempts: list[AttemptStatus] = []
    error: str | None = None
    """Why a build that failed to start, or was lost, is so."""
    url: str | None = None
    """The local fleet's: the build's HTTP view while it serves."""
    page: str | None = None
    started_wall_s: float | None = None
    submitted_wall_s: float | None = None
    """A scheduler's (Ray's, SLURM's): when the job was submitted."""
    scheduler: str | None = None
    """Where the build runs as a job: ``ray`` or ``slurm`` (None: the local fleet's process)."""
    job_id: str | None = None
    """The scheduler's id of the job (Ray's submission id, SLURM's job id)."""
    job_status: str | None = None
    """The scheduler's word for the job (Ray's ``RUNNING``, SLURM's ``COMPLETING``)."""
    job_message: str | None = None
    job_exit_code: int | None = None
    """The job's exit code as the scheduler recorded it."""
    node: str | None = None
    cancel_requested: bool | None = None
    """A scheduler's: whether the build's cancel file is written."""
    job_stop_requested: bool | None = None
    """A scheduler's: the job outlived its cancel's grace period and was asked to stop."""
    ray_status: str | None = None
    """Ray's name of ``job_status`` (and the three below of theirs), as clients of before read
    them."""
    ray_message: str | None = None
    ray_exit_code: int | None = None
    ray_stop_requested: bool | None = None


class BuildSummary(msgspec.Struct, kw_only=True):
    """A build, in a list of them."""

    id: str
    kind: str
    model: str | None
    state: State
    outcome: str | None
    progress: float
    store: StoreStatus | None
    started_wall_s: float | None = None
    scheduler: str | None = None
    job_status: str | None = None
    ray_status: str | None = None
    node: str | None = None

    @classmethod
    def of(cls, status: BuildStatus) -> BuildSummary:
        return cls(
            id=status.id,
            kind=status.kind,
            model=status.model,
            state=status.state,
            outcome=status.outcome,
            progress=status.progress,
            store=status.store,
            started_wall_s=status.started_wall_s,
            scheduler=status.scheduler,
            job_status=status.job_status,
            ray_status=status.ray_status,
            node=status.node,
        )


class BuildList(msgspec.Struct):
    """Every build, oldest first, and what the engine store did for them in one line
    (``engines: 3 served, 1 rebuilt (options: +optimization_level 1)``; null where none used
    one)."""

    builds: list[BuildSummary]
    engines: str | None

    @classmethod
    def of(cls, builds: list[BuildSummary]) -> BuildList:
        return cls(builds, engines_summary(b.store for b in builds))


class EventsPage(msgspec.Struct):
    """A build's events after a seq, as journal records."""

    events: list[dict[str, Any]]
    next_seq: int
    """The seq to ask from next time."""
    more: bool


class WaitAnswer(msgspec.Struct):
    """What ended a wait, and the build's status then."""

    reason: Literal["progressed", "ended", "timeout"]
    status: BuildStatus


class CancelAnswer(msgspec.Struct, kw_only=True):
    """A cancel accepted: whether it was the build's first, with the reason it carries."""

    id: str
    accepted: bool
    first: bool
    reason: str | None
    note: str
    status: BuildStatus | None = None
    """Where the cancel waited for the build's end: its status then."""


class FitAnswer(msgspec.Struct, kw_only=True):
    """Whether a build would end within a deadline, from earlier builds' journals."""

    answer: FitAnswerWord
    reason: str
    deadline_s: float
    builds: int
    within: int
    journals_not_used: int
    projection: Projection | None


def output_schema(document: type[msgspec.Struct]) -> dict[str, Any]:
    """``document``'s JSON Schema as MCP publishes a tool's output: an object at the root (MCP
    asks for one), the structs it refers to under ``$defs`` (none of these refers to itself)."""
    schema = msgspec.json.schema(document)
    definitions: dict[str, Any] = schema.pop("$defs")
    root: dict[str, Any] = definitions.pop(document.__name__)
    return {**root, "$defs": definitions} if definitions else root
