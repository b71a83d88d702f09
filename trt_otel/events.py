"""The events of a build: immutable facts, one per TensorRT callback or decision.

Every event carries a ``seq`` assigned by the :class:`~trt_otel.log.EventLog` (contiguous from 0
within one build), the wall-clock and monotonic time at which it was recorded, and the name of the
thread that recorded it. Everything trt-otel shows is a fold of these events, so they hold only
what was observed, never anything derived.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar


class Outcome(enum.StrEnum):
    """How a build ended, named after OpenTelemetry's ``cicd.pipeline.result`` values."""

    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLATION = "cancellation"
    TIMEOUT = "timeout"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Fields common to every event. ``type`` names the event in the journal."""

    type: ClassVar[str] = "event"

    seq: int
    wall_ns: int
    mono_ns: int
    thread: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildStarted(Event):
    """The build began. ``attributes`` describe it (model, versions, options, host)."""

    type: ClassVar[str] = "build_start"

    build_id: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseStarted(Event):
    """TensorRT called ``phase_start(name, parent, num_steps)``."""

    type: ClassVar[str] = "phase_start"

    name: str
    parent: str | None
    num_steps: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCompleted(Event):
    """TensorRT called ``step_complete(name, step)``."""

    type: ClassVar[str] = "step"

    name: str
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseFinished(Event):
    """TensorRT called ``phase_finish(name)``."""

    type: ClassVar[str] = "phase_finish"

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelRequested(Event):
    """Something decided the build must stop; from now on ``step_complete`` answers False.

    ``source`` names the kind of decider (``timeout``, ``file``, ``http``, ``stall``, ``signal``,
    ``user``), short and bounded so it can be a metric label; ``reason`` says why, in words fit for
    a terminal and a span; ``timeout`` makes the outcome a timeout rather than a cancellation.
    """

    type: ClassVar[str] = "cancel"

    reason: str
    source: str
    timeout: bool = False
    policy: str = ""
    """The deciding policy's description (``any_of(timeout(2h), file(/tmp/stop))``), if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly(Event):
    """A protocol departure that was tolerated; ``phase`` names the phase involved, if any."""

    type: ClassVar[str] = "anomaly"

    kind: AnomalyKind
    detail: str
    phase: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogMessage(Event):
    """A message from the builder's logger (severity as TensorRT names it)."""

    type: ClassVar[str] = "log"

    severity: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildFinished(Event):
    """The build ended. ``detail`` explains a failure or cancellation."""

    type: ClassVar[str] = "build_end"

    outcome: Outcome
    detail: str = ""
    error_type: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample(Event):
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
    )
}
"""Event classes by their journal ``type``."""


E = TypeVar("E", bound=Event)


def fast_constructor(cls: type[E]) -> Callable[..., E]:
    """A positional constructor of ``cls`` for the callback path: ``make(seq, wall_ns, mono_ns,
    thread, *fields)`` in field order.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which
    costs more than the rest of a callback together; this one stores straight into the slots
    (their descriptors), and the event is as frozen as any other.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    slots = {name: next(k.__dict__[name] for k in cls.__mro__ if name in vars(k)) for name in names}
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls}
    lines = [f"def make({', '.join(names)}):", "    event = new(cls)"]
    for index, name in enumerate(names):
        namespace[f"set{index}"] = slots[name].__set__
        lines.append(f"    set{index}(event, {name})")
    lines.append("    return event")
    exec("\n".join(lines), namespace)  # the same technique dataclasses uses for __init__
    make: Callable[..., E] = namespace["make"]
    return make


MAKE_STEP = fast_constructor(StepCompleted)
MAKE_PHASE_START = fast_constructor(PhaseStarted)
MAKE_PHASE_FINISH = fast_constructor(PhaseFinished)
