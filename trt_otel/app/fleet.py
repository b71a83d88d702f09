"""Builds run as their own ``trt-otel`` processes, found again through a state directory.

Each build started here is a ``trt-otel build`` or ``trt-otel demo`` process of its own, in a
session of its own (so it outlives whoever started it), with its HTTP view on loopback, its
journal, and its output in a folder of the state directory::

    STATE/ID/build.json    what was started: the command line, the process id, when
    STATE/ID/token         the build's cancel token (0600)
    STATE/ID/journal.jsonl the build's journal
    STATE/ID/output.log    what the process printed (its HTTP address, its errors)

Nothing else is kept: whoever reads the folder later (another process, after a restart) knows
what this one knew. A build is *running* while its process lives, and its outcome is the one its
journal records; a process gone without one is *lost*, and one that stopped before its build
began *failed to start* (its output says why).

What a caller names is confined: every string is bounded (checked before any work, and never
echoed whole), a build's folder comes from its id only through :meth:`Fleet.folder` (12 hex
digits), every path a request names (the model, the output, a path option) must resolve, symlinks
resolved, inside one of the fleet's roots, and an output that exists is replaced only when the
request says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import ipaddress
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import msgspec
import psutil
from msgspec.structs import replace

from trt_otel.app.commands import build_parser, command_of
from trt_otel.app.config import UsageError
from trt_otel.app.engine_store import store_status
from trt_otel.app.fleet_documents import (
    ENDED,
    AttemptStatus,
    BuildRequest,
    BuildStatus,
    BuildSummary,
    CancelAnswer,
    CancelNote,
    EventsPage,
    FitAnswer,
    ForecastStatus,
    OpenPhase,
    State,
    StoreStatus,
    WaitAnswer,
)
from trt_otel.app.retries import MAX_RUNG_CHARS, MAX_RUNGS, rung_paths
from trt_otel.app.session import exit_code_of
from trt_otel.capture.checked import CheckedEvents, read_journal
from trt_otel.control.deadline import would_fit
from trt_otel.control.policies import MAX_REASON
from trt_otel.control.stopping import process_running
from trt_otel.core import outbound
from trt_otel.core.attempts import attempt_of
from trt_otel.core.builds import PerBuild
from trt_otel.core.deadlines import Deadline
from trt_otel.core.durations import DurationError, parse_positive_duration
from trt_otel.core.eta import History
from trt_otel.core.events import BuildFinished, BuildStarted, CancelRequested, Event
from trt_otel.core.files import open_regular_for_reading
from trt_otel.core.forecast import forecast_status
from trt_otel.core.journal import (
    MAX_HEADER_BYTES,
    JournalError,
    LineReader,
    event_to_dict,
    parse_header,
)
from trt_otel.core.outbound import Answer
from trt_otel.core.state import BuildState
from trt_otel.views.status import Builder, Estimate, Projection

T = TypeVar("T")

KINDS = ("build", "demo")
RESERVED_OPTIONS = ("-h", "--help", "--version")
"""Options that would not start a build."""
RESERVED_SETTINGS = {
    "http_port": "--http-port",
    "http_address": "--http-address",
    "http_url_file": "--http-url-file",
    "http_allowed_host": "--http-allowed-host",
    "journal": "--journal",
    "cancel_token": "--cancel-token",
    "output": "--output",
}
"""What the fleet sets itself, by the parser's names for them: an option is refused by what
the parser makes of it (``-o/x``, ``--output=x``), never by its spelling."""
NETWORK_SETTINGS = {
    "otlp_endpoint": "--otlp-endpoint",
    "cancel_url": "--cancel-url",
    "pushgateway": "--pushgateway",
    "prometheus_port": "--prometheus-port",
    "prometheus_address": "--prometheus-address",
}
"""Options that make a build reach the network where the caller says: send its spans or metrics
to a URL, poll one, or listen on a port or an address. A client of the MCP server may not set
them unless the server was started with ``--allow-network-options``: otherwise only the server's
own settings (its ``OTEL_*`` environment) apply. Checked, like the reserved settings, by what
the parser makes of the options."""
ALLOW_NETWORK = "--allow-network-options"
STARTUP_S = 30.0
_URL = re.compile(r"http://(127\.0\.0\.1|\[::1\]|localhost):\d{1,5}")
URL_FILE = "http.url"
_ID = re.compile(r"[0-9a-f]{12}")
"""A build's id, and its folder's name: matched whole (``fullmatch``), so nothing else (``..``,
a ``/``, a NUL, a newline) ever becomes a path."""

MAX_ID_CHARS = 64
MAX_PATH_CHARS = 4096
MAX_OPTIONS = 64
MAX_OPTION_CHARS = 4096
MAX_REASON_CHARS = MAX_REASON
MAX_EVENTS = 1000
MAX_DURATION_CHARS = 32
"""The bounds on what a caller sends: the length of each string, the number of options, the
events one call returns."""
_SHOWN_CHARS = 40


class FleetError(Exception):
    """A request the fleet cannot carry out; the message says why, for the caller."""


@dataclass(frozen=True, slots=True)
class Record:
    """What ``build.json`` holds: a build as it was started."""

    id: str
    kind: str
    argv: list[str]
    pid: int
    started_wall_s: float
    model: str | None
    engine: str | None


class Fleet:
    """The builds of one state directory."""

    def __init__(
        self,
        state_dir: Path,
        *,
        roots: Sequence[Path] | None = None,
        allow_network: bool = False,
        python: str = sys.executable,
    ) -> None:
        self.state_dir = state_dir
        self.allow_network = allow_network
        """Whether a request may set the :data:`NETWORK_SETTINGS` (off by default)."""
        self.roots = tuple(_resolved(root) for root in roots or (state_dir, Path.cwd()))
        """Where the paths a request names must lie (resolved): by default the state directory
        and the working directory."""
        self.python = python
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._folds: dict[str, JournalFold] = {}
        """Each build's journal, folded as it grows (status is asked for often)."""
        """Processes started by this one, to reap them (the folders are what counts)."""

    # -- starting --------------------------------------------------------------------------

    def start(self, request: BuildRequest) -> BuildStatus:
        """Check the request as the command line would, start the build, and return its
        status once its process has announced its HTTP view (or has stopped). The model, the
        output and every path option (a retry's too) must lie inside a root; an output that
        exists is replaced only with ``overwrite``. ``deadline`` and ``retries`` are
        ``--deadline`` and the ``--retry`` rungs."""
        # The bounds first: nothing else looks at a request that breaks them.
        options = bounded_request(request)
        kind, model, output = request.kind, request.model, request.output
        model_path = self._model_path(model) if model is not None else None
        if kind == "build" and model_path is None:
            raise FleetError("a build needs a model: the path of an ONNX file")
        refuse_reserved(options, "the server")
        build_id = secrets.token_hex(6)
        folder = self.folder(build_id)
        engine = str(self._output_path(output, overwrite=request.overwrite)) if output else None
        argv = [kind]
        if kind == "build":
            assert model_path is not None
            engine = engine or str(folder / "model.engine")
            argv += [str(model_path), "--output", engine]
        else:
            if model_path is not None:
                argv += ["--model", str(model_path)]
            if engine is not None:
                argv += ["--output", engine]
        checked_settings(
            kind,
            argv,
            options,
            reserved=RESERVED_SETTINGS,
            setter="the server",
            allow_network=self.allow_network,
            loopback_only=True,  # whatever is allowed: the builds serve on this machine only
            inside=self._inside,
        )
        journal, url_file = folder / "journal.jsonl", folder / URL_FILE
        argv += [*options, "--no-progress", "--http-port", "0", "--journal", str(journal)]
        argv += ["--http-url-file", str(url_file)]
        check_command_line(argv)
        try:
            return self._launch(build_id, kind, argv, model_path, engine)
        except OSError as error:  # an unwritable state directory, a full disk
            raise FleetError(f"cannot start a build in {folder}: {error}") from None

    def fit(self, model: str, deadline: str, history: str) -> FitAnswer:
        """Whether a build of ``model`` would end within ``deadline``, from the journals of
        earlier builds in ``history`` (both inside a root): ``--deadline``'s own rule, and
        nothing is built."""
        return would_it_fit(model, deadline, history, self._model_path, self._inside)

    def _model_path(self, model: str) -> Path:
        path = self._inside("model", Path(model).expanduser().absolute())
        try:
            mode = path.stat().st_mode  # resolved: no link left to follow
        except FileNotFoundError:
            raise FleetError(f"model not found: {path}") from None
        except OSError as error:
            raise FleetError(f"model {path}: {error.strerror}") from None
        if not stat.S_ISREG(mode):
            raise FleetError(f"model is not a regular file: {path}")
        if not os.access(path, os.R_OK):
            raise FleetError(f"model is not readable: {path}")
        return path

    def _output_path(self, output: str, *, overwrite: bool) -> Path:
        """Where the engine goes: inside a root, outside the builds' folders, and not over a
        file that exists (unless ``overwrite``) nor over the engine of a running build."""
        given = Path(output).expanduser().absolute()
        path = self._inside("output", given)
        state = _resolved(self.state_dir)
        if path.is_relative_to(state):
            parts = path.relative_to(state).parts
            if parts and _ID.fullmatch(parts[0]):
                raise FleetError(
                    f"output {path} is in the folder of build {parts[0]}, which holds its "
                    "records; choose another path"
                )
        if not overwrite and (os.path.lexists(given) or os.path.lexists(path)):
            raise FleetError(
                f"output {path} exists; it is replaced only when the call says so (overwrite: true)"
            )
        for other in self.ids():
            try:
                record = self._record(other)
            except FleetError:
                continue
            if record.engine and _resolved(Path(record.engine)) == path and self._alive(record):
                raise FleetError(f"output {path} is the engine of build {other}, still running")
        return path

    def _inside(self, name: str, path: Path) -> Path:
        """``path`` resolved (symlinks followed), if that lies inside a root."""
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError) as error:  # a loop of symlinks
            raise FleetError(f"{name} {path}: cannot resolve it ({error})") from None
        if not any(resolved.is_relative_to(root) for root in self.roots):
            raise FleetError(
                f"{name} {resolved} is outside the server's roots "
                f"({', '.join(map(str, self.roots))}): a path must resolve, symlinks "
                "followed, inside one (trt-otel mcp --root DIR adds one)"
            )
        return resolved

    def _launch(
        self, build_id: str, kind: str, argv: list[str], model_path: Path | None, engine: str | None
    ) -> BuildStatus:
        folder = self.folder(build_id)
        folder.mkdir(parents=True, exist_ok=False)
        token = secrets.token_urlsafe(32)
        token_file = folder / "token"
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(token + "\n")
        with open(folder / "output.log", "wb") as log:
            process = subprocess.Popen(
                [self.python, "-m", "trt_otel.app.cli", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TRT_OTEL_CANCEL_TOKEN": token},
                start_new_session=True,  # it outlives this process and its terminal's signals
            )
        self._children[process.pid] = process
        record = Record(
            id=build_id,
            kind=kind,
            argv=argv,
            pid=process.pid,
            started_wall_s=time.time(),
            model=str(model_path) if model_path is not None else None,
            engine=engine,
        )
        temporary = folder / "build.json.tmp"
        temporary.write_text(json.dumps(dataclasses.asdict(record)))
        temporary.replace(folder / "build.json")
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self._url(folder) is not None or not self._alive(record):
                break
            time.sleep(0.05)
        status = self.status(build_id)
        if status.state == "failed_to_start":
            raise FleetError(f"the build did not start: {status.error}")
        return status

    # -- reading ---------------------------------------------------------------------------

    def ids(self) -> list[str]:
        if not self.state_dir.is_dir():
            return []
        found = [
            (folder.stat().st_mtime, folder.name)
            for folder in self.state_dir.iterdir()
            if _ID.fullmatch(folder.name) and (folder / "build.json").is_file()
        ]
        return [name for _, name in sorted(found)]

    def list(self) -> list[BuildSummary]:
        return [BuildSummary.of(self.status(i, live=False)) for i in self.ids()]

    def status(self, build_id: str, *, live: bool = True) -> BuildStatus:
        """The build as one document: from its journal, and from its HTTP view while it runs
        (the view has the estimates and the phase tree)."""
        folder = self.folder(build_id)
        record = self._record(build_id)
        alive = self._alive(record)
        fold = self._folds.get(build_id)
        if fold is None:
            fold = self._folds[build_id] = JournalFold(folder / "journal.jsonl")
        state = fold.update()
        url = self._url(folder)
        lifecycle, error = _lifecycle(state, alive, url, fold.attempts, folder)
        status = journal_status(
            state,
            fold.attempts,
            id=build_id,
            kind=record.kind,
            state=lifecycle,
            model=record.model,
            engine=record.engine,
            journal=str(folder / "journal.jsonl"),
            error=error,
            url=url,
            page=f"{url}/" if url else None,
            started_wall_s=record.started_wall_s,
        )
        if live and alive and url is not None and state.outcome is None:
            view = _get_json(f"{url}/status")
            if view is not None:
                status = _with_view(status, view)
        return status

    def events(self, build_id: str, since_seq: int = -1, limit: int = 200) -> EventsPage:
        """Events after ``since_seq``, from the journal: ``limit`` of them at most (1 to
        :data:`MAX_EVENTS`; any other limit is refused, not clamped)."""
        folder = self.folder(build_id)
        if not 1 <= limit <= MAX_EVENTS:
            raise FleetError(f"limit must be 1 to {MAX_EVENTS}")
        self._record(build_id)
        return events_page(_journal_events(folder / "journal.jsonl"), since_seq, limit)

    def wait(self, build_id: str, until: str = "progress", timeout_s: float = 30.0) -> WaitAnswer:
        """Wait until the build progresses (a step, a phase, a cancel, its end) or ends, or
        ``timeout_s`` passes; the build's status and what happened."""
        self.folder(build_id)
        if not 0 <= timeout_s <= 600:
            raise FleetError("timeout_s must be between 0 and 600 seconds")
        return wait_for(lambda: self.status(build_id), until, timeout_s, poll_s=0.25)

    # -- cancelling ------------------------------------------------------------------------

    def cancel(self, build_id: str, reason: str = "") -> CancelAnswer:
        folder = self.folder(build_id)
        check_text("reason", reason, MAX_REASON_CHARS)
        record = self._record(build_id)
        status = self.status(build_id, live=False)
        if status.state not in ("running", "cancelling", "starting"):
            raise FleetError(f"build {build_id} is not running ({status.state})")
        deadline = time.monotonic() + STARTUP_S
        url = self._url(folder)
        while url is None and self._alive(record) and time.monotonic() < deadline:
            time.sleep(0.05)
            url = self._url(folder)
        if url is None:
            raise FleetError(f"build {build_id} has no HTTP view to cancel it through")
        token = (folder / "token").read_text().strip()
        try:
            code, answer = _post_cancel(url, token, reason or "cancelled through MCP")
        except (OSError, ValueError, http.client.HTTPException) as error:
            raise FleetError(f"cannot reach build {build_id}: {error}") from None
        if code == 409:
            raise FleetError(f"build {build_id} has already ended")
        if code not in (200, 202):
            raise FleetError(f"the build refused the cancel: HTTP {code}")
        reason_said = answer.get("reason")
        return CancelAnswer(
            id=build_id,
            accepted=True,
            first=code == 202,
            reason=reason_said if isinstance(reason_said, str) else None,
            note="TensorRT stops at its next step; a build silent longer than its grace "
            "period is stopped from outside. wait_build(until='end') follows it.",
        )

    # -- internals -------------------------------------------------------------------------

    def folder(self, build_id: str) -> Path:
        """The folder of build ``build_id``, the only way from an id to a path: 12 hex digits,
        matched whole, so no id leaves the state directory (``../x``, ``/x``, a NUL)."""
        check_text("id", build_id, MAX_ID_CHARS)
        if not _ID.fullmatch(build_id):
            raise FleetError(f"no build {_shown(build_id)} (ids are 12 hex digits)")
        return self.state_dir / build_id

    def _record(self, build_id: str) -> Record:
        path = self.folder(build_id) / "build.json"
        try:
            return Record(**json.loads(_read_regular(path, 1 << 20)))
        except FileNotFoundError:
            raise FleetError(f"no build {build_id!r} in {self.state_dir}") from None
        except (OSError, ValueError, TypeError) as error:
            raise FleetError(f"cannot read {path}: {_shown(str(error), 200)}") from None

    def _alive(self, record: Record) -> bool:
        child = self._children.get(record.pid)
        if child is not None:
            if child.poll() is None:  # also reaps it once it has ended
                return True
            del self._children[record.pid]
            return False
        # Not ours (started before a restart): its process, if the pid still names it (the
        # build's id is on its command line).
        if not process_running(record.pid):
            return False
        try:
            return any(record.id in part for part in psutil.Process(record.pid).cmdline())
        except psutil.Error:
            return False

    def _url(self, folder: Path) -> str | None:
        """The build's HTTP view, as the build wrote it (``--http-url-file``): a loopback URL, or
        None until it serves (and for anything else)."""
        try:
            with open_regular_for_reading(folder / URL_FILE, "URL file") as written:
                text = written.read(256).decode("ascii", "replace").strip()
        except OSError:
            return None
        return text if _URL.fullmatch(text) else None


def _lifecycle(
    state: BuildState,
    alive: bool,
    url: str | None,
    attempts: Sequence[AttemptStatus],
    folder: Path,
) -> tuple[State, str | None]:
    """Where a build is in its life, from its journal and its process, and the error of one
    that stopped without an end."""
    if state.outcome is not None and alive and _more_attempts(attempts):
        return "retrying", None  # a ladder's attempt ended; the next may follow
    if state.outcome is not None:
        return "finished", None
    if alive:
        if state.build_id is None and url is None:
            return "starting", None
        return "cancelling" if state.cancel is not None else "running", None
    if state.build_id is None:
        return "failed_to_start", _last_error(folder / "output.log")
    return "lost", "the build's process ended before its journal recorded an end"


def _more_attempts(attempts: Sequence[AttemptStatus]) -> bool:
    """Whether a retry ladder's latest attempt, ended, may have one after it."""
    return bool(attempts) and attempts[-1].number < attempts[-1].of


def journal_status(
    state: BuildState, attempts: Sequence[AttemptStatus], /, **fleets: Any
) -> BuildStatus:
    """A build's status as its journal (folded into ``state``) tells it, with what the fleet
    knows of it (``fleets``: its id, kind, state, paths and the fleet's own fields)."""
    elapsed_s = None
    if state.start_mono_ns is not None and state.end_mono_ns is not None:
        elapsed_s = (state.end_mono_ns - state.start_mono_ns) / 1e9
    cancel = state.cancel
    return BuildStatus(
        build_id=state.build_id,
        last_seq=state.last_seq,
        progress=state.progress_ratio(),
        steps_completed=state.steps_completed_total,
        elapsed_s=elapsed_s,
        outcome=state.outcome.value if state.outcome is not None else None,
        exit_code=exit_code_of(state.outcome) if state.outcome is not None else None,
        detail=state.outcome_detail or None,
        cancel=CancelNote(cancel.reason, cancel.source) if cancel is not None else None,
        builder=_typed(state.activity.as_json(), Builder),
        forecast=_typed(forecast_status(state), ForecastStatus),
        store=_typed(store_status(state.attributes), StoreStatus),
        attempts=list(attempts),
        **fleets,
    )


def _with_view(status: BuildStatus, view: dict[str, Any]) -> BuildStatus:
    """``status`` with what the build's own HTTP view says of it while it runs (its estimates,
    its open phases, its GPU); the view's answer is checked for what it is, field by field."""
    steps = view.get("steps_completed")
    progress = _number(view.get("progress"))
    elapsed_s = _number(view.get("elapsed_s"))
    return msgspec.structs.replace(
        status,
        state="cancelling" if view.get("status") == "cancelling" else "running",
        progress=status.progress if progress is None else progress,
        steps_completed=steps if type(steps) is int else status.steps_completed,
        elapsed_s=status.elapsed_s if elapsed_s is None else elapsed_s,
        eta=_typed(view.get("eta"), Estimate),
        open_phases=_open_path(view.get("phases")),
        gpu=view.get("gpu") if isinstance(view.get("gpu"), dict) else None,
        builder=_typed(view.get("builder"), Builder) or status.builder,
        projection=_typed(view.get("projection"), Projection),
    )


def _typed(value: object, document: type[T]) -> T | None:
    """``value`` (a JSON object) as ``document``, or None where it is none or is not one."""
    if value is None:
        return None
    try:
        return msgspec.convert(value, document)
    except msgspec.ValidationError:
        return None


def _number(value: object) -> float | None:
    """A JSON number as a float; None for anything else (a bool is no number)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def events_page(events: Sequence[Event], since_seq: int, limit: int) -> EventsPage:
    """The events after ``since_seq``, ``limit`` of them at most, as journal records."""
    after = [e for e in events if e.seq > since_seq]
    chosen = after[:limit]
    return EventsPage(
        events=[event_to_dict(e) for e in chosen],
        next_seq=chosen[-1].seq if chosen else since_seq,
        more=len(after) > len(chosen),
    )


def wait_for(
    status_of: Callable[[], BuildStatus], until: str, timeout_s: float, *, poll_s: float
) -> WaitAnswer:
    """Until the build (``status_of``) progresses (a step, a phase, a cancel, its end) or ends
    (``until``), or ``timeout_s`` passes: what happened, and its status then."""
    if until not in ("progress", "end"):
        raise FleetError("until is 'progress' or 'end'")
    current = status_of()
    baseline = _progress_key(current)
    deadline = time.monotonic() + timeout_s
    while True:
        if current.state in ENDED:
            return WaitAnswer("ended", current)
        if until == "progress" and _progress_key(current) != baseline:
            return WaitAnswer("progressed", current)
        if time.monotonic() >= deadline:
            return WaitAnswer("timeout", current)
        time.sleep(poll_s)
        current = status_of()


def would_it_fit(
    model: str,
    deadline: str,
    history: str,
    model_path_of: Callable[[str], Path],
    inside: Callable[[str, Path], Path],
) -> FitAnswer:
    """MCP's ``will_it_fit`` for a fleet whose ``model_path_of`` and ``inside`` confine the
    model and the history folder: ``--deadline``'s own rule, from the journals of earlier
    builds, and nothing is built."""
    check_text("model", model, MAX_PATH_CHARS)
    check_text("deadline", deadline, MAX_DURATION_CHARS)
    check_text("history", history, MAX_PATH_CHARS)
    try:
        limit_s = parse_positive_duration(deadline)
    except DurationError as error:
        raise FleetError(f"deadline: {error}") from None
    model_path = model_path_of(model)
    folder = inside("history", Path(history).expanduser().absolute())
    if not folder.is_dir():
        raise FleetError(f"history is not a directory of journals: {folder}")
    try:
        with open_regular_for_reading(model_path, "model") as handle:
            hasher = hashlib.sha256()
            while chunk := handle.read(1 << 20):
                hasher.update(chunk)
            digest = hasher.hexdigest()
    except OSError as error:
        raise FleetError(f"model {model_path}: {error.strerror or error}") from None
    earlier = History.load(folder, attributes={"model.sha256": digest}, read=read_journal)
    fit = would_fit(earlier, limit_s)
    projection = fit.projection
    return FitAnswer(
        answer=fit.answer,
        reason=fit.reason,
        deadline_s=limit_s,
        builds=fit.builds,
        within=fit.within,
        journals_not_used=len(earlier.skipped),
        projection=_typed(dataclasses.asdict(projection), Projection) if projection else None,
    )


def bounded_request(request: BuildRequest) -> list[str]:
    """A start request's bounds and kind (the local fleet's and Ray's), checked before
    anything looks at it; its options with ``--deadline`` and the ``--retry`` rungs added."""
    check_text("kind", request.kind, max(map(len, KINDS)))
    if request.kind not in KINDS:
        raise FleetError(f"kind must be one of {', '.join(KINDS)}, not {request.kind!r}")
    for name, value in (("model", request.model), ("output", request.output)):
        if value is not None:
            check_text(name, value, MAX_PATH_CHARS)
    check_options(request.options)
    return [*request.options, *ladder_options(request.deadline, request.retries)]


def refuse_reserved(options: Sequence[str], setter: str) -> None:
    """Refuse the options the fleet sets itself (:data:`RESERVED_OPTIONS`), however given
    (``--version`` or ``--version=x``); ``setter`` says who sets them."""
    for option in options:
        name = option.split("=", 1)[0]
        if name in RESERVED_OPTIONS:
            raise FleetError(f"{name} is set by {setter}; leave it out")


def ladder_options(deadline: str | None, retries: Sequence[str]) -> list[str]:
    """``--deadline`` and the ``--retry`` rungs of a request, bounded and checked here (the
    command line checks them again with the rest)."""
    added: list[str] = []
    if deadline is not None:
        check_text("deadline", deadline, MAX_DURATION_CHARS)
        try:
            parse_positive_duration(deadline)
        except DurationError as error:
            raise FleetError(f"deadline: {error}") from None
        added += ["--deadline", deadline]
    if len(retries) > MAX_RUNGS:
        raise FleetError(f"retries has {len(retries):,} rungs; at most {MAX_RUNGS}")
    for index, rung in enumerate(retries):
        check_text(f"retries[{index}]", rung, MAX_RUNG_CHARS)
        added.append(f"--retry={rung}")  # one token: a rung of one flag is no option of ours
    return added


def checked_settings(
    kind: str,
    argv: list[str],
    options: Sequence[str],
    *,
    reserved: Mapping[str, str],
    setter: str,
    allow_network: bool,
    loopback_only: bool = False,
    inside: Callable[[str, Path], Path],
) -> argparse.Namespace:
    """The command line ``argv`` with a request's ``options``, as trt-otel's parser reads it
    (the local fleet's and Ray's), if the options leave alone what ``setter`` sets
    (``reserved``, by the parser's names) and the request's model, point the build at the
    network only where ``allow_network`` (and serve on loopback alone, ``loopback_only``), and
    name paths (a retry rung's too) that ``inside``
    confines."""
    # What the options make of the settings the fleet owns, against the command without them:
    # the parser's reading, whatever the spelling (``-o/x``, ``--output=x``).
    theirs, ours = check_command_line([*argv, *options]), check_command_line(argv)
    for name, option in reserved.items():
        if getattr(theirs, name, None) != getattr(ours, name, None):
            raise FleetError(f"{option} is set by {setter}; leave it out")
    if getattr(theirs, "model", None) != getattr(ours, "model", None):
        raise FleetError("the model is the request's model argument; leave --model out")
    if loopback_only:
        _check_loopback(theirs)
    check_network(theirs, ours, allowed=allow_network)
    # Every other path the options name (a timing cache, a trace, a cancel file, a history):
    # confined too, as the build (in this working directory) will read it.
    for dest, option in path_options(kind):
        value = getattr(theirs, dest, None)
        if dest not in reserved and dest != "model" and value is not None:
            inside(option, Path(value).absolute())
    for rung in getattr(theirs, "retry", None) or ():
        for option, path in checked_rung_paths(rung):
            inside(f"--retry {option}", path.absolute())
    return theirs


def checked_rung_paths(rung: str) -> list[tuple[str, Path]]:
    try:
        return rung_paths(rung)
    except UsageError as error:
        raise FleetError(str(error)) from None


def check_network(theirs: argparse.Namespace, ours: argparse.Namespace, *, allowed: bool) -> None:
    """Refuse, unless ``allowed``, the :data:`NETWORK_SETTINGS` the request's options change
    from the server's own command line (``ours``), by what the parser made of them."""
    if allowed:
        return
    for name, option in NETWORK_SETTINGS.items():
        if getattr(theirs, name, None) != getattr(ours, name, None):
            raise FleetError(
                f"{option} would point the build at an address of the caller's choosing; this "
                f"server refuses it (its own OTEL_* settings apply; trt-otel mcp {ALLOW_NETWORK} "
                "allows it)"
            )


def check_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """Check a ``trt-otel`` command line with the command's own parser and checks: a bad one
    raises :class:`FleetError` with the command's message, and nothing is started. Returns what
    the parser made of it."""
    parser = build_parser()

    def refuse(message: str) -> NoReturn:
        raise FleetError(message)

    # argparse reports errors by printing and exiting; here they are the caller's answer.
    for sub in _subparsers(parser):
        sub.error = refuse  # type: ignore[method-assign]
    parser.error = refuse  # type: ignore[method-assign]
    args: argparse.Namespace = parser.parse_args(list(argv))
    try:
        command_of(args)
    except UsageError as error:
        raise FleetError(str(error)) from None
    return args


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.values())
    return found


def check_text(name: str, value: object, limit: int) -> None:
    """A caller's string: a string, at most ``limit`` characters, without a NUL (which no path
    or command line can carry). The refusal says how long it is, never what it holds."""
    if not isinstance(value, str):
        raise FleetError(f"{name} must be a string")
    if len(value) > limit:
        raise FleetError(f"{name} is {len(value):,} characters long; at most {limit:,}")
    if "\0" in value:
        raise FleetError(f"{name} holds a NUL character")


def check_options(options: Sequence[str]) -> None:
    """At most :data:`MAX_OPTIONS` options, each a bounded string."""
    if len(options) > MAX_OPTIONS:
        raise FleetError(f"options has {len(options):,} items; at most {MAX_OPTIONS}")
    for index, option in enumerate(options):
        check_text(f"options[{index}]", option, MAX_OPTION_CHARS)


def _shown(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` quoted for a message, cut at ``limit`` characters (and then says how long)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def _check_loopback(options: argparse.Namespace) -> None:
    """The server's builds serve on loopback only: their metrics too (what the build is, its
    model's path and phases), not on an interface a client chose."""
    address = getattr(options, "prometheus_address", None)
    if address is not None and not _loopback(address):
        raise FleetError(
            f"--prometheus-address {_shown(address)} is not a loopback address: the "
            "server's builds serve on this machine only (127.0.0.1, ::1 or localhost)"
        )


def _loopback(address: str) -> bool:
    """Whether ``address`` (an IP literal or ``localhost``) is this machine's loopback."""
    if address.strip().lower().removesuffix(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):
        return path.expanduser().absolute()


def path_options(kind: str) -> list[tuple[str, str]]:
    """The options of ``trt-otel KIND`` that name a path: (the parser's name, the option)."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and kind in action.choices:
            return [
                (option.dest, max(option.option_strings, key=lambda s: s.startswith("--")))
                for option in action.choices[kind]._actions
                if option.type is Path and option.option_strings
            ]
    return []


def _read_regular(path: Path, limit: int) -> str:
    """A small file of the state directory: a regular file (a FIFO there must not block the
    server), at most ``limit`` bytes."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f"{path} is not a regular file")
        return file.read(limit).decode("utf-8", "replace")


class JournalFold:
    """A build's journal folded as it grows: each call reads only what was added since the
    last (``wait_build`` asks for the status every 250 ms, and a journal can hold millions of
    steps). Starts again when the file is replaced or shrinks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._start()

    def _start(self) -> None:
        self._builds = PerBuild(lambda: BuildState(forget_closed=True))
        self.attempts: list[AttemptStatus] = []
        """A retry ladder's attempts so far (none outside one): each with how it ended."""
        self._reader = LineReader()
        self._checked: CheckedEvents | None = None
        """The header's reading of the events (None until the header is read)."""
        self._offset = 0
        self._identity: tuple[int, int] | None = None

    @property
    def state(self) -> BuildState:
        """The journal's latest build (a retry ladder's latest attempt)."""
        return self._builds.current

    def update(self) -> BuildState:
        """The state with every complete line of the journal folded in."""
        try:
            handle = open_regular_for_reading(self.path, "journal")
        except OSError:
            return self.state  # not written yet (or not a journal): what was read stands
        with handle:
            info = os.fstat(handle.fileno())
            identity = (info.st_dev, info.st_ino)
            if identity != self._identity or info.st_size < self._offset:
                self._start()
                self._identity = identity
            handle.seek(self._offset)
            checked = self._checked
            if checked is None:
                first = handle.readline(MAX_HEADER_BYTES)
                if not first.endswith(b"\n"):
                    return self.state  # the header is still being written
                self._offset += len(first)
                try:
                    header = parse_header(first, self.path)
                except JournalError:
                    header = {}  # read as it was before: its lines will not be events
                checked = self._checked = CheckedEvents(header)
            while chunk := handle.read(1 << 20):
                self._offset += len(chunk)
                read = [item for item in self._reader.feed(chunk) if isinstance(item, Event)]
                for event in checked.feed(read):
                    self._builds.fold_for(event).apply(event)
                    self._follow_attempts(event)
        return self.state

    def _follow_attempts(self, event: Event) -> None:
        if isinstance(event, BuildStarted):
            attempt = attempt_of(event.attributes)
            if attempt is not None:
                self.attempts.append(
                    AttemptStatus(build_id=event.build_id, **dataclasses.asdict(attempt))
                )
        elif self.attempts and self.attempts[-1].build_id == self.state.build_id:
            latest = self.attempts[-1]
            if isinstance(event, CancelRequested):
                latest = replace(latest, cancel=CancelNote(event.reason, event.source))
            elif isinstance(event, BuildFinished):
                latest = replace(
                    latest,
                    outcome=event.outcome.value,
                    exit_code=exit_code_of(event.outcome),
                    detail=event.detail or None,
                )
            self.attempts[-1] = latest


def _journal_events(path: Path) -> list[Event]:
    try:
        return read_journal(path).events
    except (OSError, JournalError):
        return []  # not written yet (or not at all)


STATUS_TIMEOUT_S = 5.0
CANCEL_TIMEOUT_S = 10.0
"""What one call to a build's HTTP view gets in all (connect, request, head and body)."""
MAX_ANSWER_BYTES = 16 << 20
"""The most of a build's HTTP answer read (its ``/status`` is far shorter)."""


def _call(request: urllib.request.Request | str, timeout_s: float) -> Answer:
    """One call to a build's HTTP view (on loopback: no proxy), within ``timeout_s`` in all,
    however slowly it answers (a build's process stopped or swapped out)."""
    with Deadline(timeout_s) as deadline:
        return outbound.call(request, deadline, max_bytes=MAX_ANSWER_BYTES, proxies=False)


def _get_json(url: str) -> dict[str, Any] | None:
    try:
        answer = _call(url, STATUS_TIMEOUT_S)
        document = json.loads(answer.body) if answer.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None  # the build has just ended, or is busy; the journal answers
    return document if isinstance(document, dict) else None


def _post_cancel(url: str, token: str, reason: str) -> tuple[int, dict[str, Any]]:
    """``POST /cancel`` to the build's HTTP view: its status, and its JSON answer (when 2xx)."""
    request = urllib.request.Request(
        f"{url}/cancel",
        data=json.dumps({"reason": reason}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    answer = _call(request, CANCEL_TIMEOUT_S)
    if not 200 <= answer.status < 300:
        return answer.status, {}
    document = json.loads(answer.body)
    return answer.status, document if isinstance(document, dict) else {}


def _open_path(phases: object) -> list[OpenPhase]:
    """The open phases of a ``/status`` tree, from the root to the innermost, each with its
    steps."""
    path: list[OpenPhase] = []
    level = phases
    while isinstance(level, list):
        open_ones = [p for p in level if isinstance(p, dict) and p.get("status") == "open"]
        if not open_ones:
            break
        phase = open_ones[-1]
        path.append(
            OpenPhase(
                str(phase.get("name")),
                f"{int(phase.get('last_step', -1)) + 1}/{phase.get('num_steps')}",
                _number(phase.get("elapsed_s")),
            )
        )
        level = phase.get("children")
    return path


def _progress_key(status: BuildStatus) -> tuple[object, ...]:
    return (status.state, status.steps_completed, status.last_seq, status.cancel is not None)


def _last_error(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[-1]
