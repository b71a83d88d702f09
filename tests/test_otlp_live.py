"""A running build in the trace backend (``--otlp-live on``): its open phases arrive as snapshot
spans while it runs, through a silent window too, told apart by ``trt.span.snapshot``; once it
ends, the final spans are what they are without it, and every snapshot sits under its phase's
final span with an id of its own. A real OTLP receiver decoding the wire protocol."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cli import run_cli, start_cli
from otlp_receiver import OtlpReceiver, final_spans, snapshots
from rtx_builds import HELD_BLOCKS, SILENT_PHASE, held_in_silent_step, write_residual
from trt_otel import BuildMonitor, ManualClock
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.otlp_live import LIVE_INTERVAL_S, REFRESH_S, SNAPSHOT, LiveSnapshots
from trt_otel.views.spans import SpanRecord
from waiting import wait_until


@pytest.mark.e2e
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_open_phases_show_while_the_build_runs_and_the_final_trace_is_unchanged(
    receiver: OtlpReceiver, protocol: str
) -> None:
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    process = start_cli(
        "demo", "--speed", "0", "--silence", "12s", "--no-progress", "--no-gpu",
        "--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", protocol,
        "--otlp-live", "on", "--sample-interval", "0.5s",
    )  # fmt: skip
    try:
        # Within the silence: the phases still open, the build's outermost among them.
        wait_until(lambda: snapshots(receiver.spans), "a snapshot during the build", 30)
        assert process.poll() is None, "the snapshot came while the build ran"
        live = snapshots(receiver.spans)
        assert {s.name for s in live} >= {"Building engine"}
        first = live[0]
        assert first.attributes["trt.phase.running_s"] > 0
        assert 0 < first.attributes["trt.build.progress"] < 1
        assert first.attributes.get("trt.build.liveness") in (None, "working", "idle")
        assert first.end_ns > first.start_ns
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    spans = receiver.spans
    final = final_spans(spans)
    shown = snapshots(spans)
    by_id = {s.span_id: s for s in final}
    assert len(by_id) == len(final), "every final span once"
    assert not {s.span_id for s in shown} & set(by_id), "a snapshot never reuses a span id"
    for snapshot in shown:
        phase = by_id[snapshot.parent_span_id]  # under the span of the phase it showed
        assert phase.name == snapshot.name
        assert phase.start_ns == snapshot.start_ns and snapshot.end_ns <= phase.end_ns
    assert len({s.span_id for s in shown}) == len(shown)


class Unsent:
    def __init__(self, spans_left: int = 10_000) -> None:
        self.left = spans_left
        self.failed = 0

    def emit(self, record: SpanRecord) -> None:
        raise AssertionError("only snapshot() is called here")

    def spans_left(self) -> int:
        return self.left

    def failed_exports(self) -> int:
        return self.failed


class Looked:
    """A build on a manual clock, and its live snapshots told directly (their thread not
    started): :meth:`after` moves the clock on and takes a look."""

    def __init__(self, sink: Unsent, warn: Callable[[str], None] | None = None) -> None:
        self.clock, model = ManualClock(), ReadModel()
        self.monitor = BuildMonitor(backend="none", clock=self.clock, model=model)
        self.live = LiveSnapshots(model, sink, warn=warn)

    def after(self, seconds: float) -> list[str]:
        """The names of the phases sent at the look ``seconds`` on."""
        self.clock.advance(seconds)
        return [record.name for record in self.live.snapshot(self.clock.mono_ns())]

    def two_phases_open(self) -> None:
        self.monitor.start()
        self.monitor.phase_start("Building engine", None, 3)
        self.monitor.phase_start("Determining refit engines", "Building engine", 1)


BOTH = ["Building engine", "Determining refit engines"]


def test_a_phase_is_sent_when_it_opens_and_again_while_it_stays_open() -> None:
    looked = Looked(Unsent())
    monitor, tick = looked.monitor, looked.after
    assert tick(0) == [], "nothing before the build starts"
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    assert tick(LIVE_INTERVAL_S) == ["Building engine"]
    monitor.phase_start("Determining refit engines", "Building engine", 1)
    assert tick(LIVE_INTERVAL_S) == ["Determining refit engines"], "only what is new"
    assert tick(REFRESH_S - LIVE_INTERVAL_S) == ["Building engine"], "refreshed, in silence"
    monitor.phase_finish("Determining refit engines")
    assert tick(REFRESH_S) == ["Building engine"], "a closed phase is not sent again"
    monitor.end()
    assert tick(REFRESH_S) == [], "nothing once the build has ended"
    monitor.close()


def test_a_phase_recorded_after_the_builds_end_is_never_sent() -> None:
    """A callback after the build's end (a program that goes on calling its monitor) is
    recorded, and may open a phase: the build is over, so no snapshot shows it running."""
    looked = Looked(Unsent())
    looked.two_phases_open()
    assert looked.after(LIVE_INTERVAL_S) == BOTH
    looked.monitor.end()
    looked.monitor.phase_start("Building engine", None, 1)
    state = looked.monitor.state
    assert state.outcome is not None and state.open_phase_ids(), "ended, and a phase open"
    assert looked.after(LIVE_INTERVAL_S) == []
    assert looked.after(REFRESH_S) == [], "nothing once the build has ended"
    looked.monitor.close()


def test_after_a_failed_export_every_open_phase_is_sent_again_at_the_next_look() -> None:
    """A failed export may have lost a phase's only snapshot: the backend would show nothing of
    it until its refresh, 30 s on (a collector slow to answer once under load)."""
    sink = Unsent()
    looked = Looked(sink)
    looked.two_phases_open()
    assert looked.after(LIVE_INTERVAL_S) == BOTH
    sink.failed = 1  # the export that carried them failed
    assert looked.after(LIVE_INTERVAL_S) == BOTH
    assert looked.after(LIVE_INTERVAL_S) == [], "once per failure, not at every look"
    assert looked.after(REFRESH_S) == BOTH
    looked.monitor.close()


def test_the_span_budget_counts_the_snapshots_and_their_end_is_said_once() -> None:
    warnings: list[str] = []
    sink = Unsent(spans_left=3)
    looked = Looked(sink, warn=warnings.append)
    looked.two_phases_open()
    assert looked.after(LIVE_INTERVAL_S) == BOTH
    assert warnings == []
    sink.left = 2  # a final span sent meanwhile: room for none more than the two sent
    assert looked.after(REFRESH_S) == []
    assert len(warnings) == 1 and "span budget" in warnings[0]
    sink.left = 3
    assert looked.after(REFRESH_S) == ["Building engine"], (
        "what the budget allows, oldest phase first"
    )
    assert looked.after(REFRESH_S) == []
    assert len(warnings) == 1, "said once"
    assert looked.live.sent == 3
    looked.monitor.close()


def test_snapshots_that_just_fit_the_budget_are_sent_without_a_warning() -> None:
    warnings: list[str] = []
    looked = Looked(Unsent(spans_left=2), warn=warnings.append)
    looked.two_phases_open()
    assert len(looked.after(LIVE_INTERVAL_S)) == 2
    assert warnings == [], "room for both: the budget is not spent"
    looked.monitor.close()


def test_final_spans_past_the_budget_leave_no_room_for_any_snapshot() -> None:
    """Final spans sent after the snapshots can take the budget below what the snapshots
    already used: the room is then less than none, and no snapshot is sent (not the due ones
    but the last, as a slice by a negative room would)."""
    warnings: list[str] = []
    sink = Unsent(spans_left=2)
    looked = Looked(sink, warn=warnings.append)
    looked.two_phases_open()
    assert looked.after(LIVE_INTERVAL_S) == BOTH
    sink.left = 1  # two snapshots sent, room for one span in all: one short
    assert looked.after(REFRESH_S) == []
    assert looked.live.sent == 2
    assert len(warnings) == 1 and "span budget" in warnings[0]
    looked.monitor.close()


def test_each_snapshot_of_a_phase_has_a_span_id_of_its_own_under_the_phases_span() -> None:
    """A phase open through a refresh is sent twice: the backend gets two spans, each under
    the phase's own span, never one span id twice."""
    looked = Looked(Unsent())
    looked.two_phases_open()
    clock, live = looked.clock, looked.live
    clock.advance(LIVE_INTERVAL_S)
    first = live.snapshot(clock.mono_ns())
    clock.advance(REFRESH_S)
    again = live.snapshot(clock.mono_ns())
    assert [r.name for r in first] == [r.name for r in again] == BOTH
    assert [r.parent_span_id for r in again] == [r.parent_span_id for r in first]
    span_ids = {r.span_id for r in (*first, *again)}
    assert len(span_ids) == 4, "each snapshot an id of its own"
    assert not span_ids & {r.parent_span_id for r in first}, "never the phase's own id"
    looked.monitor.close()


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(("closer", "protocol"), [("replay", "http/protobuf"), ("watch", "grpc")])
def test_a_build_killed_whole_is_ended_from_its_journal_and_nothing_stays_running(
    rtx: Any, tmp_path: Path, receiver: OtlpReceiver, closer: str, protocol: str
) -> None:
    """Every process of a real build SIGKILLed in its silent window (the process group, as a
    scheduler's kill is): the backend holds snapshots of phases whose own spans never came.
    ``replay`` of the journal, or ``watch`` of it (its writer gone: a lost build, whose spans
    are flushed as an ended one's), sends those spans, ended as errors (unfinished), so that
    no snapshot is left without its phase's final span."""
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    endpoint = ["--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", protocol]
    model = write_residual(tmp_path / "residual.onnx", HELD_BLOCKS)
    journal = tmp_path / "killed.jsonl"
    process = start_cli(
        "build", model, "-o", tmp_path / "residual.engine", "--journal", journal,
        "--shapes", RESIDUAL_SHAPES, "--no-progress", "--no-gpu", *endpoint,
        "--otlp-live", "on", start_new_session=True,
    )  # fmt: skip
    try:
        # Killed once the journal too has the silent phase (the hold waits for it): what the
        # backend shows comes from the live model, a moment ahead of the journal on a loaded
        # machine, so the journal then holds every phase a snapshot showed.
        with held_in_silent_step(journal):
            wait_until(
                lambda: SILENT_PHASE in {s.name for s in snapshots(receiver.spans)},
                "a snapshot of the silent phase",
                120,
            )
            os.killpg(process.pid, signal.SIGKILL)  # the CLI, its worker: every process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    before = receiver.spans
    assert not [s for s in before if SNAPSHOT not in s.attributes and not s.parent_span_id]
    shown = {s.parent_span_id: s.name for s in snapshots(before)}
    # A snapshot outlives its phase: one shown open that finished before the kill sent its own
    # span then. Those open at the kill are the ones only the journal can end.
    ended_before = {s.span_id for s in before if SNAPSHOT not in s.attributes}
    open_at_kill = {span_id: name for span_id, name in shown.items() if span_id not in ended_before}
    assert SILENT_PHASE in open_at_kill.values(), "the silent phase was open when it was killed"

    ended = run_cli(closer, *endpoint, journal, timeout=120)
    # replay: a build that never ended is not a success (4); watch: the build was lost (2).
    assert ended.returncode == (4 if closer == "replay" else 2), ended.stderr
    assert ("never ended" if closer == "replay" else "the build was lost") in ended.stderr
    wait_until(
        lambda: shown.keys() <= {s.span_id for s in receiver.spans},
        "the final span of every phase a snapshot showed",
        30,
    )  # (on failure: compare `shown` with the phases of `journal`)
    final = {s.span_id: s for s in receiver.spans if SNAPSHOT not in s.attributes}
    for span_id, name in shown.items():
        assert final[span_id].name == name
    # The silent phase and every phase above it were open at the kill (a phase shown open that
    # ended just before it may have its end in the journal, and is ended as it ended there).
    (silent,) = [final[span_id] for span_id, name in open_at_kill.items() if name == SILENT_PHASE]
    unfinished = [silent]
    while unfinished[-1].parent_span_id in final:
        unfinished.append(final[unfinished[-1].parent_span_id])
    assert len(unfinished) > 2, "the build, the phases above the silent one, and it"
    for phase in unfinished:
        assert phase.status_code == 2, f"{phase.name} ended as an error"
    (build,) = [s for s in final.values() if not s.parent_span_id]
    assert build.status_code == 2 and "log ends before the build did" in build.status_message
    assert build.attributes["cicd.pipeline.result"] == "error"
    assert build.attributes["error.type"] == "unfinished"
