"""Builds run as a scheduler's jobs (Ray's, SLURM's), found again through the scheduler and a
folder every node sees: what the fleets of :mod:`~trt_otel.app.ray_fleet` and
:mod:`~trt_otel.app.slurm_fleet` share.

trt-otel schedules nothing here: each build is a job whose command is ``trt-otel build ...`` (or
``trt-otel demo ...``) itself, asking the scheduler for the GPUs and CPUs it needs, and the
scheduler places it on a node. What a build leaves is on the shared storage (``--shared-dir``)::

    SHARED/builds/ID/build.json   what was submitted: the command line, the job, the grace
    SHARED/builds/ID/cancel       the build's cancel file (its first line is the reason)
    SHARED/builds/ID/model.engine the engine, unless the request names another output
    SHARED/journals/ID.jsonl      the build's journal; the folder is every build's --history

The job's state is the scheduler's (:class:`Job`); the build's (phases, progress, ETA, cancel,
outcome) is its journal's, folded as for a local build. Nothing else is kept, so a restarted CLI
or MCP server, or one on another machine, knows what this one knew. One folder may hold the
builds of several schedulers: each fleet lists its own.

A cancel writes the build's cancel file first: TensorRT stops at its next step, and the cancel is
recorded with its reason. The job is stopped by the scheduler (a SIGTERM, then a SIGKILL) only if
it still runs its grace period (``--grace``) plus :data:`STOP_SLACK_S` later: by ``cancel`` when
it is told to wait, else by the next call that finds it overdue.

Paths a request names (the model, the output, a path option) must resolve inside the shared
folder, where every node finds them; every string is bounded before any work, and what the
folder holds is read as untrusted (another user's process may have written it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import msgspec

from trt_otel.app.fleet_documents import (
    ENDED,
    BuildRequest,
    BuildStatus,
    BuildSummary,
    CancelAnswer,
    EventsPage,
    FitAnswer,
    OpenPhase,
    State,
    WaitAnswer,
)
from trt_otel.app.fleet_requests import (
    MAX_EVENTS,
    MAX_REASON_CHARS,
    FleetError,
    bounded_request,
    check_command_line,
    check_text,
    checked_settings,
    refuse_reserved,
)
from trt_otel.app.fleet_status import (
    JournalFold,
    events_page,
    journal_status,
    wait_for,
    would_it_fit,
)
from trt_otel.capture.checked import read_journal
from trt_otel.capture.supervisor import DEFAULT_GRACE_S
from trt_otel.core.eta import BoundaryTracker, estimate
from trt_otel.core.files import open_regular_for_reading, write_atomically
from trt_otel.core.journal_codec import JournalError
from trt_otel.core.state import BuildState
from trt_otel.views.status import Estimate

STOP_SLACK_S = 15.0
"""After the grace period, how long the build's own escalation (its worker stopped, its journal
ended) gets before the scheduler is asked to stop the job."""
RESERVED = {"journal": "--journal", "output": "--output", "cancel_file": "--cancel-file"}
"""What the fleet sets itself, by the parser's names: an option is refused by what the parser
makes of it, never by its spelling."""
MAX_RECORD_BYTES = 1 << 20

R = TypeVar("R", bound="BuildRecord")
JobPhase = Literal["pending", "running", "ended"]
"""Where a job is, in any scheduler's words: waiting for a node, on one, or over."""


@dataclass(frozen=True, slots=True)
class Job:
    """What the scheduler says of a build's job; ``status`` None: it could not say."""

    status: str | None
    """The scheduler's own word for the job (Ray's ``RUNNING``, SLURM's ``COMPLETING``)."""
    phase: JobPhase | None
    message: str | None = None
    exit_code: int | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """``build.json``: a build as it was submitted (each scheduler adds its job's fields)."""

    id: str
    kind: str
    entrypoint: list[str]
    model: str | None
    engine: str | None
    journal: str
    cancel_file: str
    grace_s: float
    num_gpus: float
    submitted_wall_s: float


@dataclass(frozen=True, slots=True)
class Planned:
    """A build checked and laid out in the shared folder, not yet submitted."""

    id: str
    kind: str
    folder: Path
    argv: list[str]
    """``trt-otel``'s arguments (``build MODEL --output ...``), the fleet's own included."""
    model: Path | None
    engine: Path | None
    journal: Path
    cancel_file: Path
    grace_s: float

    def record(self, num_gpus: float) -> dict[str, Any]:
        """The fields of its :class:`BuildRecord`, submitted now (a scheduler adds its job's)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "entrypoint": ["trt-otel", *self.argv],
            "model": str(self.model) if self.model else None,
            "engine": str(self.engine) if self.engine else None,
            "journal": str(self.journal),
            "cancel_file": str(self.cancel_file),
            "grace_s": self.grace_s,
            "num_gpus": float(num_gpus),
            "submitted_wall_s": time.time(),
        }


class SharedFolderFleet(ABC, Generic[R]):
    """The builds of one scheduler and one shared folder; a scheduler's fleet says how a job is
    submitted, looked at and stopped."""

    scheduler: ClassVar[str]
    """The scheduler's name in a build's status (``ray``, ``slurm``)."""
    label: ClassVar[str]
    """Its name in messages (``Ray``, ``SLURM``)."""
    record_type: ClassVar[type[BuildRecord]]
    job_key: ClassVar[str]
    """The field of its records that names the job: what tells its records from another
    scheduler's in a folder they share."""
    reserved: ClassVar[Mapping[str, str]] = RESERVED
    """What the fleet sets itself, by the parser's names: a request may not."""

    def __init__(
        self, shared_dir: Path, *, allow_network: bool = False, stop_slack_s: float = STOP_SLACK_S
    ) -> None:
        self.allow_network = allow_network
        """Whether a request may set the options that point a build at the network."""
        self.stop_slack_s = stop_slack_s
        self.shared_dir = shared_dir.expanduser().resolve()
        self.roots = (self.shared_dir,)
        self._folds: dict[str, JournalFold] = {}

    # -- a scheduler's part ------------------------------------------------------------------

    @abstractmethod
    def start(
        self,
        request: BuildRequest,
        *,
        num_gpus: float | None = None,
        num_cpus: float | None = None,
    ) -> BuildStatus:
        """Check the request as the command line would (:meth:`_plan`), submit it as a job,
        and return its status. ``num_gpus``/``num_cpus``: what the scheduler reserves for the
        build's process (None: the fleet's own)."""

    @abstractmethod
    def _job(self, record: R) -> Job:
        """What the scheduler says of the build's job now (never raises: a scheduler that
        cannot be asked is a :class:`Job` whose ``status`` is None, and its message)."""

    @abstractmethod
    def _stop(self, record: R) -> bool:
        """Ask the scheduler to stop the job; whether it took the request."""

    @abstractmethod
    def _check_record(self, record: R) -> None:
        """Refuse (:class:`FleetError`) a record whose job is not the build's."""

    def _status_fields(self, record: R, job: Job, stop_requested: bool) -> dict[str, Any]:
        """A scheduler's own fields of a build's status, beside the common ones."""
        return {}

    # -- submitting ------------------------------------------------------------------------

    def _plan(self, request: BuildRequest) -> Planned:
        """Check the request as the command line would and lay it out in the shared folder:
        its folder made, its command line with the fleet's own options."""
        options = bounded_request(request)
        kind = request.kind
        if kind == "build" and request.model is None:
            raise FleetError("a build needs a model: the path of an ONNX file")
        refuse_reserved(options, "the fleet")
        build_id = secrets.token_hex(6)
        folder = self.shared_dir / "builds" / build_id
        argv, theirs = self._command_line(request, options, folder)
        model_path = Path(argv[1]) if kind == "build" else getattr(theirs, "model", None)
        engine = getattr(theirs, "output", None)
        journals = self.shared_dir / "journals"
        journal, cancel_file = journals / f"{build_id}.jsonl", folder / "cancel"
        argv += ["--no-progress", "--journal", str(journal)]
        argv += ["--cancel-file", str(cancel_file)]
        if getattr(theirs, "history", None) is None:
            argv += ["--history", str(journals)]
        try:
            folder.mkdir(parents=True, exist_ok=False)
            journals.mkdir(exist_ok=True)
        except OSError as error:
            raise FleetError(f"cannot write in {self.shared_dir}: {error}") from None
        check_command_line(argv)  # with the folders made: --history is one now
        return Planned(
            id=build_id,
            kind=kind,
            folder=folder,
            argv=argv,
            model=Path(model_path) if model_path else None,
            engine=Path(engine) if engine else None,
            journal=journal,
            cancel_file=cancel_file,
            grace_s=float(getattr(theirs, "grace", DEFAULT_GRACE_S)),
        )

    def _write_record(self, planned: Planned, record: R) -> None:
        write_atomically(
            planned.folder / "build.json", json.dumps(dataclasses.asdict(record)).encode()
        )

    def _command_line(
        self, request: BuildRequest, options: Sequence[str], folder: Path
    ) -> tuple[list[str], argparse.Namespace]:
        """The command line of the request with ``options`` (its own, bounded, with its
        deadline and rungs; the fleet's own not yet added), checked by trt-otel's parser, with
        what the parser made of it; every path inside the folder."""
        kind, model, output = request.kind, request.model, request.output
        model_path = self._model(model) if model is not None else None
        engine = self._output(output, request.overwrite) if output is not None else None
        if kind == "build" and engine is None:
            engine = folder / "model.engine"
        argv = [kind]
        if kind == "build":
            argv += [str(model_path), "--output", str(engine)]
        else:
            argv += [*(["--model", str(model_path)] if model_path else [])]
            argv += [*(["--output", str(engine)] if engine else [])]
        theirs = checked_settings(
            kind,
            argv,
            options,
            reserved=RESERVED,
            setter="the fleet",
            allow_network=self.allow_network,
            inside=self._inside,
        )
        return [*argv, *options], theirs

    def _inside(self, name: str, path: Path) -> Path:
        try:
            resolved = path.expanduser().absolute().resolve()
        except (OSError, RuntimeError) as error:
            raise FleetError(f"{name} {path}: cannot resolve it ({error})") from None
        if not resolved.is_relative_to(self.shared_dir):
            raise FleetError(
                f"{name} {resolved} is outside the shared folder {self.shared_dir}, which is "
                f"where every {self.label} node finds a build's files"
            )
        return resolved

    def fit(self, model: str, deadline: str, history: str) -> FitAnswer:
        """MCP's ``will_it_fit``, from journals under the shared folder (see
        :func:`~trt_otel.app.fleet_status.would_it_fit`)."""
        return would_it_fit(model, deadline, history, self._model, self._inside)

    def _model(self, model: str) -> Path:
        path = self._inside("model", Path(model))
        if not path.is_file():
            raise FleetError(f"model {path}: not a regular file")
        return path

    def _output(self, output: str, overwrite: bool) -> Path:
        path = self._inside("output", Path(output))
        if path.is_relative_to(self.shared_dir / "builds") or path.is_relative_to(
            self.shared_dir / "journals"
        ):
            raise FleetError(f"output {path} is among the fleet's records; choose another path")
        if path.exists() and not overwrite:
            raise FleetError(f"output {path} exists; it is replaced only when asked (overwrite)")
        return path

    # -- reading ---------------------------------------------------------------------------

    def ids(self) -> list[str]:
        """Every build of this scheduler in the shared folder, oldest first."""
        return [build_id for build_id, _ in self._own_records()]

    def _own_records(self) -> list[tuple[str, bytes | None]]:
        """This scheduler's builds in the shared folder, oldest first, each with its record as
        read (once; None where it could not be): another scheduler's share the folder, and an
        unreadable one is listed, so that its status says what is wrong with it."""
        builds = self.shared_dir / "builds"
        if not builds.is_dir():
            return []
        found = []
        for folder in builds.iterdir():
            path = folder / "build.json"
            if not (_is_id(folder.name) and path.is_file()):
                continue
            try:
                data: bytes | None = _read_record(path)
            except OSError:
                data = None
            if data is None or self._is_ours(data):
                found.append((folder.stat().st_mtime, folder.name, data))
        return [(build_id, data) for _, build_id, data in sorted(found, key=lambda f: f[:2])]

    def _is_ours(self, data: bytes) -> bool:
        """Whether a record is of this scheduler's builds (an undecodable one is listed)."""
        try:
            fields = msgspec.json.decode(data)
        except msgspec.DecodeError:
            return True
        return not isinstance(fields, dict) or self.job_key in fields

    def list(self) -> list[BuildSummary]:
        records = [
            self._record(build_id) if data is None else self._checked_record(build_id, data)
            for build_id, data in self._own_records()
        ]
        return [BuildSummary.of(self._status(record)) for record in records]

    def status(self, build_id: str) -> BuildStatus:
        """The build as the scheduler and its journal tell it (and a cancel overdue is
        escalated)."""
        return self._status(self._record(build_id))

    def _status(self, record: R) -> BuildStatus:
        job = self._job(record)
        fold = self._fold(record)
        state = fold.state
        cancel_requested = Path(record.cancel_file).exists()
        lifecycle = _state_of(state, job, cancel_requested)
        error = None
        if lifecycle == "lost":
            error = f"the {self.label} job ended before the build's journal recorded an end"
        elif lifecycle == "failed_to_start":
            error = job.message or f"the {self.label} job ended before the build"
        stop_requested = self._escalate(record, job)
        return journal_status(
            state,
            fold.attempts,
            id=record.id,
            kind=record.kind,
            state=lifecycle,
            model=record.model,
            engine=record.engine,
            journal=record.journal,
            error=error,
            eta=_eta(state),
            open_phases=_open_phases(state),
            submitted_wall_s=record.submitted_wall_s,
            scheduler=self.scheduler,
            job_status=job.status,
            job_message=job.message,
            job_exit_code=job.exit_code,
            node=job.node,
            cancel_requested=cancel_requested,
            job_stop_requested=True if stop_requested else None,
            **self._status_fields(record, job, stop_requested),
        )

    def events(self, build_id: str, since_seq: int = -1, limit: int = 200) -> EventsPage:
        """Events after ``since_seq``, from the journal, ``limit`` at most (1 to
        :data:`MAX_EVENTS`)."""
        if not 1 <= limit <= MAX_EVENTS:
            raise FleetError(f"limit must be 1 to {MAX_EVENTS}")
        record = self._record(build_id)
        try:
            events = read_journal(Path(record.journal)).events
        except (OSError, JournalError):
            events = []  # not written yet
        return events_page(events, since_seq, limit)

    def wait(self, build_id: str, until: str = "progress", timeout_s: float = 30.0) -> WaitAnswer:
        """Until the build progresses (``progress``) or ends, or ``timeout_s`` passes."""
        if not 0 <= timeout_s <= 24 * 3600:
            raise FleetError("timeout_s must be between 0 and 86400 seconds")
        return wait_for(lambda: self.status(build_id), until, timeout_s, poll_s=0.5)

    # -- cancelling ------------------------------------------------------------------------

    def cancel(self, build_id: str, reason: str = "", *, wait: bool = False) -> CancelAnswer:
        """Write the build's cancel file (its reason its first line): TensorRT stops at its next
        step. With ``wait``, follow the build to its end, stopping the job if it outlives its
        grace period."""
        check_text("reason", reason, MAX_REASON_CHARS)
        record = self._record(build_id)
        status = self._status(record)
        if status.state in ENDED:
            raise FleetError(f"build {build_id} is not running ({status.state})")
        said = " ".join((reason or "cancelled through the fleet").split())
        if status.state == "pending":
            # Not building yet (and its cancel file must not exist when it starts): the
            # scheduler's stop is all there is to do.
            self._stop(record)
            note = f"the build had not started: its {self.label} job was stopped"
            return CancelAnswer(id=build_id, accepted=True, first=True, reason=said, note=note)
        cancel_file = Path(record.cancel_file)
        first = not cancel_file.exists()
        if first:
            write_atomically(cancel_file, f"{said}\n".encode(), mode=0o644)
        answer = CancelAnswer(
            id=build_id,
            accepted=True,
            first=first,
            reason=said,
            note=f"TensorRT stops at its next step; the {self.label} job is stopped if it still "
            f"runs {record.grace_s + self.stop_slack_s:g}s from now.",
        )
        if wait:
            limit = record.grace_s + self.stop_slack_s + 60
            answer.status = self.wait(build_id, "end", limit).status
        return answer

    def _escalate(self, record: R, job: Job) -> bool:
        """Stop the job of a build cancelled longer ago than its grace period (and the slack)
        that still runs; whether it was asked to stop."""
        if job.phase not in ("pending", "running"):
            return False
        try:
            asked = Path(record.cancel_file).stat().st_mtime
        except OSError:
            return False
        if time.time() - asked < record.grace_s + self.stop_slack_s:
            return False
        return self._stop(record)

    # -- internals -------------------------------------------------------------------------

    def _record(self, build_id: str) -> R:
        check_text("id", build_id, 64)
        if not _is_id(build_id):
            raise FleetError(f"no build {build_id[:40]!r} (ids are 12 hex digits)")
        path = self._record_path(build_id)
        try:
            data = _read_record(path)
        except FileNotFoundError:
            raise FleetError(f"no build {build_id} in {self.shared_dir}") from None
        except OSError as error:
            raise FleetError(f"cannot read {path}: {str(error)[:200]}") from None
        return self._checked_record(build_id, data)

    def _record_path(self, build_id: str) -> Path:
        return self.shared_dir / "builds" / build_id / "build.json"

    def _checked_record(self, build_id: str, data: bytes) -> R:
        """The record of ``build_id`` as read (``data``), checked for what it is."""
        path = self._record_path(build_id)
        try:
            record: R = msgspec.json.decode(data, type=self.record_type)  # type: ignore[assignment]
        except (msgspec.ValidationError, msgspec.DecodeError) as error:
            raise FleetError(f"cannot read {path}: {str(error)[:200]}") from None
        # The folder is shared: what the record names is read and written only if it is this
        # build's and lies in the folder.
        if record.id != build_id:
            raise FleetError(f"{path} is not the record of build {build_id}")
        self._check_record(record)
        for name in ("journal", "cancel_file"):
            self._inside(f"{path}: {name}", Path(getattr(record, name)))
        return record

    def _fold(self, record: R) -> JournalFold:
        """The build's journal, folded up to now."""
        fold = self._folds.get(record.id)
        if fold is None:
            fold = self._folds[record.id] = JournalFold(Path(record.journal))
        fold.update()
        return fold


def _state_of(state: BuildState, job: Job, cancel_requested: bool) -> State:
    """One word for the build, from its journal first and the scheduler's job second."""
    if state.outcome is not None:
        return "finished"
    if job.phase == "ended":
        return "lost" if state.build_id is not None else "failed_to_start"
    if job.phase == "pending" or (job.phase == "running" and state.build_id is None):
        return "pending"
    if job.phase is None:
        return "unknown"
    return "cancelling" if state.cancel is not None or cancel_requested else "running"


def _now_on_the_builds_clock(state: BuildState) -> int | None:
    """Now on the build's monotonic clock, by the journal's wall clock (the node's monotonic
    clock need not be this machine's); None before the build starts."""
    if state.start_mono_ns is None or state.start_wall_ns is None:
        return None
    return state.start_mono_ns + (time.time_ns() - state.start_wall_ns)


def _eta(state: BuildState) -> Estimate | None:
    """The time left from the build's progress, as of now."""
    now_mono_ns = _now_on_the_builds_clock(state)
    if now_mono_ns is None:
        return None
    return Estimate.of(estimate(state, BoundaryTracker(), now_mono_ns, None).progress)


def _open_phases(state: BuildState) -> list[OpenPhase]:
    """The open phases, outermost first, with their steps and how long they have been open."""
    now_mono_ns = _now_on_the_builds_clock(state)
    path = []
    for phase_id in sorted(state.open_by_name.values()):
        phase = state.phases[phase_id]
        elapsed_s = None
        if now_mono_ns is not None:
            elapsed_s = max(0.0, (now_mono_ns - phase.start_mono_ns) / 1e9)
        path.append(OpenPhase(phase.name, f"{phase.last_step + 1}/{phase.num_steps}", elapsed_s))
    return path


def _read_record(path: Path) -> bytes:
    with open_regular_for_reading(path, "build record") as file:
        return file.read(MAX_RECORD_BYTES)


def _is_id(text: str) -> bool:
    return len(text) == 12 and all(c in "0123456789abcdef" for c in text)


def first_line(error: object) -> str:
    """The first line of what a scheduler said, bounded."""
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__
