"""The events of a build: immutable facts, one per TensorRT callback or decision.

Every event carries a ``seq`` assigned by the :class:`~trt_otel.core.log.EventLog` (contiguous from
0
within one build), the wall-clock and monotonic time at which it was recorded, and the name of the
thread that recorded it. Everything trt-otel shows is a fold of these events, so they hold only
what was observed, never anything derived.

Events are ``msgspec`` structs tagged by ``type``: frozen, built in C (a callback pays about a
tenth of what a frozen dataclass's ``__init__`` costs), and the journal's codec
(:mod:`trt_otel.core.journal`) encodes and decodes them with every field's type checked, with no
per-field Python code. ``gc=False``: an event holds only strings, numbers and plain containers,
never a cycle, so the collector need not track millions of them.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

import msgspec


class Outcome(enum.StrEnum):
    """How a build ended, named after OpenTelemetry's ``cicd.pipeline.result`` values."""

    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLATION = "cancellation"
    TIMEOUT = "timeout"


class CancelSource(enum.StrEnum):
    """The kind of decider a cancel names (its ``source``): short and bounded, so it can be a
    metric label (``trt_build_cancellations_total{reason}``). The cancel event, the journal and
    ``/status`` carry the plain string; a journal may hold another (a program's own monitor
    names its own), which is read as it is."""

    TIMEOUT = "timeout"
    """``--timeout``: the build ran past its limit."""
    DEADLINE = "deadline"
    """``--deadline``: the build cannot end in time, or did not."""
    STALL = "stall"
    """``--stall-timeout``: no progress and no activity."""
    MEMORY = "memory"
    """A memory limit: ``--max-memory``, ``--min-available``, ``--max-gpu-memory``."""
    FILE = "file"
    """``--cancel-file`` appeared."""
    HTTP = "http"
    """``--cancel-url`` said so, or ``POST /cancel``."""
    SIGNAL = "signal"
    """SIGTERM, SIGHUP, SIGINT (Ctrl-C)."""
    USER = "user"
    """A caller of the monitor's ``cancel`` that names no other."""
    PROGRAM = "program"
    """The progress monitor of a program ``trt-otel run`` observes cancelled its build."""
    ALL_OF = "all_of"
    """Several policies of an ``AllOf`` decided together."""
    POLICY = "policy"
    """A policy that names no source of its own."""
    PREEMPTION = "preemption"
    """The scheduler took the job back to run it again later (SLURM's preemption or requeue):
    a stop the build will get over, neither a person's cancel nor a failure."""


class AnomalyKind(enum.StrEnum):
    """A departure from TensorRT's progress-monitor protocol, tolerated and recorded."""

    STEP_FOR_UNKNOWN_PHASE = "step_for_unknown_phase"
    """``step_complete`` named a phase that is not open."""
    FINISH_OF_UNKNOWN_PHASE = "finish_of_unknown_phase"
    """``phase_finish`` named a phase that is not open."""
    NAME_REUSED_WHILE_OPEN = "name_reused_while_open"
    """``phase_start`` reused the name of a phase that is still open; the old one is closed."""
    UNKNOWN_PARENT = "unknown_parent"
    """``phase_start`` named a parent that is not open; the phase is attached to the build."""
    STEP_OUT_OF_RANGE = "step_out_of_range"
    """A step outside ``[0, num_steps)`` (an old TensorRT reported ``step == num_steps``)."""
    STEP_NOT_INCREASING = "step_not_increasing"
    """A step not above the last one reported for the same phase instance."""
    FINISH_WITH_OPEN_CHILDREN = "finish_with_open_children"
    """A phase finished while phases under it were open; those are closed first."""
    INVALID_ARGUMENT = "invalid_argument"
    """A callback argument of the wrong type or value (coerced, and recorded)."""
    CALLBACK_OUTSIDE_BUILD = "callback_outside_build"
    """A callback arrived after the build had ended."""
    MONITOR_ERROR = "monitor_error"
    """The monitor itself failed while handling a callback; the callback was still answered."""


class Event(msgspec.Struct, frozen=True, tag_field="type", gc=False):
    """Fields common to every event. ``type`` names the event in the journal (its tag).

    Positional construction follows field order (these four, then the type's own); the
    monitor's callbacks use it, everything else passes keywords.
    """

    type: ClassVar[str] = "event"

    seq: int
    wall_ns: int
    mono_ns: int
    thread: str


class BuildStarted(Event, frozen=True, tag="build_start"):
    """The build began. ``attributes`` describe it (model, versions, options, host)."""

    type: ClassVar[str] = "build_start"

    build_id: str
    attributes: dict[str, Any] = msgspec.field(default_factory=dict)


class PhaseStarted(Event, frozen=True, tag="phase_start"):
    """TensorRT called ``phase_start(name, parent, num_steps)``."""

    type: ClassVar[str] = "phase_start"

    name: str
    parent: str | None
    num_steps: int


class StepCompleted(Event, frozen=True, tag="step"):
    """TensorRT called ``step_complete(name, step)``."""

    type: ClassVar[str] = "step"

    name: str
    step: int


class PhaseFinished(Event, frozen=True, tag="phase_finish"):
    """TensorRT called ``phase_finish(name)``."""

    type: ClassVar[str] = "phase_finish"

    name: str


class CancelRequested(Event, frozen=True, tag="cancel"):
    """Something decided the build must stop; from now on ``step_complete`` answers False.

    ``source`` names the kind of decider (a :class:`CancelSource`: ``timeout``, ``file``,
    ``http``, ``stall``, ``signal``, ``user``, ...), short and bounded so it can be a metric label,
    and always a plain string here, as in the journal; ``reason`` says why, in words fit for a
    terminal and a span; ``timeout`` makes the outcome a timeout rather than a cancellation.
    """

    type: ClassVar[str] = "cancel"

    reason: str
    source: str
    timeout: bool = False
    policy: str = ""
    """The deciding policy's description (``any_of(timeout(2h), file(/tmp/stop))``), if any."""


class Anomaly(Event, frozen=True, tag="anomaly"):
    """A protocol departure that was tolerated; ``phase`` names the phase involved, if any."""

    type: ClassVar[str] = "anomaly"

    kind: AnomalyKind
    detail: str
    phase: str | None = None


TENSORRT_SEVERITIES = ("internal_error", "error", "warning", "info", "verbose")
"""TensorRT's ``ILogger.Severity`` names, most severe first."""


def severity_rank(severity: str) -> int:
    """A severity's place in :data:`TENSORRT_SEVERITIES` (0 most severe); an unknown name ranks
    as ``info``."""
    name = severity.lower()
    return TENSORRT_SEVERITIES.index(name) if name in TENSORRT_SEVERITIES else 3


class LogMessage(Event, frozen=True, tag="log"):
    """A message from the builder's logger (severity as TensorRT names it)."""

    type: ClassVar[str] = "log"

    severity: str
    message: str


class BuildFinished(Event, frozen=True, tag="build_end"):
    """The build ended. ``detail`` explains a failure or cancellation."""

    type: ClassVar[str] = "build_end"

    outcome: Outcome
    detail: str = ""
    error_type: str | None = None


class BuildOutput(Event, frozen=True, tag="output"):
    """What a successful build produced, recorded just before its end: ``attributes`` such as
    ``engine.sha256``, ``engine.bytes``, ``engine.path`` and ``trt.timing_cache.sha256.after``
    (the build record's other half: ``build_start`` says what went in)."""

    type: ClassVar[str] = "output"

    attributes: dict[str, Any] = msgspec.field(default_factory=dict)


class GpuSample(Event, frozen=True, tag="gpu"):
    """What the build's GPU looked like at one moment (NVML). A value the device does not
    report is None. Ratios are 0 to 1."""

    type: ClassVar[str] = "gpu"

    index: int
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization: float | None = None
    """Fraction of the last sample period in which a kernel ran."""
    memory_utilization: float | None = None
    """Fraction of it in which device memory was read or written."""
    sm_clock_hz: int | None = None
    memory_clock_hz: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    process_memory_used_bytes: int | None = None
    """The GPU memory the builder's process holds on this GPU (where NVML says)."""


class ProcessSample(Event, frozen=True, tag="process"):
    """What the builder's process looked like at one moment (psutil): what tells a builder
    computing through a silent window from a hung one. A value the system does not report is
    None. ``cpu_percent`` and ``busiest_thread_percent`` cover the time since the previous
    sample, 100 being one core; ``status`` is ``running``, ``sleeping``, ``disk-wait``,
    ``stopped``, ``zombie`` or ``gone`` (no such process any more)."""

    type: ClassVar[str] = "process"

    pid: int
    status: str
    cpu_seconds: float | None = None
    """User and system time the process has used since it started."""
    cpu_percent: float | None = None
    busiest_thread_percent: float | None = None
    rss_bytes: int | None = None
    threads: int | None = None
    read_bytes: int | None = None
    write_bytes: int | None = None
    available_bytes: int | None = None
    """The host's available memory."""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        BuildStarted,
        PhaseStarted,
        StepCompleted,
        PhaseFinished,
        CancelRequested,
        Anomaly,
        LogMessage,
        BuildFinished,
        GpuSample,
        ProcessSample,
        BuildOutput,
    )
}
"""Event classes by their journal ``type``."""
