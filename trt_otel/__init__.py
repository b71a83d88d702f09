"""trt-otel: watch and stop TensorRT engine builds.

An event-sourced ``IProgressMonitor``: every TensorRT callback becomes an event in an append-only
log, and everything else (state, journal, terminal, exporters, cancel policies) follows that log.
``import trt_otel`` never imports ``tensorrt``.

Exceptions: :class:`~trt_otel.journal.JournalError` (a journal that cannot be read) and
:class:`~trt_otel.build.BuildSetupError` (a build that cannot start: missing model, no TensorRT).
"""

__version__ = "0.1.0"

from trt_otel.clock import Clock, ManualClock, SystemClock
from trt_otel.events import (
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
    StepCompleted,
)
from trt_otel.followers import Follower, FollowerHealth
from trt_otel.instrumentation import instrument, uninstrument
from trt_otel.journal import Journal, JournalError, JournalWriter, read_journal
from trt_otel.log import EventLog
from trt_otel.monitor import BuildMonitor
from trt_otel.state import BuildState, BuildStatus, Phase, PhaseStatus

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
    "StepCompleted",
    "SystemClock",
    "__version__",
    "instrument",
    "read_journal",
    "uninstrument",
]
