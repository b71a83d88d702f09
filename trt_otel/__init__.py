"""trt-otel: watch and stop TensorRT engine builds.

An event-sourced ``IProgressMonitor``: every TensorRT callback becomes an event in an append-only
log, and everything else (state, journal, terminal, exporters, cancel policies) follows that log.
``import trt_otel`` never imports ``tensorrt``.

Exceptions: :class:`~trt_otel.core.journal.JournalError` (a journal that cannot be read) and
:class:`~trt_otel.builder.build.BuildSetupError` (a build that cannot start: missing model, no
TensorRT).
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.clock import Clock, ManualClock, SystemClock
from trt_otel.core.events import (
    Anomaly,
    AnomalyKind,
    BuildFinished,
    BuildStarted,
    CancelRequested,
    Event,
    GpuSample,
    LogMessage,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from trt_otel.core.followers import Follower, FollowerHealth
from trt_otel.core.journal import Journal, JournalError, JournalWriter, read_journal
from trt_otel.core.log import EventLog
from trt_otel.core.state import BuildState, BuildStatus, Phase, PhaseStatus
from trt_otel.core.version import __version__

__all__ = [
    "Anomaly",
    "AnomalyKind",
    "BuildFinished",
    "BuildMonitor",
    "BuildStarted",
    "BuildState",
    "BuildStatus",
    "CancelRequested",
    "Clock",
    "Event",
    "EventLog",
    "Follower",
    "FollowerHealth",
    "GpuSample",
    "Journal",
    "JournalError",
    "JournalWriter",
    "LogMessage",
    "ManualClock",
    "Outcome",
    "Phase",
    "PhaseFinished",
    "PhaseStarted",
    "PhaseStatus",
    "ProcessSample",
    "StepCompleted",
    "SystemClock",
    "__version__",
    "instrument",
    "read_journal",
    "uninstrument",
]

if _TYPE_CHECKING:
    from trt_otel.app.instrumentation import instrument, uninstrument


def __getattr__(name: str) -> _Any:
    # instrument() brings a whole session (exporters, views, policies): imported when first
    # asked for, so that `import trt_otel` (a build's worker among its users) stays light.
    if name in ("instrument", "uninstrument"):
        from trt_otel.app import instrumentation

        return getattr(instrumentation, name)
    raise AttributeError(f"module 'trt_otel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "instrument", "uninstrument"})
