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

import dataclasses
import http.client
import json
import os
import re
import secrets
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import psutil

from trt_otel.app.fleet_documents import (
    AttemptStatus,
    BuildRequest,
    BuildStatus,
    BuildSummary,
    CancelAnswer,
    EventsPage,
    FitAnswer,
    State,
    WaitAnswer,
)
from trt_otel.app.fleet_requests import (
    MAX_EVENTS,
    MAX_ID_CHARS,
    MAX_REASON_CHARS,
    RESERVED_SETTINGS,
    FleetError,
    bounded_request,
    check_command_line,
    check_text,
    checked_settings,
    refuse_reserved,
    shown,
)
from trt_otel.app.fleet_status import (
    JournalFold,
    events_page,
    journal_events,
    journal_status,
    wait_for,
    with_view,
    would_it_fit,
)
from trt_otel.control.stopping import process_running
from trt_otel.core import outbound
from trt_otel.core.deadlines import Deadline
from trt_otel.core.files import open_regular_for_reading
from trt_otel.core.outbound import Answer
from trt_otel.core.state import BuildState

STARTUP_S = 30.0
_URL = re.compile(r"http://(127\.0\.0\.1|\[::1\]|localhost):\d{1,5}")
URL_FILE = "http.url"
_ID = re.compile(r"[0-9a-f]{12}")
"""A build's id, and its folder's name: matched whole (``fullmatch``), so nothing else (``..``,
a ``/``, a NUL, a newline) ever becomes a path."""


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

    reserved: ClassVar[Mapping[str, str]] = RESERVED_SETTINGS
    """What the fleet sets itself, by the parser's names: a request may not."""

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
                status = with_view(status, view)
        return status

    def events(self, build_id: str, since_seq: int = -1, limit: int = 200) -> EventsPage:
        """Events after ``since_seq``, from the journal: ``limit`` of them at most (1 to
        :data:`MAX_EVENTS`; any other limit is refused, not clamped)."""
        folder = self.folder(build_id)
        if not 1 <= limit <= MAX_EVENTS:
            raise FleetError(f"limit must be 1 to {MAX_EVENTS}")
        self._record(build_id)
        return events_page(journal_events(folder / "journal.jsonl"), since_seq, limit)

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
            raise FleetError(f"no build {shown(build_id)} (ids are 12 hex digits)")
        return self.state_dir / build_id

    def _record(self, build_id: str) -> Record:
        path = self.folder(build_id) / "build.json"
        try:
            return Record(**json.loads(_read_regular(path, 1 << 20)))
        except FileNotFoundError:
            raise FleetError(f"no build {build_id!r} in {self.state_dir}") from None
        except (OSError, ValueError, TypeError) as error:
            raise FleetError(f"cannot read {path}: {shown(str(error), 200)}") from None

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


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):
        return path.expanduser().absolute()


def _read_regular(path: Path, limit: int) -> str:
    """A small file of the state directory: a regular file (a FIFO there must not block the
    server), at most ``limit`` bytes."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(f"{path} is not a regular file")
        return file.read(limit).decode("utf-8", "replace")


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


def _last_error(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no output"
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[-1]
