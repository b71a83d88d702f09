"""A soak with faults: for ``--minutes``, real TensorRT-RTX builds and simulated ones run side by
side on this host, each with a fault injected from outside, and each is checked when it ends.

Faults (one a build, drawn at random with ``--seed``, at a random moment from its start-up to
its silent window): none; SIGKILL of the worker, or of the supervisor; SIGSTOP, and SIGCONT 2 s
later, of the worker or of the supervisor; Ctrl-C (SIGINT to the build's process group, as
a terminal sends it); an authenticated ``POST /cancel``; a full disk (the journal on a 96 KiB
tmpfs, where the soak can mount one); dead, dripping and redirecting sinks (the OTLP
collector, the Pushgateway and the cancel URL at once); hostile clients of the HTTP view. Every
build has a reader following its journal (``trt-otel watch``) and a client of its
``/events`` stream.

After each build: the journal reads, and ends or reads as unfinished; its events are
contiguous from seq 0; every event the ``/events`` client was sent is in it (unless the process
that wrote both was killed); an answered ``POST /cancel`` is in it; the exit code is the
journal's outcome's, and the fault's; no engine is left half written; the reader ended with
the build; no process of the build, no listening port, no journal lock, no temporary file and
no cancel token is left; the build's processes stayed under ``--max-rss``. It prints a table of
builds by kind and fault, and every finding; it exits 1 when there is one.

    python benchmarks/soak.py --minutes 30

``--every-fault`` runs each fault exactly once instead (in an order drawn with the seed, the kind
of build taking turns through the kinds), and ends when the last has been checked: a fixed
plan, for a test that must see every fault whatever the machine's pace.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from soak_peers import SINK_KINDS, Hostility, hostile_clients, sink

from trt_otel.builder.onnx_models import RESIDUAL_SHAPES, residual_net_bytes
from trt_otel.capture.checked import read_journal
from trt_otel.core.events import BuildFinished, BuildStarted, CancelRequested, Event, Outcome

CLI = [sys.executable, "-m", "trt_otel.app.cli"]
SHAPES = RESIDUAL_SHAPES
TOKEN = "soak-token"
BUILD_LIMIT_S = 240.0
"""A build (and its reader) still running this long after it started is a hang."""
READER_ENDS_WITHIN_S = 45.0
"""How long after its build the journal's reader may take to end (it gives a killed writer
its ``--lost-after``)."""
EXIT_OF = {Outcome.SUCCESS: 0, Outcome.CANCELLATION: 3, Outcome.TIMEOUT: 3, Outcome.FAILURE: 4}
"""The exit code of a build that ended with each outcome (docs/commands.md)."""
KINDS = ("rtx", "rtx", "sim", "sim-silent")
"""Half the builds real (TensorRT-RTX, CPU-only), half simulated (one with a silent window)."""
FAULTS = ("none", "kill-worker", "kill-supervisor", "stop-cont", "stop-cont-supervisor",
          "ctrl-c", "http-cancel", "full-disk", "sinks", "hostile-http")  # fmt: skip


@dataclass
class Build:
    """One build of the soak and what was seen of it."""

    index: int
    kind: str
    fault: str
    folder: Path
    journal: Path = field(init=False)
    engine: Path = field(init=False)
    findings: list[str] = field(default_factory=list)
    exit_code: int | None = None
    peak_rss: int = 0
    streamed: dict[int, str] = field(default_factory=dict)
    cancel_answered: bool = False
    hostility: Hostility | None = None
    duration_s: float = 0.0
    pids: set[int] = field(default_factory=set)
    url: str | None = None

    def __post_init__(self) -> None:
        self.journal = self.folder / "build.jsonl"
        self.engine = self.folder / "model.engine"

    def find(self, finding: str) -> None:
        self.findings.append(finding)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrent", type=int, default=2, help="builds at once (default: 2)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--every-fault",
        action="store_true",
        help="each fault once (kinds taking turns), then stop, instead of for --minutes",
    )
    parser.add_argument(
        "--faults",
        type=lambda text: tuple(text.split(",")),
        default=FAULTS,
        help=f"the faults to draw from, comma-separated (default: all of {','.join(FAULTS)})",
    )
    parser.add_argument(
        "--kinds",
        type=lambda text: tuple(text.split(",")),
        default=KINDS,
        help=f"the builds to draw from (default: {','.join(sorted(set(KINDS)))})",
    )
    parser.add_argument(
        "--max-rss", type=float, default=1024.0, help="MiB, every process of a build"
    )
    args = parser.parse_args()
    for name, given, known in (("fault", args.faults, FAULTS), ("kind", args.kinds, KINDS)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"no such {name}: {', '.join(unknown)}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    length = "every fault once" if args.every_fault else f"{args.minutes:g} min"
    print(f"soak: {length}, {args.concurrent} at once, seed {seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="trt-otel-soak-") as scratch:
        root = Path(scratch)
        models = {
            "rtx": _model(root / "r300.onnx", 300),
            "rtx-silent": _model(root / "r600.onnx", 600),
        }
        with _small_disk(root / "small") as small:
            builds = _soak(root, models, small, args, seed)
    return _report(builds, args.max_rss)


def _model(path: Path, blocks: int) -> Path:
    path.write_bytes(residual_net_bytes(blocks))
    return path


@contextlib.contextmanager
def _small_disk(where: Path) -> Iterator[Path | None]:
    """A 96 KiB tmpfs for the full-disk fault (None where it cannot be mounted: not root)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(where)],
        capture_output=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        print("soak: no full-disk fault (cannot mount a tmpfs here)", flush=True)
        yield None
        return
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _soak(
    root: Path, models: dict[str, Path], small: Path | None, args: argparse.Namespace, seed: int
) -> list[Build]:
    rng = random.Random(seed)
    ends = time.monotonic() + args.minutes * 60
    builds: list[Build] = []
    lock = threading.Lock()
    full_disk_busy = threading.Lock()  # one build at a time on the small disk
    planned: list[tuple[str, str]] | None = None
    if args.every_fault:
        faults = list(dict.fromkeys(args.faults))
        rng.shuffle(faults)
        kinds = list(dict.fromkeys(args.kinds))
        planned = [(kinds[i % len(kinds)], fault) for i, fault in enumerate(faults)]

    def next_build() -> tuple[str, str] | None:
        """The next build's kind and fault, or None when the soak is over."""
        if planned is not None:
            return planned.pop(0) if planned else None
        if time.monotonic() >= ends:
            return None
        return rng.choice(args.kinds), rng.choice(args.faults)

    def worker() -> None:
        while True:
            with lock:
                chosen = next_build()
                if chosen is None:
                    return
                index = len(builds)
                kind, fault = chosen
                if fault == "full-disk" and (small is None or full_disk_busy.locked()):
                    fault = "none"
                at_s = rng.uniform(0.2, 6.0)  # start-up, the phases, the silent window
                build = Build(index, kind, fault, root / f"b{index:04d}")
                builds.append(build)
            build.folder.mkdir()
            if fault == "full-disk":
                with full_disk_busy:
                    assert small is not None
                    build.journal = small / "build.jsonl"
                    _run(build, models, at_s)
                    build.journal.unlink(missing_ok=True)
            else:
                _run(build, models, at_s)
            mark = "ok" if not build.findings else f"{len(build.findings)} finding(s)"
            print(f"  #{index:<4} {kind:<11} {fault:<20} exit {build.exit_code!s:<4} "
                  f"{build.duration_s:5.1f}s  {mark}", flush=True)  # fmt: skip

    threads = [threading.Thread(target=worker) for _ in range(args.concurrent)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return builds


def _command(build: Build, models: dict[str, Path], urls: dict[str, str]) -> list[str]:
    common = [
        "--no-progress", "--no-gpu", "--no-summary", "--journal", str(build.journal),
        "--http-port", "0", "--http-url-file", str(build.folder / "url"),
        "--cancel-token", TOKEN, "--sample-interval", "0.5s",
    ]  # fmt: skip
    if "otlp" in urls:
        common += ["--otlp-endpoint", urls["otlp"], "--otlp-protocol", "http/protobuf"]
    if "push" in urls:
        common += ["--pushgateway", urls["push"]]
    if "cancel" in urls:
        common += ["--cancel-url", urls["cancel"], "--cancel-url-interval", "1s"]
    if build.kind.startswith("rtx"):
        model = models["rtx-silent" if build.kind == "rtx-silent" else "rtx"]
        return [*CLI, "build", str(model), "-o", str(build.engine), "--backend", "tensorrt-rtx",
                "--shapes", SHAPES, *common]  # fmt: skip
    silence = ["--silence", "8s"] if build.kind == "sim-silent" else []
    return [*CLI, "demo", "--speed", "6", *silence, *common]


def _run(build: Build, models: dict[str, Path], at_s: float) -> None:
    with contextlib.ExitStack() as stack:
        urls = {}
        if build.fault == "sinks":
            kinds = [random.choice(SINK_KINDS) for _ in range(3)]
            urls = {
                name: stack.enter_context(sink(kind))
                for name, kind in zip(("otlp", "push", "cancel"), kinds, strict=True)
            }
            build.fault = "sinks " + "/".join(k[:5] for k in kinds)
        env = dict(os.environ)
        env.pop("GITHUB_STEP_SUMMARY", None)
        began = time.monotonic()
        with (build.folder / "stderr").open("w") as stderr:
            process = subprocess.Popen(
                _command(build, models, urls), stdout=subprocess.DEVNULL, stderr=stderr,
                stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )  # fmt: skip
        build.pids.add(process.pid)
        watching = _follow(build)
        sampler = threading.Thread(target=_sample_rss, args=(build, process), daemon=True)
        sampler.start()
        try:
            _inject(build, process, at_s)
            try:
                build.exit_code = process.wait(
                    timeout=max(1.0, BUILD_LIMIT_S - (time.monotonic() - began))
                )
            except subprocess.TimeoutExpired:
                build.find(f"hang: still running after {BUILD_LIMIT_S:g}s")
                os.killpg(process.pid, signal.SIGKILL)
                build.exit_code = process.wait()
        finally:
            build.duration_s = time.monotonic() - began
            sampler.join(5)
        _check(build, watching)


def _follow(build: Build) -> tuple[subprocess.Popen[bytes], threading.Thread]:
    """The journal's reader, and a client of the build's ``/events`` (once it serves)."""
    deadline = time.monotonic() + 30
    while not build.journal.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    reader = subprocess.Popen(
        [*CLI, "watch", str(build.journal), "--no-progress", "--lost-after", "15s"],
        stdout=subprocess.DEVNULL, stderr=(build.folder / "watch.err").open("w"),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    client = threading.Thread(target=_stream, args=(build,), daemon=True)
    client.start()
    return reader, client


def _url_of(build: Build, timeout_s: float = 30.0) -> str | None:
    url_file, deadline = build.folder / "url", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            text = url_file.read_text().strip()
            if text:
                build.url = text
                return text
        time.sleep(0.05)
    return None


def _stream(build: Build) -> None:
    """Read ``/events`` from the start (``Last-Event-ID: -1``) until the stream ends."""
    url = _url_of(build)
    if url is None:
        return
    host, _, port = url.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", "/events", headers={"Accept": "text/event-stream"})
        response = connection.getresponse()
        while True:
            line = response.readline(1 << 20)
            if not line:
                return
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                if isinstance(event, dict) and isinstance(event.get("seq"), int):
                    build.streamed[event["seq"]] = str(event.get("type"))
    except (OSError, http.client.HTTPException, ValueError):
        return
    finally:
        connection.close()


def _sample_rss(build: Build, process: subprocess.Popen[bytes]) -> None:
    """The peak of the build's processes' resident sets, summed, every 0.2 s."""
    while process.poll() is None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(process.pid)
            tree = [root, *root.children(recursive=True)]
            build.pids.update(p.pid for p in tree)
            total = 0
            for member in tree:
                with contextlib.suppress(psutil.Error):
                    total += member.memory_info().rss
            build.peak_rss = max(build.peak_rss, total)
        time.sleep(0.2)


def _worker_of(process: subprocess.Popen[bytes]) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(process.pid).children()
        return children[0] if children else None
    return None


def _inject(build: Build, process: subprocess.Popen[bytes], at_s: float) -> None:
    fault = build.fault
    if fault.startswith("sinks") or fault in ("none", "full-disk"):
        return
    if fault == "hostile-http":
        url = _url_of(build)
        if url is None:
            build.find("the HTTP view never served")
            return
        host, _, port = url.removeprefix("http://").partition(":")
        with (
            hostile_clients(host, int(port), alive=lambda: process.poll() is None) as seen,
            contextlib.suppress(subprocess.TimeoutExpired),
        ):
            process.wait(timeout=BUILD_LIMIT_S / 2)
        build.hostility = seen
        return
    if process.poll() is not None or _wait_or_end(process, at_s):
        return  # ended before its fault: checked as it is
    if fault == "kill-supervisor":
        process.send_signal(signal.SIGKILL)
    elif fault == "stop-cont-supervisor":
        process.send_signal(signal.SIGSTOP)
        time.sleep(2.0)  # stopped: it cannot end meanwhile
        process.send_signal(signal.SIGCONT)
    elif fault == "ctrl-c":
        os.killpg(process.pid, signal.SIGINT)
    elif fault == "http-cancel":
        build.cancel_answered = _cancel_over_http(build)
    else:
        worker = _worker_of(process)
        if worker is None:
            return
        with contextlib.suppress(psutil.Error):
            if fault == "kill-worker":
                worker.kill()
            else:  # stop-cont
                worker.suspend()
                _wait_or_end(process, 2.0)
                worker.resume()


def _wait_or_end(process: subprocess.Popen[bytes], seconds: float) -> bool:
    """Wait ``seconds``; True if the process ended meanwhile."""
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _cancel_over_http(build: Build) -> bool:
    url = _url_of(build, timeout_s=5)
    if url is None:
        return False
    host, _, port = url.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(
            "POST", "/cancel", body=b'{"reason": "soak"}',
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        )  # fmt: skip
        return 200 <= connection.getresponse().status < 300
    except (OSError, http.client.HTTPException):
        return False  # the build ended meanwhile
    finally:
        connection.close()


# -- the checks -----------------------------------------------------------------------------------


def _check(build: Build, watching: tuple[subprocess.Popen[bytes], threading.Thread]) -> None:
    reader, client = watching
    killed_writer = build.fault == "kill-supervisor" and build.exit_code == -signal.SIGKILL
    _check_reader(build, reader)
    client.join(10)
    if client.is_alive():
        build.find("the /events stream did not end with the build")
    journal = _check_journal(build, killed_writer)
    stderr = (build.folder / "stderr").read_text(errors="replace")
    if "Traceback" in stderr:
        build.find("a traceback: " + stderr[stderr.index("Traceback") :][:300])
    if journal is not None:
        _check_exit(build, journal, killed_writer)
        ended = any(isinstance(event, BuildFinished) for event in journal)
        if build.fault == "full-disk" and not ended and "may be missing from it" not in stderr:
            build.find("a journal cut short by a full disk, and not a word of it")
    _check_left_behind(build, killed_writer)


def _check_reader(build: Build, reader: subprocess.Popen[bytes]) -> None:
    try:
        reader.wait(timeout=READER_ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        build.find(f"the journal's reader did not end within {READER_ENDS_WITHIN_S:g}s")
        reader.kill()
        reader.wait()
    said = (build.folder / "watch.err").read_text(errors="replace")
    if "Traceback" in said:
        build.find("the reader's traceback: " + said[said.index("Traceback") :][:300])


def _check_journal(build: Build, killed_writer: bool) -> list[Event] | None:
    if not build.journal.exists():
        if build.fault != "full-disk":
            build.find("no journal")
        return None
    try:
        journal = read_journal(build.journal)
    except Exception as error:
        build.find(f"the journal does not read: {type(error).__name__}: {error}")
        return None
    events = list(journal.events)
    seqs = [event.seq for event in events]
    if seqs != list(range(len(seqs))):
        build.find("the journal's events are not contiguous from seq 0")
    problems = [p for p in journal.problems if not (build.fault == "full-disk" or killed_writer)]
    if problems:
        build.find(f"the journal has problems: {problems[:2]}")
    on_disk = {event.seq: event.type for event in events}
    missing = [s for s, kind in build.streamed.items() if on_disk.get(s) != kind]
    if missing and not killed_writer and build.fault != "full-disk":
        build.find(f"{len(missing)} events sent over /events are not in the journal")
    if build.cancel_answered and not any(isinstance(e, CancelRequested) for e in events):
        build.find("POST /cancel was answered, and the journal has no cancel")
    ended = [event for event in events if isinstance(event, BuildFinished)]
    if not ended and not killed_writer and build.fault != "full-disk":
        build.find("the journal never ends")
    replayed = subprocess.run(
        [*CLI, "replay", str(build.journal)], capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    if "Traceback" in replayed.stderr:
        build.find("replay's traceback: " + replayed.stderr[-300:])
    says_unended = ("build never ended", "no build in this journal")
    if not ended and not any(words in replayed.stderr for words in says_unended):
        build.find(f"replay of an unended journal does not say so: {replayed.stderr[-200:]!r}")
    return events


def _check_exit(build: Build, events: list[Event], killed_writer: bool) -> None:
    ended = [event for event in events if isinstance(event, BuildFinished)]
    code = build.exit_code
    if killed_writer:
        return
    if not ended:
        if build.fault != "full-disk":
            build.find(f"exit {code} with no end in the journal")
        return
    outcome = ended[-1].outcome
    expected = EXIT_OF.get(Outcome(outcome))
    if build.fault == "ctrl-c" and code == 130:
        if outcome == Outcome.SUCCESS:
            build.find("exit 130 and a journal that says success")
        return
    if code != expected:
        build.find(f"exit {code}, and the journal says {outcome} (exit {expected})")
    if build.kind.startswith("rtx"):
        exists = build.engine.exists()
        if outcome == Outcome.SUCCESS and not exists:
            build.find("a successful build left no engine")
        if outcome != Outcome.SUCCESS and exists:
            build.find(f"a {outcome} build left an engine")
    # The view closes once the build has ended, while the process still flushes its sinks: a
    # refusal after the journal's end is the view's own end, not a refusal of its owner.
    refused = build.hostility.refused_before(ended[-1].mono_ns) if build.hostility else []
    if build.hostility is not None and refused:
        build.find(f"/healthz refused {len(refused)} of {build.hostility.healthz_asked} times "
                   f"under hostile clients ({refused[0]})")  # fmt: skip


def _check_left_behind(build: Build, killed_writer: bool) -> None:
    deadline = time.monotonic() + 3  # a killed supervisor's worker is killed with it
    while (alive := [p for p in build.pids if psutil.pid_exists(p) and _is_ours(p)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    if alive:
        build.find(f"processes left behind: {sorted(alive)}")
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    if (build.folder / "url").exists() and not killed_writer:
        build.find("the --http-url-file was left behind")
    if build.url is not None:
        host, _, port = build.url.removeprefix("http://").partition(":")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            build.find(f"port {port} still listens")
    if build.journal.exists():
        with build.journal.open("rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                build.find("the journal is still locked")
    expected = {"build.jsonl", "model.engine", "stderr", "watch.err"}
    if killed_writer:  # nothing is left to remove what the build had made
        expected |= {"url"}
    # Nor, after a SIGKILL of the supervisor, the engine the worker was writing (the kernel
    # kills the worker with it): the next write of the same engine removes it (each build here
    # writes its own), said in BENCHMARKS.md, not a new finding.
    left_by_the_killed = ".model.engine." if killed_writer else "\0"
    strays = [
        p.name
        for p in build.folder.iterdir()
        if p.name not in expected
        and not (p.name.startswith(left_by_the_killed) and p.name.endswith(".partial"))
    ]
    if strays:
        build.find(f"files left behind: {strays}")
    tokens = Path(tempfile.gettempdir()) / f"trt-otel-{os.getuid()}"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime) / f"trt-otel-{os.getuid()}" if runtime else tokens
    build_ids = _build_ids(build)
    for build_id in build_ids:
        if (folder / f"{build_id}.token").exists() and not killed_writer:
            build.find("the cancel token's file was left behind")


def _is_ours(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def _build_ids(build: Build) -> list[str]:
    with contextlib.suppress(Exception):
        events = read_journal(build.journal).events
        return [event.build_id for event in events if isinstance(event, BuildStarted)]
    return []


def _report(builds: list[Build], max_rss_mib: float) -> int:
    table: dict[tuple[str, str], list[Build]] = collections.defaultdict(list)
    for build in builds:
        if build.peak_rss > max_rss_mib * 2**20:
            build.find(f"peak RSS {build.peak_rss / 2**20:.0f} MiB, over {max_rss_mib:g} MiB")
        table[(build.kind, build.fault.split(" ")[0])].append(build)
    print(f"\n{'kind':<11} {'fault':<20} {'builds':>6} {'findings':>8} {'exits':<20} "
          f"{'peak RSS':>9}")  # fmt: skip
    for (kind, fault), group in sorted(table.items()):
        exits = collections.Counter(str(b.exit_code) for b in group)
        peak = max(b.peak_rss for b in group) / 2**20
        found = sum(1 for b in group if b.findings)
        shown = ",".join(f"{code}x{count}" for code, count in sorted(exits.items()))
        print(f"{kind:<11} {fault:<20} {len(group):>6} {found:>8} {shown:<20} {peak:>7.0f} M")
    findings = [(b, f) for b in builds for f in b.findings]
    print(f"\n{len(builds)} builds, {len(findings)} findings")
    for build, finding in findings:
        print(f"  #{build.index} {build.kind} {build.fault}: {finding}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
