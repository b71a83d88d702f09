"""A running build in the trace backend (``--otlp-live on``): its open phases arrive as snapshot
spans while it runs, through a silent window too, told apart by ``trt.span.snapshot``; once it
ends, the final spans are what they are without it, and every snapshot sits under its phase's
final span with an id of its own. A real OTLP receiver decoding the wire protocol."""

from __future__ import annotations

import pytest

from cli import start_cli
from otlp_receiver import OtlpReceiver, ReceivedSpan
from trt_otel import BuildMonitor, ManualClock
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.otlp_live import LIVE_INTERVAL_S, REFRESH_S, LiveSnapshots
from trt_otel.views.spans import SpanRecord
from waiting import wait_until

SNAPSHOT = "trt.span.snapshot"


def snapshots(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.attributes.get(SNAPSHOT) is True]


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
    final = [s for s in spans if SNAPSHOT not in s.attributes]
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
    def emit(self, record: SpanRecord) -> None:
        raise AssertionError("only snapshot() is called here")


def test_a_phase_is_sent_when_it_opens_and_again_while_it_stays_open() -> None:
    clock, model = ManualClock(), ReadModel()
    monitor = BuildMonitor(backend="none", clock=clock, model=model)
    live = LiveSnapshots(model, Unsent())  # told directly, its thread not started

    def tick(seconds: float) -> list[str]:
        clock.advance(seconds)
        return [record.name for record in live.snapshot(clock.mono_ns())]

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
