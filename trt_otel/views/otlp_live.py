"""A running build in the trace backend (``--otlp-live``): snapshots of its open phases, sent while
it runs, since a span is exported only when it ends and a real build's outer phases stay open
for nearly all of it.

While the build runs, each phase that opened is sent within :data:`LIVE_INTERVAL_S` of its
start, and again every :data:`REFRESH_S` while it stays open (through a silent window too; and at
the next look after an export failed, which may have lost it), as a
*snapshot*: a span of the phase's name, from the phase's start to now, marked
``trt.span.snapshot = true``, with how long it has run (``trt.phase.running_s``), its steps, the
build's progress and the builder's liveness (``working``, ``idle``, ``stopped``). Its parent is
the phase's own span, the one sent when the phase ends, so that once the build has ended each
snapshot sits under the phase it showed; its span id is its own (derived from the phase's and
the snapshot's number), never a final span's, so no backend sees a span id twice. A snapshot
ends when it is sent: none looks as if it were still running after the build. A query tells
them apart by the attribute; a replay sends none.

The span budget (``--span-budget``) counts them: once the final spans sent so far and the
snapshots reach it, no more snapshots are sent (said once). The final spans are folded by the
budget as they are without snapshots, so the final trace does not depend on ``--otlp-live``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState, Phase
from trt_otel.views.spans import SpanRecord
from trt_otel.views.terminal import warn
from trt_otel.views.trace_ids import build_trace_id, derived_id, phase_span_id

LIVE_INTERVAL_S = 5.0
"""How often the open phases are looked at: a phase shows within this of its start."""
REFRESH_S = 30.0
"""How often a phase still open is sent again (through a silent window too)."""
SNAPSHOT = "trt.span.snapshot"
"""The attribute that marks a snapshot (true), absent from the final spans."""


class SpanSink(Protocol):
    def emit(self, record: SpanRecord) -> None: ...

    def spans_left(self) -> int:
        """What the span budget allows beside the final spans sent so far."""
        ...

    def failed_exports(self) -> int:
        """How many exports have failed so far."""
        ...


class LiveSnapshots:
    """Sends the open phases of ``model``'s build to ``sink`` every ``interval_s``, on a thread
    of its own, until :meth:`stop`."""

    def __init__(
        self,
        model: ReadModel,
        sink: SpanSink,
        *,
        interval_s: float = LIVE_INTERVAL_S,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self._model = model
        self._sink = sink
        self._interval_s = interval_s
        self._warn = warn
        self.sent = 0
        """Snapshots sent (counted against the span budget)."""
        self._spent = False
        self._stopping = threading.Event()
        self._round = 0
        self._sent_at: dict[int, int] = {}
        """Each open phase's last snapshot (monotonic ns), by phase id."""
        self._failed_exports = 0
        """The sink's failed exports at the last look."""
        self._thread = threading.Thread(target=self._run, name="trt-otel-otlp-live", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            for record in self.snapshot(time.monotonic_ns()):
                self._sink.emit(record)

    def snapshot(self, now_mono_ns: int) -> list[SpanRecord]:
        """The snapshots due at ``now_mono_ns``: each open phase not sent yet, and each sent
        :data:`REFRESH_S` ago or more (none once the build has ended)."""
        with self._model.reading():
            state = self._model.state
            if state.build_id is None or state.outcome is not None:
                return []
            self._round += 1
            open_ids = state.open_phase_ids()
            still_open = set(open_ids)
            self._sent_at = {i: t for i, t in self._sent_at.items() if i in still_open}
            failed = self._sink.failed_exports()
            if failed != self._failed_exports:
                # An export failed since the last look, and the backend may lack any snapshot
                # sent since: every open phase again, rather than after REFRESH_S (a collector
                # that stays down fails an export once per backoff, up to a minute).
                self._failed_exports = failed
                self._sent_at.clear()
            refresh_ns = REFRESH_S * 1e9
            due = [
                phase_id
                for phase_id in open_ids
                if phase_id not in self._sent_at
                or now_mono_ns - self._sent_at[phase_id] >= refresh_ns
            ]
            room = self._sink.spans_left() - self.sent
            if due and room < len(due) and not self._spent:
                self._spent = True
                if self._warn is not None:
                    self._warn(
                        f"no more live snapshots: the span budget is spent ({self.sent:,} "
                        "snapshots sent); the final spans are sent as without them"
                    )
            due = due[: max(0, room)]
            if not due:
                return []
            self.sent += len(due)
            for phase_id in due:
                self._sent_at[phase_id] = now_mono_ns
            build = _BuildOfSnapshots(state, now_mono_ns, self._round)
            return [build.snapshot(state.phases[phase_id]) for phase_id in due]


class _BuildOfSnapshots:
    """What every snapshot of one round shares: the build's trace, clock and progress, read
    once a round."""

    def __init__(self, state: BuildState, now_mono_ns: int, round_: int) -> None:
        self.build_id = state.build_id or ""
        self.trace_id, remote = build_trace_id(dict(state.attributes), self.build_id)
        self.sampled = remote.sampled if remote is not None else True
        self.wall_base = (state.start_wall_ns or 0) - (state.start_mono_ns or 0)
        self.now_mono_ns = now_mono_ns
        self.round = round_
        self.shared: dict[str, Any] = {
            SNAPSHOT: True,
            "trt.build.progress": round(state.progress_ratio(), 4),
            "trt.build.id": self.build_id,
        }
        verdict = state.activity.verdict
        if verdict is not None:
            self.shared["trt.build.liveness"] = str(verdict)

    def snapshot(self, phase: Phase) -> SpanRecord:
        span_id = phase_span_id(self.trace_id, self.build_id, phase.id)
        attributes = {
            **self.shared,
            "trt.phase.running_s": round((self.now_mono_ns - phase.start_mono_ns) / 1e9, 3),
            "trt.phase.num_steps": phase.num_steps,
            "trt.phase.steps_completed": phase.steps_completed,
            "trt.phase.depth": phase.depth,
        }
        return SpanRecord(
            name=phase.name,
            trace_id=self.trace_id,
            span_id=derived_id(64, span_id, "snapshot", self.round),
            parent_span_id=span_id,
            parent_is_remote=False,
            start_ns=self.wall_base + phase.start_mono_ns,
            end_ns=self.wall_base + self.now_mono_ns,
            attributes=attributes,
            sampled=self.sampled,
        )


class ViewContext(Protocol):
    """What this view reads of what a session attaches
    (:class:`trt_otel.app.view_registry.ViewContext`)."""

    model: ReadModel

    def view(self, name: str) -> Any: ...


@contextmanager
def attach(context: ViewContext) -> Iterator[LiveSnapshots | None]:
    """The view as the registry attaches it: snapshots to the span export (none without one),
    stopped before the final spans' flush begins."""
    spans = context.view("spans")
    if spans is None:
        yield None
        return
    live = LiveSnapshots(context.model, spans, warn=warn)
    live.start()
    try:
        yield live
    finally:
        live.stop()
