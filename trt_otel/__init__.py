"""trt-otel: watch and stop TensorRT engine builds.

An event-sourced ``IProgressMonitor``: every TensorRT callback becomes an event in an append-only
log, and everything else (state, journal, terminal, exporters, cancel policies) follows that log.
``import trt_otel`` never imports ``tensorrt``.

Exceptions: :class:`~trt_otel.core.journal_codec.JournalError` (a journal that cannot be read) and
:class:`~trt_otel.builder.build.BuildSetupError` (a build that cannot start: missing model, no
TensorRT).
"""

# ruff: noqa: E402 (the imports come after the Ctrl-C guard that covers them)

# First of all, before any import that takes time: when this process is the trt-otel command
# (its console script, or ``python -m trt_otel.app.cli``), Ctrl-C during the imports below is
# one line and exit 130, not a traceback through them. Only modules built into the interpreter
# here (``_signal``, ``posix`` and ``sys`` load nothing), so that the window in which a Ctrl-C
# still meets Python's own handler is as short as it can be. The command puts Python's handler
# back once its imports are done (trt_otel.core.startup.startup_done).
import _signal as _startup_signal  # type: ignore[import-not-found]  # C, with no stubs
import sys as _sys

_startup_os = __import__("nt" if _sys.platform == "win32" else "posix")  # os's own C core


def _interrupted_starting(signum: int, frame: object) -> None:
    """Nothing has started, so nothing to stop or clean up: one line, exit 130."""
    _startup_os.write(2, b"trt-otel: interrupted before the build started\n")
    _startup_os._exit(130)


def _running_as_command() -> bool:
    if _sys.argv and _sys.argv[0].replace("\\", "/").rsplit("/", 1)[-1].startswith("trt-otel"):
        return True
    # ``python -m``: argv[0] is only "-m" while the package imports; the command line says more.
    words = list(getattr(_sys, "orig_argv", []))
    return any(
        words[index] == "-m" and words[index + 1] == "trt_otel.app.cli"
        for index in range(len(words) - 1)
    )


if (
    _running_as_command()
    and _startup_signal.getsignal(_startup_signal.SIGINT) is _startup_signal.default_int_handler
):
    _startup_signal.signal(_startup_signal.SIGINT, _interrupted_starting)

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from trt_otel.core.version import __version__

if _TYPE_CHECKING:
    from trt_otel.app.instrumentation import instrument, uninstrument
    from trt_otel.capture.checked import read_journal
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
    from trt_otel.core.journal import JournalWriter
    from trt_otel.core.journal_codec import JournalError
    from trt_otel.core.journal_reader import Journal
    from trt_otel.core.log import EventLog
    from trt_otel.core.state import BuildState, BuildStatus, Phase, PhaseStatus

_FACE = {
    "Anomaly": "trt_otel.core.events",
    "AnomalyKind": "trt_otel.core.events",
    "BuildFinished": "trt_otel.core.events",
    "BuildMonitor": "trt_otel.capture.monitor",
    "BuildStarted": "trt_otel.core.events",
    "BuildState": "trt_otel.core.state",
    "BuildStatus": "trt_otel.core.state",
    "CancelRequested": "trt_otel.core.events",
    "Clock": "trt_otel.core.clock",
    "Event": "trt_otel.core.events",
    "EventLog": "trt_otel.core.log",
    "Follower": "trt_otel.core.followers",
    "FollowerHealth": "trt_otel.core.followers",
    "GpuSample": "trt_otel.core.events",
    "Journal": "trt_otel.core.journal_reader",
    "JournalError": "trt_otel.core.journal_codec",
    "JournalWriter": "trt_otel.core.journal",
    "LogMessage": "trt_otel.core.events",
    "ManualClock": "trt_otel.core.clock",
    "Outcome": "trt_otel.core.events",
    "Phase": "trt_otel.core.state",
    "PhaseFinished": "trt_otel.core.events",
    "PhaseStarted": "trt_otel.core.events",
    "PhaseStatus": "trt_otel.core.state",
    "ProcessSample": "trt_otel.core.events",
    "StepCompleted": "trt_otel.core.events",
    "SystemClock": "trt_otel.core.clock",
    "read_journal": "trt_otel.capture.checked",
    "instrument": "trt_otel.app.instrumentation",
    "uninstrument": "trt_otel.app.instrumentation",
}
"""Where each name of the package's face lives. Each is imported when first asked for, so that
``import trt_otel`` (a build's worker among its users) costs only what is used: ``instrument()``
brings a whole session (exporters, views, policies), ``BuildMonitor`` the log and its fold."""

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


def __getattr__(name: str) -> _Any:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'trt_otel' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE})
