"""Where the supervisor's replay thread spends its CPU: each part, alone, on one build's events.

A build's supervisor takes the callbacks its worker made (``BuildMonitor.record``), checks and
numbers each into an event, folds it into the read model, and tells the read model's
subscribers (the live page's timeline, the plain console lines, the span export, the log
records); each batch's events then go to the journal's encoder and the HTTP feed. Measured here
one part at a time, in one thread, as CPU time (the steadiest figure on a loaded machine), on
the events of ``command_cost.py``'s phase-dense trace:

- the monitor and the read model: the callbacks' records taken 512 at a time, as frames are
  (what every build pays, whatever views it has);
- the read model alone, folding the events;
- each subscriber, told what the read model tells it, recorded once (so a figure is the
  subscriber's own, not the model's again);
- the journal's encoding and the HTTP feed, a batch of 512 at a time.

``python benchmarks/projection_cost.py [STEPS] [ROUNDS]`` (default: a million steps, five
rounds); each figure is the fastest round (the one least disturbed by the machine's other
work), with the median beside it.
"""

from __future__ import annotations

import gc
import io
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from command_cost import ROOT, phase_dense_trace

from trt_otel.app.config import SpanConfig
from trt_otel.capture.monitor import BuildMonitor, CallbackRecord
from trt_otel.core.events import Event, PhaseFinished, PhaseStarted, StepCompleted
from trt_otel.core.journal_codec import encode_events
from trt_otel.core.journal_reader import read_journal
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import Phase

BATCH = 512
DEAD_COLLECTOR = "http://127.0.0.1:9"
Told = list[tuple[Event, tuple[Phase, ...]]]


def journal_of(trace: Path, folder: Path) -> list[Event]:
    """The trace's events, as ``trt-otel demo`` records them."""
    journal = folder / "trace.journal.jsonl"
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "trt-otel"),
            "demo",
            "--trace",
            str(trace),
            "--speed",
            "0",
            "--journal",
            str(journal),
            "--no-progress",
            "--no-gpu",
            "--no-summary",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return list(read_journal(journal).events)


def records_of(events: Sequence[Event]) -> list[CallbackRecord]:
    """The callbacks' records a worker would have sent for ``events``."""
    records: list[CallbackRecord] = []
    for event in events:
        kind = type(event)
        stamp = (event.wall_ns, event.mono_ns, event.thread)
        if kind is StepCompleted:
            records.append(("step", *stamp, event.name, event.step))  # type: ignore[attr-defined]
        elif kind is PhaseStarted:
            records.append(
                ("phase_start", *stamp, event.name, event.parent, event.num_steps)  # type: ignore[attr-defined]
            )
        elif kind is PhaseFinished:
            records.append(("phase_finish", *stamp, event.name))  # type: ignore[attr-defined]
    return records


def cpu_s(work: Callable[[], object]) -> float:
    gc.collect()
    began = time.process_time()
    work()
    return time.process_time() - began


def monitor_and_model(records: list[CallbackRecord]) -> float:
    monitor = BuildMonitor(model=ReadModel(), backend="none")  # as the supervisor's is
    monitor.start()

    def take() -> None:
        for start in range(0, len(records), BATCH):
            monitor.record(records[start : start + BATCH])

    return cpu_s(take)


def model_alone(events: list[Event]) -> float:
    model = ReadModel()

    def fold() -> None:
        for start in range(0, len(events), BATCH):
            model.handle(events[start : start + BATCH])

    return cpu_s(fold)


class _Recorder:
    """A subscriber that keeps what it is told, and the phases started, by their event."""

    name = "recorder"

    def __init__(self, model: ReadModel) -> None:
        self.model = model
        self.told: Told = []
        self.started: dict[int, Phase] = {}

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        self.told.append((event, tuple(closed)))
        if type(event) is PhaseStarted:
            self.started[event.seq] = self.model.state.phases[event.seq]

    def on_steps(self, last: StepCompleted) -> None:
        """Nothing to keep."""

    def close(self) -> None:
        """Nothing to release."""


def told_by_the_model(events: list[Event]) -> tuple[ReadModel, Told]:
    """What the read model tells a subscriber, and the model as it ended, with every phase of
    the build back in its state (a subscriber looks a started phase up there)."""
    model = ReadModel()
    recorder = _Recorder(model)
    model.subscribe(recorder)
    for start in range(0, len(events), BATCH):
        model.handle(events[start : start + BATCH])
    model.state.phases = {**recorder.started, **model.state.phases}
    return model, recorder.told


def subscribers() -> dict[str, Callable[[ReadModel], Any]]:
    from trt_otel.views.console import PlainLines
    from trt_otel.views.otlp import OtlpSpanExport
    from trt_otel.views.otlp_logs import OtlpLogExport
    from trt_otel.views.report.live import LiveTimeline

    config = SpanConfig(endpoint=DEAD_COLLECTOR)
    spans, logs = config.settings(), config.settings(signal="logs")
    assert spans is not None and logs is not None and config.logs_level is not None
    level = config.logs_level
    return {
        "the live page's timeline": LiveTimeline,
        "plain console lines": lambda m: PlainLines(m, io.StringIO(), heartbeat_s=None),
        "span export": lambda m: OtlpSpanExport(spans, warn=lambda _message: None, model=m),
        "log records": lambda m: OtlpLogExport(logs, level, model=m),
    }


def one_subscriber(make: Callable[[ReadModel], Any], model: ReadModel, told: Told) -> float:
    subscriber = make(model)
    on_event = subscriber.on_event

    def tell() -> None:
        for event, closed in told:
            on_event(event, closed)

    spent = cpu_s(tell)
    if hasattr(subscriber, "shutdown"):
        subscriber.shutdown(0.0)  # nothing waits for the dead collector
    return spent


def batches(handle: Callable[[list[Event]], object], events: list[Event]) -> float:
    return cpu_s(lambda: [handle(events[i : i + BATCH]) for i in range(0, len(events), BATCH)])


def main() -> int:
    import logging

    from trt_otel.views.http_feed import EventFeed

    logging.disable(logging.CRITICAL)  # the dead collector's retries say nothing here
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        callbacks = phase_dense_trace(folder / "trace.jsonl", steps)
        events = journal_of(folder / "trace.jsonl", folder)
    records = records_of(events)
    model, told = told_by_the_model(events)
    print(
        f"{steps:,} steps: {callbacks:,} callbacks, {len(events):,} events, {len(told):,} told "
        f"to each subscriber; CPU of each part in one thread, the fastest of {rounds} rounds "
        "(median)",
        flush=True,
    )
    parts: dict[str, Callable[[], float]] = {
        "monitor and read model (every build)": lambda: monitor_and_model(records),
        "read model alone": lambda: model_alone(events),
        **{
            name: (lambda make=make: one_subscriber(make, model, told))  # type: ignore[misc]
            for name, make in subscribers().items()
        },
        "journal encoding": lambda: batches(encode_events, events),
        "HTTP feed": lambda: batches(EventFeed().handle, events),
    }
    for name, measure in parts.items():
        figures = [measure() for _ in range(rounds)]
        best, median = min(figures), statistics.median(figures)
        print(
            f"  {name:38s} {best:6.2f} s ({median:5.2f}); {best / len(events) * 1e6:5.2f} us "
            "an event",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
