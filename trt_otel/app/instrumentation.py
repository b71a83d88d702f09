"""``trt_otel.instrument()``: observe every TensorRT build of this process, for notebooks and
long-running services, with no change to the code that builds.

The same recorder as ``trt-otel run`` (:mod:`trt_otel.capture.bootstrap`) wraps the builders of
``tensorrt`` and ``tensorrt_rtx``, and the same :class:`~trt_otel.capture.program.ProgramBuilds`
turns
its records into builds on one event log; only the channel between them is in-process (the
records are replayed on the recorder's thread, not on TensorRT's). There is no process to stop
from outside here, so a cancel takes effect at TensorRT's next step.

Settings come from the arguments, else from the environment:

========================  =====================================================================
``TRT_OTEL_JOURNAL``      the journal file (every build of the process, one after another)
``TRT_OTEL_TIMEOUT``      cancel a build running longer than this (``90s``, ``15m``, ``2h``)
``TRT_OTEL_STALL_TIMEOUT`` cancel a build with no progress for this long
``TRT_OTEL_CANCEL_FILE``  cancel a build while this file exists
``TRT_OTEL_PROGRESS``     ``plain`` (the default): a line per notable event on stderr; ``off``
``TRT_OTEL_HTTP_PORT``    serve the HTTP view (``/status``, ``/events``, ``POST /cancel``); 0 picks
``TRT_OTEL_PROMETHEUS_PORT`` serve ``/metrics`` for Prometheus; 0 picks a free port
``OTEL_*``                span export, as ``trt-otel run`` and every OpenTelemetry SDK read them
========================  =====================================================================
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shlex
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trt_otel.capture.bootstrap import _trt_otel_recorder as recorder
from trt_otel.control.defaults import SAMPLE_INTERVAL_S, SAMPLES_PER_STALL
from trt_otel.core.durations import format_duration, parse_positive_duration
from trt_otel.core.events import Outcome
from trt_otel.core.files import FileKindError, regular_file_or_absent
from trt_otel.core.journal import journal_in_use

if TYPE_CHECKING:
    from trt_otel.app.config import SessionConfig
    from trt_otel.capture.program import ProgramBuild, ProgramBuilds

__all__ = ["InstrumentSettings", "Instrumentation", "instrument", "uninstrument"]


class InstrumentError(ValueError):
    """A setting that cannot work (a bad duration, an unwritable journal)."""


def _check_journal(path: Path) -> None:
    """A regular file or none yet, that no other build writes: a named pipe would block the
    program at its first build, a device would swallow the record."""
    try:
        regular_file_or_absent(path, "journal")
    except FileKindError as error:
        raise InstrumentError(str(error)) from None
    writer = journal_in_use(path)
    if writer is not None:
        raise InstrumentError(f"journal {path} is already being written by {writer}")


def _check_stall_timeout(stall_timeout_s: float) -> None:
    """The stall counts the builder's work between two samples of its process (one every
    :data:`~trt_otel.control.defaults.SAMPLE_INTERVAL_S`): a shorter timeout would stop a
    builder computing through a silent window as hung, as ``--stall-timeout`` refuses."""
    least = SAMPLE_INTERVAL_S * SAMPLES_PER_STALL
    if stall_timeout_s < least:
        raise InstrumentError(
            f"stall_timeout {format_duration(stall_timeout_s)}: shorter than "
            f"{SAMPLES_PER_STALL} samples of the builder's process, one every "
            f"{SAMPLE_INTERVAL_S:g}s, so a builder computing through a silent "
            f"window would be stopped as hung; give {least:g}s or more"
        )


@dataclass(frozen=True, slots=True)
class InstrumentSettings:
    journal: Path | None = None
    timeout_s: float | None = None
    stall_timeout_s: float | None = None
    cancel_file: Path | None = None
    progress: bool = True
    otlp_endpoint: str | None = None
    http_port: int | None = None
    prometheus_port: int | None = None

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, **given: Any) -> InstrumentSettings:
        """``given`` (keyword arguments of :func:`instrument`) over ``TRT_OTEL_*`` variables."""
        env = os.environ if environ is None else environ

        def text(key: str, variable: str) -> str | None:
            value = given.get(key)
            if value is not None:
                return str(value)
            return env.get(variable, "").strip() or None

        def duration(key: str, variable: str) -> float | None:
            value = given.get(key)
            if isinstance(value, int | float):
                return float(value)
            raw = text(key, variable)
            if raw is None:
                return None
            try:
                return parse_positive_duration(raw)
            except ValueError as error:
                raise InstrumentError(f"{key} {raw!r}: {error}") from None

        journal, cancel_file = (
            text("journal", "TRT_OTEL_JOURNAL"),
            text("cancel_file", "TRT_OTEL_CANCEL_FILE"),
        )
        if journal:
            _check_journal(Path(journal))

        def port(key: str, variable: str) -> int | None:
            raw = text(key, variable)
            if raw is None:
                return None
            try:
                number = int(raw)
            except ValueError:
                number = -1
            if not 0 <= number <= 65535:
                raise InstrumentError(f"{key} {raw!r}: not a port (0 to 65535; 0 picks one)")
            return number

        progress = given.get("progress")
        if progress is None:
            mode = env.get("TRT_OTEL_PROGRESS", "plain").strip().lower()
            if mode not in ("plain", "off"):
                raise InstrumentError(f"TRT_OTEL_PROGRESS={mode!r}: use plain or off")
            progress = mode == "plain"
        stall_timeout_s = duration("stall_timeout", "TRT_OTEL_STALL_TIMEOUT")
        if stall_timeout_s is not None:
            _check_stall_timeout(stall_timeout_s)
        return cls(
            http_port=port("http_port", "TRT_OTEL_HTTP_PORT"),
            prometheus_port=port("prometheus_port", "TRT_OTEL_PROMETHEUS_PORT"),
            journal=Path(journal) if journal else None,
            timeout_s=duration("timeout", "TRT_OTEL_TIMEOUT"),
            stall_timeout_s=stall_timeout_s,
            cancel_file=Path(cancel_file) if cancel_file else None,
            progress=bool(progress),
            otlp_endpoint=given.get("otlp_endpoint"),
        )

    def session(self) -> SessionConfig:
        """The same settings as ``trt-otel run``'s options (no GPU sampling, no wait for a
        last scrape: a library call should not print or linger unasked)."""
        from trt_otel.app.config import (
            ConsoleConfig,
            GpuConfig,
            HttpConfig,
            MetricsConfig,
            ObservabilityConfig,
            PolicyConfig,
            SessionConfig,
            SpanConfig,
        )

        return SessionConfig(
            observe=ObservabilityConfig(
                journal=self.journal,
                spans=SpanConfig(endpoint=self.otlp_endpoint),
                http=HttpConfig(port=self.http_port),
                metrics=MetricsConfig(port=self.prometheus_port, linger_s=0.0),
                gpu=GpuConfig(enabled=False),
                console=ConsoleConfig(live=False),
            ),
            policy=PolicyConfig(
                timeout_s=self.timeout_s,
                stall_timeout_s=self.stall_timeout_s,
                cancel_file=self.cancel_file,
            ),
        )


class _LocalChannel:
    """The recorder's channel, in-process: its messages go straight to the builds (on the
    recorder's own thread), and cancels come back through a queue its listener reads."""

    def __init__(self, builds: ProgramBuilds) -> None:
        self._builds = builds
        self._cancels: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._process: Any = None

    # the recorder's side

    def send(self, message: tuple[Any, ...]) -> None:
        if message[0] == "hello":
            from trt_otel.capture.program import ProgramProcess

            self._process = ProgramProcess(_Back(self._cancels), int(message[1]), list(message[2]))
        elif self._process is not None:
            self._builds.handle(self._process, message)

    def recv(self) -> tuple[Any, ...] | None:
        return self._cancels.get()

    def close(self) -> None:
        self._cancels.put(None)


class _Back:
    """The builds' side of the in-process channel: a cancel for the recorder's listener."""

    def __init__(self, cancels: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        self._cancels = cancels

    def send(self, message: tuple[Any, ...]) -> None:
        self._cancels.put(message)

    def close(self) -> None:
        pass


class Instrumentation:
    """Every build of this process observed until :meth:`close` (or :func:`uninstrument`)."""

    def __init__(self, settings: InstrumentSettings) -> None:
        # Here rather than at the top: ``import trt_otel`` stays light (no exporters, no rich).
        from trt_otel.app.config import UsageError
        from trt_otel.app.program_session import observed_builds

        self.settings = settings
        self._stack = contextlib.ExitStack()
        attributes: dict[str, Any] = {"program.command": shlex.join(sys.argv)}
        try:
            self.builds = self._stack.enter_context(
                observed_builds(settings.session(), attributes, progress=settings.progress)
            )
        except UsageError as error:  # a journal that cannot be written, a port in use
            self._stack.close()
            raise InstrumentError(str(error)) from None
        self._channel = _LocalChannel(self.builds)
        self._sink = recorder.RemoteSink(lambda: self._channel, "trt-otel in this process")
        self._closed = threading.Event()
        recorder.install(self._sink)
        # As the OpenTelemetry SDK's providers do: a program that exits without
        # uninstrument() still ends its builds and flushes its journal and spans (the
        # followers' threads would otherwise die with what they had not written).
        atexit.register(self._close_at_exit)

    def close(self) -> None:
        """Stop observing; end a build still in progress; flush the journal and the spans."""
        atexit.unregister(self._close_at_exit)
        self._close(_unfinished)

    def _close_at_exit(self) -> None:
        self._close(_exited)

    def _close(self, unfinished: Callable[[ProgramBuild], tuple[Outcome, str, str]]) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        recorder.uninstall()
        self._sink.close()
        self.builds.end_unfinished(unfinished)
        self._stack.close()


def _unfinished(build: ProgramBuild) -> tuple[Outcome, str, str]:
    return Outcome.FAILURE, "trt-otel was uninstrumented during the build", "Uninstrumented"


def _exited(build: ProgramBuild) -> tuple[Outcome, str, str]:
    return Outcome.FAILURE, "the program exited during the build", "ProgramExited"


_current: list[Instrumentation] = []


def instrument(
    *,
    journal: str | os.PathLike[str] | None = None,
    timeout: str | float | None = None,
    stall_timeout: str | float | None = None,
    cancel_file: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    otlp_endpoint: str | None = None,
    http_port: int | None = None,
    prometheus_port: int | None = None,
) -> Instrumentation:
    """Observe every TensorRT and TensorRT-RTX build this process makes from now on: each a
    build of its own (own id, ``build_start``..``build_end``) in one journal, with spans,
    progress lines, the HTTP view, metrics and cancel policies, as ``trt-otel run`` has them,
    and the program's own ``config.progress_monitor``
    still called. Arguments left out come from the environment (see the module's table).
    Calling it again replaces the settings."""
    uninstrument()
    settings = InstrumentSettings.resolve(
        journal=journal,
        timeout=timeout,
        stall_timeout=stall_timeout,
        cancel_file=cancel_file,
        progress=progress,
        otlp_endpoint=otlp_endpoint,
        http_port=http_port,
        prometheus_port=prometheus_port,
    )
    instrumentation = Instrumentation(settings)
    _current.append(instrumentation)
    return instrumentation


def uninstrument() -> None:
    """Stop observing builds: the libraries' own build methods are back."""
    while _current:
        _current.pop().close()
