"""The builds of a program run by ``trt-otel run``, as builds on one event log.

The program's processes (the program itself, and any process of it that builds) connect to a
Unix socket when they make their first build (see :mod:`trt_otel.capture.bootstrap`), and send what
their
recorder recorded. Here each build becomes a :class:`BuildMonitor` of its own on the run's one
event log: its own build id, its ``build_start``..``build_end``, its own cancel policy; the
callbacks are replayed into it with the times and threads at which they were made, exactly as
:mod:`trt_otel.capture.supervisor` does for ``trt-otel build``'s worker.

Builds are recorded one at a time, in the order they began: a build that begins while another
is being recorded (two threads or processes building at once) waits, its records kept, until the
one before it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from trt_otel.capture.monitor import BuildMonitor
from trt_otel.control.policies import Policy
from trt_otel.control.runner import PolicyRunner
from trt_otel.core.events import CancelRequested, CancelSource, Outcome
from trt_otel.core.log import EventLog
from trt_otel.core.state import BuildState

_logger = logging.getLogger(__name__)

BOOTSTRAP_DIR = Path(__file__).parent / "bootstrap"
SOCKET_ENV = "TRT_OTEL_RUN_SOCKET"
AUTHKEY_ENV = "TRT_OTEL_RUN_AUTHKEY"
PROGRAM_SOURCE = CancelSource.PROGRAM
"""The cancel source of a build the program's own progress monitor cancelled."""

Say = Callable[[str], None]


class Link(Protocol):
    """The way back to a process of the program: a connection, or an in-process queue."""

    def send(self, message: tuple[Any, ...]) -> None: ...

    def close(self) -> None: ...


class ProgramProcess:
    """One process of the program that builds, and its connection."""

    def __init__(self, connection: Link, pid: int, argv: list[str]) -> None:
        self.connection = connection
        self.pid = pid
        self.argv = argv
        self._send_lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        """Best effort: a process that has gone cannot be cancelled anyway."""
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self.connection.send(message)


@dataclass(eq=False)
class ProgramBuild:
    """A build the program made, and what is known of how it is going."""

    index: int
    """1-based, in the order the builds began in this run."""
    process: ProgramProcess
    number: int
    """The process's own number for it."""
    attributes: dict[str, Any]
    began: tuple[int, int]
    """Wall and monotonic ns at which the program called the build."""
    monitor: BuildMonitor | None = None
    runner: PolicyRunner | None = None
    pending: deque[tuple[Any, ...]] = field(default_factory=deque)
    """Messages received while an earlier build was still being recorded."""
    cancelled_at: float | None = None
    """``time.monotonic()`` of a cancel TensorRT must honour within the grace period."""
    stopped_with: str | None = None
    outcome: Outcome | None = None
    on_finish: list[Callable[[], None]] = field(default_factory=list)


class ProgramBuilds:
    """Every build of the program, recorded one at a time on ``log``.

    Messages come from each process's reader thread; :meth:`cancel_all`, :meth:`overdue` and
    :meth:`end_unfinished` from the command's main thread. One lock keeps them in order.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        attributes: Mapping[str, Any] | None = None,
        policy: Callable[[], Policy | None] = lambda: None,
        warn: Say,
        say: Say,
    ) -> None:
        self.log = log
        self._attributes = dict(attributes or {})
        self._policy = policy
        self._warn = warn
        self._say = say
        self._lock = threading.RLock()
        self._builds: dict[tuple[int, int], ProgramBuild] = {}
        self._queue: deque[ProgramBuild] = deque()
        self.active: ProgramBuild | None = None
        self.latest: BuildMonitor | None = None
        """The monitor of the build being recorded, else of the last one recorded."""
        self.all: list[ProgramBuild] = []
        self.outcomes: Counter[Outcome] = Counter()
        self._cancel_everything: tuple[str, str, bool] | None = None
        """The reason, source and timeout flag of a cancel of this build and every later one."""
        self.changed = threading.Condition(self._lock)
        self.listeners: tuple[Callable[[BuildMonitor, int], Callable[[], None] | None], ...] = ()
        """Told of each build as it starts (its monitor and the process that builds); what one
        returns is called when the build ends."""
        """Called with each build's monitor when its recording starts; what one returns is
        called when the build has ended (a GPU sampler's stop)."""

    # -- from the program ----------------------------------------------------------------------

    def handle(self, process: ProgramProcess, message: tuple[Any, ...]) -> None:
        with self._lock:
            kind = message[0]
            if kind == "begin":
                _, number, attributes, wall_ns, mono_ns = message
                self._begin(process, number, attributes, (wall_ns, mono_ns))
                return
            build = self._builds.get((process.pid, message[1]))
            if build is None:
                return
            if build is not self.active:
                build.pending.append(message)
                return
            self._apply(build, message)
            self._advance()

    def _begin(
        self,
        process: ProgramProcess,
        number: int,
        attributes: dict[str, Any],
        began: tuple[int, int],
    ) -> None:
        index = len(self.all) + 1
        build = ProgramBuild(
            index,
            process,
            number,
            {
                **self._attributes,
                **attributes,
                "program.pid": process.pid,
                "run.build_index": index,
            },
            began,
        )
        self.all.append(build)
        self._builds[(process.pid, number)] = build
        self._queue.append(build)
        self._advance()

    def _advance(self) -> None:
        """Start recording the next build once the one before it has ended."""
        while self.active is None or self.active.outcome is not None:
            if self.active is not None:
                self._builds.pop((self.active.process.pid, self.active.number), None)
                self.active = None
            if not self._queue:
                return
            build = self._queue.popleft()
            self._start(build)
            while build.pending and build.outcome is None:
                self._apply(build, build.pending.popleft())

    def _start(self, build: ProgramBuild) -> None:
        self.active = build
        # forget_closed: the monitor keeps what its checks and answers read (the open phases,
        # the cancel, the end), not every phase a long run makes; the views' model keeps theirs.
        monitor = BuildMonitor(log=self.log, attributes=build.attributes, forget_closed=True)
        build.monitor = self.latest = monitor
        # The build began when the program called it, not when its message arrived.
        monitor.start_at(*build.began, "MainThread")
        self._say(_describe(build))

        def pass_cancel_on(event: CancelRequested) -> None:
            build.process.send(("cancel", build.number))
            if event.source != PROGRAM_SOURCE:
                build.cancelled_at = time.monotonic()

        monitor.on_cancel(pass_cancel_on)
        for listener in self.listeners:
            stop = listener(monitor, build.process.pid)
            if stop is not None:
                build.on_finish.append(stop)
        if self._cancel_everything is not None:
            reason, source, timeout = self._cancel_everything
            monitor.cancel(reason, source=source, timeout=timeout)
        else:
            policy = self._policy()
            if policy is not None:
                build.runner = PolicyRunner(monitor, policy, warn=self._warn)
                build.runner.start()
        self.changed.notify_all()

    def _apply(self, build: ProgramBuild, message: tuple[Any, ...]) -> None:
        monitor = build.monitor
        assert monitor is not None
        if message[0] != "records":
            return
        _, _, records, callbacks, callback_ns = message
        callbacks_run: list[tuple[Any, ...]] = []  # taken together, in one batch of the log
        for record in records:
            kind = record[0]
            if kind not in ("own_cancel", "interrupt", "done"):
                callbacks_run.append(record)
                continue
            monitor.record(callbacks_run)
            callbacks_run = []
            if kind == "own_cancel":
                monitor.cancel(
                    f"the program's own progress monitor {record[4]}", source=PROGRAM_SOURCE
                )
            elif kind == "interrupt":
                monitor.cancel("the program was interrupted (SIGINT)", source=CancelSource.SIGNAL)
            else:
                self._end(build, record)
        monitor.record(callbacks_run)
        # The cost that matters is the callbacks' own, in the program.
        monitor.callbacks_total, monitor.callback_ns_total = callbacks, callback_ns

    def _end(self, build: ProgramBuild, record: tuple[Any, ...]) -> None:
        monitor = build.monitor
        assert monitor is not None
        _, wall_ns, mono_ns, thread, returned, error, error_type = record
        cancel = monitor.state.cancel
        detail = ""
        if error is not None:
            outcome, detail = Outcome.FAILURE, str(error)
        elif returned:
            outcome = Outcome.SUCCESS
        elif cancel is not None:
            outcome = Outcome.TIMEOUT if cancel.timeout else Outcome.CANCELLATION
        else:
            outcome, detail, error_type = (
                Outcome.FAILURE,
                "TensorRT returned no engine",
                "BuildFailed",
            )
        monitor.record([("end", wall_ns, mono_ns, thread, outcome.value, detail, error_type)])
        self._finish(build)

    def _finish(self, build: ProgramBuild) -> None:
        monitor = build.monitor
        assert monitor is not None
        if build.runner is not None:
            build.runner.stop()
        for stop in build.on_finish:
            stop()
        self.log.remove_fold(monitor.state.apply)
        build.outcome = monitor.state.outcome
        assert build.outcome is not None
        self.outcomes[build.outcome] += 1
        self.changed.notify_all()

    # -- from the command ----------------------------------------------------------------------

    def cancel_all(self, reason: str, source: str, *, timeout: bool = False) -> None:
        """Cancel the build being made and every later one, as soon as it begins (``timeout``:
        as a timeout, a scheduler's time limit)."""
        with self._lock:
            if self._cancel_everything is None:
                self._cancel_everything = (reason, source, timeout)
            builds = [self.active, *self._queue]
            monitors = [b.monitor for b in builds if b is not None and b.monitor is not None]
        for monitor in monitors:
            monitor.cancel(reason, source=source, timeout=timeout)

    def overdue(self, grace_s: float) -> ProgramBuild | None:
        """The build that was cancelled more than ``grace_s`` ago and is still going."""
        with self._lock:
            build = self.active
            if (
                build is not None
                and build.outcome is None
                and build.stopped_with is None
                and build.cancelled_at is not None
                and time.monotonic() - build.cancelled_at >= grace_s
            ):
                return build
            return None

    def end_unfinished(self, describe: Callable[[ProgramBuild], tuple[Outcome, str, str]]) -> None:
        """End the builds whose process ended before they did; ``describe`` says how."""
        with self._lock:
            while self.active is not None and self.active.outcome is None:
                build = self.active
                assert build.monitor is not None
                outcome, detail, error_type = describe(build)
                build.monitor.end(outcome, detail, error_type=error_type)
                self._finish(build)
                self._advance()

    @property
    def cancelled_by_us(self) -> bool:
        """Whether trt-otel (a policy, a signal, an HTTP request) cancelled a build."""
        return any(
            b.monitor is not None
            and b.monitor.state.cancel is not None
            and b.monitor.state.cancel.source != PROGRAM_SOURCE
            for b in self.all
        )


def _describe(build: ProgramBuild) -> str:
    a = build.attributes
    inputs = a.get("network.inputs")
    parts = [f"build {build.index}: {a.get('network.name', 'a network')!r}"]
    if "network.layers" in a:
        parts.append(f"{a['network.layers']} layers")
    if inputs:
        parts.append("inputs " + ", ".join(map(str, inputs)))
    parts.append(f"{a.get('trt.backend', '?')} {a.get('trt.version', '?')}")
    parts.append(f"pid {build.process.pid}")
    return "; ".join(parts)


# -- the socket ------------------------------------------------------------------------------


class ProgramChannel:
    """The Unix socket the program's processes connect to, in a directory only this user can
    read, with an authentication key passed in the program's environment."""

    def __init__(self, builds: ProgramBuilds, warn: Say) -> None:
        self._builds = builds
        self._warn = warn
        self.directory = Path(tempfile.mkdtemp(prefix="trt-otel-run-"))
        self.address = str(self.directory / "socket")
        self._authkey = secrets.token_bytes(32)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self._authkey)
        self.processes: list[ProgramProcess] = []
        self._readers: list[threading.Thread] = []
        self._closed = False
        self._acceptor = threading.Thread(
            target=self._accept, name="trt-otel-run-accept", daemon=True
        )
        self._acceptor.start()

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The program's environment: the bootstrap first on its path, and where to connect."""
        env = dict(base)
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + path if path else "")
        env[SOCKET_ENV] = self.address
        env[AUTHKEY_ENV] = self._authkey.hex()
        return env

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            except Exception as error:  # a failed handshake: someone else's process
                self._warn(f"refused a connection to the run's socket ({error})")
                continue
            reader = threading.Thread(
                target=self._read, args=(connection,), name="trt-otel-run-reader", daemon=True
            )
            self._readers.append(reader)
            reader.start()

    def _read(self, connection: Connection) -> None:
        process: ProgramProcess | None = None
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                return
            except Exception as error:  # torn by the process's death, most likely
                self._warn(f"unreadable message from the program ({error})")
                return
            try:
                if message[0] == "hello":
                    process = ProgramProcess(connection, int(message[1]), list(message[2]))
                    self.processes.append(process)
                elif process is not None:
                    self._builds.handle(process, message)
            except Exception:
                _logger.exception("trt-otel run: a message of the program could not be handled")

    def drain(self, timeout_s: float) -> bool:
        """Wait until every connection was read to its end; True if all were."""
        deadline = time.monotonic() + timeout_s
        for reader in list(self._readers):
            reader.join(max(0.0, deadline - time.monotonic()))
        return not any(reader.is_alive() for reader in self._readers)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for process in self.processes:
            with contextlib.suppress(OSError):
                process.connection.close()
        shutil.rmtree(self.directory, ignore_errors=True)


# -- the views made for one build ----------------------------------------------------------------


class CurrentBuild:
    """The build being made (else the last one made), for the views written for one build: the
    HTTP view and the Prometheus collector read what they read of a :class:`BuildMonitor`
    here, and ``POST /cancel`` cancels the build being made.

    Its state is the latest build's monitor's (no fold of its own: one build is folded once).
    """

    def __init__(self, builds: ProgramBuilds, run_id: str) -> None:
        self.builds = builds
        self.log = builds.log
        self._before_any = BuildState()
        self._run_id = run_id

    @property
    def state(self) -> BuildState:
        latest = self.builds.latest
        return self._before_any if latest is None else latest.state

    model = None
    """Not folded by a read model of its own (see :attr:`BuildMonitor.model`): the run's read
    model follows the log."""

    def _monitor(self) -> BuildMonitor | None:
        active = self.builds.active
        return active.monitor if active is not None else None

    @property
    def build_id(self) -> str:
        """The current build's id; the run's own before the first build."""
        return self.state.build_id or self._run_id

    @property
    def cancelled(self) -> bool:
        return self.state.cancel is not None

    def cancel(
        self,
        reason: str,
        *,
        source: str = CancelSource.USER,
        timeout: bool = False,
        policy: str = "",
    ) -> bool:
        monitor = self._monitor()
        if monitor is None or monitor.state.outcome is not None:
            return False
        return monitor.cancel(reason, source=source, timeout=timeout, policy=policy)

    @property
    def callbacks_total(self) -> int:
        return sum(b.monitor.callbacks_total for b in self.builds.all if b.monitor is not None)

    @property
    def callback_ns_total(self) -> int:
        return sum(b.monitor.callback_ns_total for b in self.builds.all if b.monitor is not None)

    @property
    def internal_errors(self) -> int:
        return sum(b.monitor.internal_errors for b in self.builds.all if b.monitor is not None)


class RunCollector(Collector):
    """``trt_run_builds_total{outcome}`` and ``trt_run_builds_started_total``: how many builds
    the program made, and how they ended (read at scrape time)."""

    def __init__(self, builds: ProgramBuilds) -> None:
        self.builds = builds

    def collect(self) -> Iterable[Metric]:
        started = CounterMetricFamily(
            "trt_run_builds_started", "Builds the observed program has begun"
        )
        started.add_metric([], len(self.builds.all))
        yield started
        finished = CounterMetricFamily(
            "trt_run_builds",
            "Builds of the observed program that ended, by outcome",
            labels=["outcome"],
        )
        for outcome in Outcome:
            finished.add_metric([outcome.value], self.builds.outcomes.get(outcome, 0))
        yield finished
