"""A running build in a real trace backend: Arize Phoenix, queried through its span API while a
real TensorRT-RTX build is silent, once it has ended, and after a build killed whole is ended
from its journal. Each test's spans go to a project of their own
(``openinference.project.name``, a resource attribute through ``OTEL_RESOURCE_ATTRIBUTES``).

Skipped, with the reason, where Phoenix's environment is not installed (``make phoenix``), or
where TensorRT-RTX does not import."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import run_cli, start_cli
from phoenix_server import MISSING, PHOENIX, PhoenixServer, PhoenixSpan
from rtx_builds import HELD_BLOCKS, SILENT_PHASE, held_in_silent_step, write_residual
from trt_otel import read_journal
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.core.events import BuildStarted, PhaseFinished, PhaseStarted
from trt_otel.views.otlp_live import LIVE_INTERVAL_S, REFRESH_S
from trt_otel.views.trace_ids import build_trace_id, phase_span_id
from waiting import wait_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.xdist_group("phoenix"),
    pytest.mark.skipif(not PHOENIX.exists(), reason=MISSING),
    # The first test pays for Phoenix's start (its fixture's set-up counts to its time): up to
    # 122 s at the start of a full run, beside a real build of over a minute.
    pytest.mark.timeout(600),
]


PHOENIX_POLL_S = 0.5
"""How often a test asks Phoenix for its spans: each ask is a query of its database, and asked
back to back (every 20 ms) they compete with the build's exports for a Phoenix that shares a
loaded machine."""


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhoenixServer]:
    server = PhoenixServer(tmp_path_factory.mktemp("phoenix"))
    try:
        yield server
    finally:
        server.close()


def environment(project: str) -> dict[str, str]:
    return {**os.environ, "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}"}


def running(spans: list[PhoenixSpan]) -> set[str]:
    """The span ids of phases a snapshot showed that have no final span yet: what a backend's
    user sees as still running."""
    final = {s.span_id for s in spans if not s.snapshot}
    return {s.parent_id for s in spans if s.snapshot and s.parent_id} - final


def wait_for_silent_snapshot(phoenix: PhoenixServer, project: str) -> None:
    """Until Phoenix holds a snapshot of TensorRT-RTX's silent phase: the build is inside it."""
    wait_until(
        lambda: SILENT_PHASE in {s.name for s in phoenix.spans(project) if s.snapshot},
        "a snapshot of the silent phase in Phoenix",
        120,
        every_s=PHOENIX_POLL_S,
    )


def start_build(tmp_path: Path, endpoint: list[str], project: str) -> tuple[Any, Path]:
    model = write_residual(tmp_path / "residual.onnx", HELD_BLOCKS)
    journal = tmp_path / "build.jsonl"
    process = start_cli(
        "build", model, "-o", tmp_path / "residual.engine", "--journal", journal,
        "--shapes", RESIDUAL_SHAPES, "--no-progress", "--no-gpu", *endpoint,
        env=environment(project), start_new_session=True,
    )  # fmt: skip
    return process, journal


def test_a_real_builds_open_phases_are_in_phoenix_while_it_runs_and_its_trace_ends_whole(
    rtx: Any, tmp_path: Path, phoenix: PhoenixServer
) -> None:
    project = "trt-otel-running"
    endpoint = ["--otlp-endpoint", phoenix.url, "--otlp-protocol", "http/protobuf"]
    process, journal = start_build(tmp_path, endpoint, project)
    try:
        # While TensorRT is silent: the open phases, the silent one among them, as snapshots.
        with held_in_silent_step(journal):
            wait_for_silent_snapshot(phoenix, project)
            assert process.poll() is None, "shown while the build ran"
            shown = [s for s in phoenix.spans(project) if s.snapshot]
            assert {"Building engine", SILENT_PHASE} <= {s.name for s in shown}
            assert all(0 < s.attributes["trt.build.progress"] < 1 for s in shown)
            # A phase is sent on the first look after it opens: within one interval of its
            # start (and the time it takes a loaded machine to get round to it).
            first = min(
                s.attributes["trt.phase.running_s"] for s in shown if s.name == SILENT_PHASE
            )
            if first > LIVE_INTERVAL_S + 2.0:
                os.killpg(process.pid, signal.SIGKILL)
                _, said = process.communicate(timeout=30)
                shown_at = sorted((s.name, s.attributes["trt.phase.running_s"]) for s in shown)
                pytest.fail(f"first shown at {first}s: {shown_at}; the build said: {said[-3000:]}")
            assert running(phoenix.spans(project)), "Phoenix has phases still running"
        _, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=30)  # its pipes closed: a failure here fails no other
    assert process.returncode == 0, err
    phases = Counter(e.name for e in read_journal(journal).events if isinstance(e, PhaseStarted))
    wait_until(
        lambda: len([s for s in phoenix.spans(project) if not s.snapshot]) >= phases.total() + 1,
        "every final span in Phoenix",
        60,
        every_s=PHOENIX_POLL_S,
    )
    spans = phoenix.spans(project)
    final = [s for s in spans if not s.snapshot]
    assert Counter(s.name for s in final if s.parent_id) == phases, "one span a phase"
    assert len([s for s in final if not s.parent_id]) == 1, "and one for the build"
    assert running(spans) == set(), "once it has ended, no phase is still running"


def test_a_build_killed_whole_and_replayed_leaves_nothing_running_in_phoenix(
    rtx: Any, tmp_path: Path, phoenix: PhoenixServer
) -> None:
    project = "trt-otel-killed"
    endpoint = [
        "--otlp-endpoint",
        f"http://127.0.0.1:{phoenix.grpc_port}",
        "--otlp-protocol",
        "grpc",
    ]
    process, journal = start_build(tmp_path, endpoint, project)
    try:
        with held_in_silent_step(journal):
            wait_for_silent_snapshot(phoenix, project)
            os.killpg(process.pid, signal.SIGKILL)  # every process of the build, held or not
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
    assert running(phoenix.spans(project)), "killed: its open phases look as if still running"
    replayed = run_cli("replay", *endpoint, journal, env=environment(project), timeout=120)
    assert replayed.returncode == 4, replayed.stderr
    wait_until(
        lambda: not running(phoenix.spans(project)),
        "no phase running in Phoenix",
        60,
        every_s=PHOENIX_POLL_S,
    )
    spans = phoenix.spans(project)
    ended = {s.span_id: s for s in spans if not s.snapshot}
    shown = {s.parent_id for s in spans if s.snapshot and s.parent_id}
    left_open = open_phase_span_ids(journal)
    assert SILENT_PHASE in {ended[span_id].name for span_id in left_open}
    # A phase shown while it ran may have finished before the kill: only those the kill left
    # open are ended as failed by the replay.
    for span_id in shown | left_open:
        failed = ended[span_id].status_code == "ERROR"
        assert failed == (span_id in left_open), (ended[span_id].name, ended[span_id].status_code)


def open_phase_span_ids(journal: Path) -> set[str]:
    """The span ids (hex, as Phoenix gives them) of the phases a journal leaves open."""
    events = read_journal(journal).events
    start = next(e for e in events if isinstance(e, BuildStarted))
    trace_id, _ = build_trace_id(start.attributes, start.build_id)
    open_by_name: dict[str, int] = {}
    for event in events:
        if isinstance(event, PhaseStarted):
            open_by_name[event.name] = event.seq
        elif isinstance(event, PhaseFinished):
            open_by_name.pop(event.name, None)
    return {f"{phase_span_id(trace_id, start.build_id, seq):016x}" for seq in open_by_name.values()}


def test_a_silent_window_is_refreshed_in_phoenix_while_it_lasts(
    tmp_path: Path, phoenix: PhoenixServer
) -> None:
    """Through a silence longer than the refresh (a simulated build's, to keep the wait to
    the refresh itself): each open phase is sent again, fresh, within REFRESH_S."""
    project = "trt-otel-refresh"
    process = start_cli(
        "demo", "--speed", "0", "--silence", f"{REFRESH_S + 2 * LIVE_INTERVAL_S:g}s",
        "--no-progress", "--no-gpu", "--otlp-endpoint", phoenix.url,
        "--otlp-protocol", "http/protobuf",
        env=environment(project), start_new_session=True,
    )  # fmt: skip

    def refreshed() -> dict[str, list[float]]:
        seen: dict[str, list[float]] = {}
        for span in phoenix.spans(project):
            if span.snapshot:
                seen.setdefault(span.name, []).append(span.attributes["trt.phase.running_s"])
        return {name: sorted(times) for name, times in seen.items() if len(times) > 1}

    try:
        wait_until(
            refreshed,
            "a phase sent again in Phoenix",
            REFRESH_S + 4 * LIVE_INTERVAL_S,
            every_s=PHOENIX_POLL_S,
        )
        assert process.poll() is None, "refreshed while the build ran"
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
    for name, times in refreshed().items():
        assert times[0] <= LIVE_INTERVAL_S + 2.0, f"{name} first shown late: {times}"
        gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
        assert all(REFRESH_S - 1.0 <= gap <= REFRESH_S + LIVE_INTERVAL_S + 2.0 for gap in gaps)
