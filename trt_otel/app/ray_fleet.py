"""Builds run as Ray jobs, through Ray's Job Submission API, found again through Ray and a folder
every node sees.

trt-otel schedules nothing here: each build is a Ray job whose entrypoint is ``trt-otel build ...``
(or ``trt-otel demo ...``) itself, asking Ray for the GPUs and CPUs it needs, and Ray places it on
a node. What a build leaves is on the shared storage (``--shared-dir``)::

    SHARED/builds/ID/build.json   what was submitted: the command line, the Ray job, the grace
    SHARED/builds/ID/cancel       the build's cancel file (its first line is the reason)
    SHARED/builds/ID/model.engine the engine, unless the request names another output
    SHARED/journals/ID.jsonl      the build's journal; the folder is every build's --history

The job's state is Ray's (``PENDING``, ``RUNNING``, ``SUCCEEDED``, ``FAILED``, ``STOPPED``); the
build's (phases, progress, ETA, cancel, outcome) is its journal's, folded as for a local build.
Nothing else is kept, so a restarted CLI or MCP server, or one on another machine, knows what
this one knew.

A cancel writes the build's cancel file first: TensorRT stops at its next step, and the cancel is
recorded with its reason. The Ray job is stopped (Ray sends SIGTERM, then SIGKILL) only if it
still runs its grace period (``--grace``) plus :data:`STOP_SLACK_S` later: by ``cancel`` when it
is told to wait, else by the next call that finds it overdue.

Paths a request names (the model, the output, a path option) must resolve inside the shared
folder, where every node finds them; every string is bounded before any work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

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
from trt_otel.core.deadlines import DeadlineExceededError, call_within
from trt_otel.core.eta import BoundaryTracker, estimate
from trt_otel.core.files import open_regular_for_reading, write_atomically
from trt_otel.core.journal_codec import JournalError
from trt_otel.core.state import BuildState
from trt_otel.views.status import Estimate

PREFIX = "trt-otel-"
"""Ray's submission id of a build: this and the build's id."""
STOP_SLACK_S = 15.0
"""After the grace period, how long the build's own escalation (its worker stopped, its journal
ended) gets before Ray is asked to stop the job."""
RAY_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
RAY_CALL_TIMEOUT_S = 30.0
"""What one call to Ray's job server gets in all: a submission, a job's status, a stop (a
dashboard under load answers in seconds, a hung one never)."""
T = TypeVar("T")
_RESERVED = {"journal": "--journal", "output": "--output", "cancel_file": "--cancel-file"}
"""What the fleet sets itself, by the parser's names: an option is refused by what the parser
makes of it, never by its spelling."""
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RayRecord:
    """``build.json``: a build as it was submitted."""

    id: str
    kind: str
    submission_id: str
    entrypoint: list[str]
    model: str | None
    engine: str | None
    journal: str
    cancel_file: str
    grace_s: float
    num_gpus: float
    submitted_wall_s: float


class RayFleet:
    """The builds of one Ray cluster and one shared folder."""

    def __init__(
        self,
        address: str,
        shared_dir: Path,
        *,
        num_gpus: float = 0.0,
        num_cpus: float = 1.0,
        stop_slack_s: float = STOP_SLACK_S,
        client: Any = None,
        allow_network: bool = False,
        call_timeout_s: float = RAY_CALL_TIMEOUT_S,
    ) -> None:
        """``num_gpus``/``num_cpus``: what Ray reserves for a build when a request says
        nothing of it. ``stop_slack_s``: see :data:`STOP_SLACK_S`. ``call_timeout_s``: what
        each call to Ray's job server gets in all (:data:`RAY_CALL_TIMEOUT_S`)."""
        self.address = address
        self.call_timeout_s = call_timeout_s
        self.allow_network = allow_network
        """Whether a request may set the options that point a build at the network."""
        self.stop_slack_s = stop_slack_s
        self.num_gpus, self.num_cpus = num_gpus, num_cpus
        self.shared_dir = shared_dir.expanduser().resolve()
        self.roots = (self.shared_dir,)
        if client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError as error:
                raise FleetError(
                    f"builds on Ray need Ray's job client ({error}): pip install 'trt-otel[ray]'"
                ) from None
            try:
                # The client asks the job server its version twice before it is made.
                client = self._ray(lambda: JobSubmissionClient(address))
            except (ConnectionError, RuntimeError, ValueError, DeadlineExceededError) as error:
                raise FleetError(f"cannot reach Ray at {address}: {error}") from None
        self.client = client
        self._folds: dict[str, JournalFold] = {}

    # -- submitting ------------------------------------------------------------------------

    def start(
        self,
        request: BuildRequest,
        *,
        num_gpus: float | None = None,
        num_cpus: float | None = None,
    ) -> BuildStatus:
        """Check the request as the command line would, submit it as a Ray job, and return its
        status. ``num_gpus``/``num_cpus``: what Ray reserves for the build's process;
        ``deadline`` and ``retries``: ``--deadline`` and the ``--retry`` rungs (a rung's paths
        inside the shared folder too)."""
        options = bounded_request(request)
        kind, model = request.kind, request.model
        num_gpus = self.num_gpus if num_gpus is None else num_gpus
        num_cpus = self.num_cpus if num_cpus is None else num_cpus
        if not (0 <= num_gpus <= 64 and 0 <= num_cpus <= 256):
            raise FleetError("num_gpus must be 0 to 64 and num_cpus 0 to 256")
        if kind == "build" and model is None:
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
        record = RayRecord(
            id=build_id,
            kind=kind,
            submission_id=PREFIX + build_id,
            entrypoint=["trt-otel", *argv],
            model=str(model_path) if model_path else None,
            engine=str(engine) if engine else None,
            journal=str(journal),
            cancel_file=str(cancel_file),
            grace_s=float(getattr(theirs, "grace", DEFAULT_GRACE_S)),
            num_gpus=num_gpus,
            submitted_wall_s=time.time(),
        )
        write_atomically(folder / "build.json", json.dumps(dataclasses.asdict(record)).encode())
        try:
            self._ray(
                lambda: self.client.submit_job(
                    entrypoint=shlex.join(record.entrypoint),
                    submission_id=record.submission_id,
                    entrypoint_num_gpus=num_gpus or None,
                    entrypoint_num_cpus=num_cpus or None,
                    metadata={"trt-otel.build": build_id, "trt-otel.kind": kind},
                )
            )
        except DeadlineExceededError as error:
            raise FleetError(
                f"Ray did not take the job ({error}); it may still start: fleet status {build_id}"
            ) from None
        except Exception as error:  # Ray's client raises RuntimeError, ConnectionError, ...
            raise FleetError(f"Ray refused the job: {_first_line(error)}") from None
        return self.status(build_id)

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
            reserved=_RESERVED,
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
                "where every Ray node finds a build's files"
            )
        return resolved

    def fit(self, model: str, deadline: str, history: str) -> FitAnswer:
        """MCP's ``will_it_fit``, from journals under the shared folder (see
        :func:`~trt_otel.app.fleet.would_it_fit`)."""
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
        """Every build of the shared folder, oldest first."""
        builds = self.shared_dir / "builds"
        if not builds.is_dir():
            return []
        found = []
        for folder in builds.iterdir():
            if _is_id(folder.name) and (folder / "build.json").is_file():
                found.append((folder.stat().st_mtime, folder.name))
        return [name for _, name in sorted(found)]

    def list(self) -> list[BuildSummary]:
        return [BuildSummary.of(self.status(i)) for i in self.ids()]

    def status(self, build_id: str) -> BuildStatus:
        """The build as Ray and its journal tell it (and a cancel overdue is escalated)."""
        record = self._record(build_id)
        job = self._job(record)
        fold = self._fold(record)
        state = fold.state
        ray_status = job.get("status")
        ray_message = _first_line(job.get("message") or "") or None
        cancel_requested = Path(record.cancel_file).exists()
        lifecycle = _state_of(state, ray_status, cancel_requested)
        error = None
        if lifecycle == "lost":
            error = "the Ray job ended before the build's journal recorded an end"
        elif lifecycle == "failed_to_start":
            error = ray_message or "the Ray job ended before the build"
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
            ray_status=ray_status,
            ray_message=ray_message,
            ray_exit_code=job.get("driver_exit_code"),
            node=job.get("driver_node_id"),
            cancel_requested=cancel_requested,
            ray_stop_requested=True if self._escalate(record, ray_status) else None,
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
        step. With ``wait``, follow the build to its end, stopping the Ray job if it outlives
        its grace period."""
        check_text("reason", reason, MAX_REASON_CHARS)
        record = self._record(build_id)
        status = self.status(build_id)
        if status.state in ENDED:
            raise FleetError(f"build {build_id} is not running ({status.state})")
        said = " ".join((reason or "cancelled through the fleet").split())
        if status.state == "pending":
            # Not building yet (and its cancel file must not exist when it starts): Ray's stop
            # is all there is to do.
            self._stop(record)
            note = "the build had not started: its Ray job was stopped"
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
            note=f"TensorRT stops at its next step; the Ray job is stopped if it still runs "
            f"{record.grace_s + self.stop_slack_s:g}s from now.",
        )
        if wait:
            limit = record.grace_s + self.stop_slack_s + 60
            answer.status = self.wait(build_id, "end", limit).status
        return answer

    def _escalate(self, record: RayRecord, ray_status: str | None) -> bool:
        """Stop the Ray job of a build cancelled longer ago than its grace period (and the
        slack) that still runs; whether it was asked to stop."""
        if ray_status not in ("PENDING", "RUNNING"):
            return False
        try:
            asked = Path(record.cancel_file).stat().st_mtime
        except OSError:
            return False
        if time.time() - asked < record.grace_s + self.stop_slack_s:
            return False
        return self._stop(record)

    def _stop(self, record: RayRecord) -> bool:
        try:
            return bool(self._ray(lambda: self.client.stop_job(record.submission_id)))
        except Exception:  # it ended meanwhile; the next call sees that
            return False

    # -- internals -------------------------------------------------------------------------

    def _ray(self, call: Callable[[], T]) -> T:
        """A call to Ray's job server, within :attr:`call_timeout_s` in all: its client makes a
        ``requests`` session for each call, with no timeout, out of reach."""
        return call_within(self.call_timeout_s, call, name="trt-otel-ray-call")

    def _record(self, build_id: str) -> RayRecord:
        check_text("id", build_id, 64)
        if not _is_id(build_id):
            raise FleetError(f"no build {build_id[:40]!r} (ids are 12 hex digits)")
        path = self.shared_dir / "builds" / build_id / "build.json"
        try:
            with open_regular_for_reading(path, "build record") as file:
                record = msgspec.json.decode(file.read(MAX_RECORD_BYTES), type=RayRecord)
        except FileNotFoundError:
            raise FleetError(f"no build {build_id} in {self.shared_dir}") from None
        except (OSError, msgspec.ValidationError, msgspec.DecodeError) as error:
            raise FleetError(f"cannot read {path}: {str(error)[:200]}") from None
        # The folder is shared: what the record names is read and written only if it is this
        # build's and lies in the folder.
        if record.id != build_id or record.submission_id != PREFIX + build_id:
            raise FleetError(f"{path} is not the record of build {build_id}")
        for name in ("journal", "cancel_file"):
            self._inside(f"{path}: {name}", Path(getattr(record, name)))
        return record

    def _job(self, record: RayRecord) -> dict[str, Any]:
        try:
            info = self._ray(lambda: self.client.get_job_info(record.submission_id))
        except Exception as error:  # Ray unreachable, or the job unknown to it
            return {"status": None, "message": f"Ray: {_first_line(error)}"}
        status = getattr(info.status, "value", info.status)
        return {
            "status": str(status) if status is not None else None,
            "message": info.message,
            "driver_exit_code": getattr(info, "driver_exit_code", None),
            "driver_node_id": getattr(info, "driver_node_id", None),
        }

    def _fold(self, record: RayRecord) -> JournalFold:
        """The build's journal, folded up to now."""
        fold = self._folds.get(record.id)
        if fold is None:
            fold = self._folds[record.id] = JournalFold(Path(record.journal))
        fold.update()
        return fold


def _state_of(state: BuildState, ray_status: str | None, cancel_requested: bool) -> State:
    """One word for the build, from its journal first and Ray's job second."""
    if state.outcome is not None:
        return "finished"
    if ray_status in RAY_ENDED:
        return "lost" if state.build_id is not None else "failed_to_start"
    if ray_status == "PENDING" or (ray_status == "RUNNING" and state.build_id is None):
        return "pending"
    if ray_status is None:
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


def _is_id(text: str) -> bool:
    return len(text) == 12 and all(c in "0123456789abcdef" for c in text)


def _first_line(error: object) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__
