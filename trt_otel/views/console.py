"""The build shown to people: a live tree in a terminal, plain lines elsewhere.

Both read the build's :class:`~trt_otel.core.readmodel.ReadModel` (the same model ``/status`` reads,
and ``watch`` and ``replay`` build from the same events, so they show what the build showed).
Recording is apart from drawing: the model folds on its own thread; rich's refresh thread draws
the live tree from it at a fixed rate. Plain lines are written as events arrive, as one of the
model's subscribers.

Every name shown comes from events, and events can come from outside (a journal replayed or
watched, a build's HTTP view): phase names, reasons and the rest are shown with their control
characters escaped (:func:`~trt_otel.views.terminal.printable`), so a crafted one cannot clear
the screen or forge a line. The model keeps them verbatim.

rich is imported where the tree is drawn: plain lines (every build in CI, on no terminal) do not
draw one, and every build pays for what the command line imports before it starts.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from trt_otel.core.activity import Verdict
from trt_otel.core.attempts import attempt_of
from trt_otel.core.clock import SYSTEM_CLOCK, Clock
from trt_otel.core.durations import format_duration
from trt_otel.core.eta import Estimate, format_eta
from trt_otel.core.events import (
    Anomaly,
    BuildFinished,
    BuildStarted,
    CancelRequested,
    Event,
    GpuSample,
    LogMessage,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from trt_otel.core.readmodel import ReadModel, SiblingGroup, TreeNode
from trt_otel.core.state import BuildState, BuildStatus, Phase, PhaseStatus
from trt_otel.views.terminal import printable

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.text import Text
    from rich.tree import Tree

_OUTCOME_STYLE = {
    Outcome.SUCCESS: "bold green",
    Outcome.FAILURE: "bold red",
    Outcome.CANCELLATION: "bold yellow",
    Outcome.TIMEOUT: "bold red",
}
_BAR_WIDTH = 20


def _bar(ratio: float) -> str:
    filled = round(max(0.0, min(1.0, ratio)) * _BAR_WIDTH)
    return "━" * filled + "╺" + "─" * (_BAR_WIDTH - filled) if filled < _BAR_WIDTH else "━" * 21


def _now_ns(state: BuildState, now_mono_ns: int | None) -> int | None:
    if state.end_mono_ns is not None:
        return state.end_mono_ns
    return now_mono_ns if now_mono_ns is not None else state.last_event_mono_ns


def render_build(
    model: ReadModel,
    now_mono_ns: int | None = None,
    eta: Estimate | None = None,
    *,
    silent_s: float | None = None,
    never_ended: bool = False,
    builder_error: str | None = None,
) -> RenderableType:
    """The build as a header line and a tree of phases (hold the model's lock, or own it).

    Open phases are shown with their progress; repeated phases are folded by the model's rule
    (:meth:`~trt_otel.core.readmodel.ReadModel.tree`) into one line with a count and their total
    time.
    ``silent_s``: how long TensorRT has made no callback, said once it is long
    (:data:`SILENCE_SHOWN_S`); ``never_ended``: a record that stops before the build's end;
    ``builder_error``: the builder's own reason for a failure (:class:`BuilderErrors`).
    """
    from rich.console import Group
    from rich.tree import Tree

    state = model.state
    now = _now_ns(state, now_mono_ns)
    header = _header(state, now, never_ended=never_ended)
    running = state.outcome is None and not never_ended
    if eta is not None and running and state.status is not BuildStatus.CANCELLING:
        header.append(f"  {format_eta(eta)}", "dim")  # no estimate of a build being stopped
    if running and silent_s is not None and silent_s >= SILENCE_SHOWN_S:
        header.append(f"  silent for {format_duration(silent_s)}", "yellow")
        inner = state.innermost_open()
        if inner is not None:
            header.append(f" in {printable(inner)}", "yellow")
        liveness = state.activity.describe()
        if liveness is not None:
            working = state.activity.verdict is Verdict.WORKING
            header.append(f": {printable(liveness)}", "green" if working else "bold red")
    tree = Tree(header, guide_style="dim")
    _add_nodes(tree, model, None, now)
    footer = _footer(state, builder_error)
    return Group(tree, footer) if footer is not None else tree


def _header(state: BuildState, now: int | None, *, never_ended: bool = False) -> Text:
    from rich.text import Text

    elapsed = (
        (now - state.start_mono_ns) / 1e9
        if now is not None and state.start_mono_ns is not None
        else 0.0
    )
    status = state.status
    text = Text()
    if state.outcome is not None:
        text.append(f"build {state.outcome.value}", _OUTCOME_STYLE[state.outcome])
    elif never_ended:
        text.append("build never ended", "bold red")
    elif status is BuildStatus.CANCELLING:
        text.append("cancelling", "bold yellow")
    else:
        text.append("building", "bold cyan")
    ratio = state.progress_ratio()
    text.append(f"  {_bar(ratio)} {ratio:4.0%}", "cyan")
    text.append(f"  {format_duration(elapsed)}", "dim")
    text.append(f"  {_count(state.steps_completed_total, 'step')}", "dim")
    gpu = state.gpu
    if gpu is not None and state.outcome is None:
        text.append(f"  GPU {_gpu_text(gpu)}", "dim")
    anomalies = sum(state.anomalies.values())
    if anomalies:
        text.append(f"  {anomalies} protocol anomalies", "yellow")
    return text


def _gpu_text(sample: GpuSample) -> str:
    parts = []
    if sample.utilization is not None:
        parts.append(f"{sample.utilization:.0%}")
    if sample.memory_used_bytes is not None:
        used = sample.memory_used_bytes / 2**30
        total = f"/{sample.memory_total_bytes / 2**30:.0f}" if sample.memory_total_bytes else ""
        parts.append(f"{used:.1f}{total} GiB")
    return " ".join(parts) or "sampled"


MAX_BUILDER_ERROR = 1000
"""The most of a builder error shown on the terminal (the journal keeps it whole)."""


class BuilderErrors:
    """The builder logger's last ERROR or INTERNAL_ERROR message of the current build: when
    TensorRT returns no engine, its own reason, which the failure line then shows."""

    def __init__(self) -> None:
        self.last: str | None = None

    def saw(self, event: Event) -> None:
        if type(event) is BuildStarted:
            self.last = None  # a journal of several builds: only this one's
        elif type(event) is LogMessage and event.severity.upper() in ("ERROR", "INTERNAL_ERROR"):
            self.last = event.message

    def said(self, detail: str) -> str | None:
        """The last error, unless ``detail`` (the build's end) already says it."""
        if self.last is None or self.last in detail:
            return None
        text = self.last.strip()
        return text if len(text) <= MAX_BUILDER_ERROR else text[: MAX_BUILDER_ERROR - 1] + "…"


def _footer(state: BuildState, builder_error: str | None = None) -> Text | None:
    from rich.text import Text

    if state.cancel is not None:
        cancel = state.cancel
        text = Text(
            f"cancel requested by {printable(cancel.source)}: {printable(cancel.reason)}",
            "yellow",
        )
        detail = state.outcome_detail
        if state.outcome is not None and detail and detail != cancel.reason:
            # How it ended: "...; its process was stopped with SIGTERM".
            text.append(f"\nended: {printable(detail)}", "yellow")
        return text
    if state.outcome is Outcome.FAILURE and state.outcome_detail:
        text = Text(f"failed: {printable(state.outcome_detail)}", "red")
        if builder_error is not None:
            text.append(f"\nTensorRT: {printable(builder_error)}", "red")
        return text
    return None


SILENCE_SHOWN_S = 10.0
"""A silence this long (no callback from TensorRT) is said, by the live view and the plain
lines alike: real builds go quiet for minutes, and that should not look like a hang."""


class SilenceClock:
    """When TensorRT last made a callback, by this process's clock: a view following a build on
    another host cannot compare its clock with the build's, but it can time what it sees."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._seen_ns: int | None = None
        self._elapsed_ns = 0

    def saw(self, event: Event, start_mono_ns: int | None) -> None:
        if type(event) in _PROGRESS:
            self._seen_ns = self._clock.mono_ns()
            if start_mono_ns is not None:
                self._elapsed_ns = event.mono_ns - start_mono_ns

    def silent_s(self) -> float | None:
        if self._seen_ns is None:
            return None
        return (self._clock.mono_ns() - self._seen_ns) / 1e9

    def build_elapsed_s(self) -> float:
        """The build's time now, counted on from its last callback."""
        return self._elapsed_ns / 1e9 + (self.silent_s() or 0.0)


_PROGRESS = frozenset({BuildStarted, PhaseStarted, StepCompleted, PhaseFinished})
_SAMPLES = frozenset({GpuSample, ProcessSample})


def _count(number: int, noun: str) -> str:
    """``1 step``, ``2 steps``: a count and its noun, singular for one."""
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def _finished_steps(phase: Phase) -> str:
    """A finished phase's steps, in a form that does not read as unfinished: ``(6 steps)``, or
    ``(5 of 6 steps)`` where the builder closed it before its last step (TensorRT-RTX's root)."""
    done = phase.last_step + 1
    if done >= phase.num_steps:
        return f"({_count(phase.num_steps, 'step')})"
    return f"({done:,} of {_count(phase.num_steps, 'step')})"


def _phase_label(state: BuildState, phase: Phase, now: int | None) -> Text:
    from rich.text import Text

    label = Text()
    duration = phase.duration_ns(now)
    took = f" {format_duration(duration / 1e9)}" if duration is not None else ""
    steps = f" {phase.last_step + 1}/{phase.num_steps}"
    if phase.status is PhaseStatus.FINISHED:
        label.append("✓ ", "green")
        label.append(printable(phase.name))
        label.append(f" {_finished_steps(phase)}{took}", "dim")
    elif phase.status is PhaseStatus.ABORTED:
        label.append("✗ ", "yellow")
        label.append(printable(phase.name))
        label.append(f"{steps}{took} ({printable(str(phase.close_reason))})", "dim yellow")
    else:
        label.append("▶ ", "cyan")
        label.append(printable(phase.name), "bold")
        label.append(f" {_bar(state.phase_progress(phase.id))}", "cyan")
        label.append(f"{steps}{took}", "dim")
    return label


MAX_TREE_DEPTH = 64
"""Phases nested deeper than this are one line of the tree: real builds nest a handful of
levels, and a journal nesting 100,000 would make the tree's indentation alone quadratic."""


MAX_NODES_SHOWN = 200
"""Nodes shown under one phase: the first and the last half of it, the ones between counted on
one line. TensorRT's repeated phases are folded into one node, so a real build stays far below;
a journal with 100,000 phases side by side would take minutes to draw."""


def shown(nodes: list[TreeNode]) -> tuple[list[TreeNode], list[TreeNode], int]:
    """The nodes shown before and after the ones left out, and how many are left out."""
    if len(nodes) <= MAX_NODES_SHOWN:
        return nodes, [], 0
    half = MAX_NODES_SHOWN // 2
    return nodes[:half], nodes[-half:], len(nodes) - 2 * half


def _add_nodes(root: Tree, model: ReadModel, phase_id: int | None, now: int | None) -> None:
    from rich.text import Text

    # A stack, not recursion: a journal may nest phases as deep as it likes.
    stack: list[tuple[Tree, int | None, int]] = [(root, phase_id, 0)]
    while stack:
        parent, under, depth = stack.pop()
        if depth == MAX_TREE_DEPTH:
            parent.add(Text(f"… phases nested deeper than {MAX_TREE_DEPTH} levels", "dim"))
            continue
        first, last, left_out = shown(model.tree(under))
        _add_level(parent, model, first, now, stack, depth)
        if left_out:
            parent.add(Text(f"… {left_out:,} phases not shown", "dim"))
            _add_level(parent, model, last, now, stack, depth)


def _add_level(  # noqa: PLR0917 (private, one caller)
    parent: Tree,
    model: ReadModel,
    nodes: list[TreeNode],
    now: int | None,
    stack: list[tuple[Tree, int | None, int]],
    depth: int,
) -> None:
    from rich.text import Text

    for node in nodes:
        if isinstance(node, SiblingGroup):
            label = Text("✓ ", "green")
            label.append(f"{printable(node.name)} ×{node.count}")
            label.append(f" {format_duration(node.total_ns / 1e9)} in all", "dim")
            parent.add(label)
        else:
            branch = parent.add(_phase_label(model.state, node, now))
            if node.children:
                stack.append((branch, node.id, depth + 1))


class LiveConsole:
    """A subscriber of the read model drawing the live tree in a terminal, refreshed a few
    times a second from the model (not once per event)."""

    name = "console"

    def __init__(
        self,
        model: ReadModel,
        console: Console | None = None,
        *,
        refresh_per_second: float = 4,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        from rich.console import Console
        from rich.live import Live

        self.model = model
        self.console = console or Console(stderr=True)
        self._clock = clock
        self._silence = SilenceClock(clock)
        self._errors = BuilderErrors()
        self._live = Live(
            get_renderable=self._renderable,
            console=self.console,
            refresh_per_second=refresh_per_second,
            redirect_stdout=False,
            # Warnings and notices printed to stderr while the tree is drawn land above it,
            # instead of being drawn over (or leaving pieces of old frames behind).
            redirect_stderr=True,
        )
        self._started = False

    def _renderable(self) -> RenderableType:
        now = self._clock.mono_ns()
        with self.model.reading() as model:
            state = model.state
            error = self._errors.said(state.outcome_detail or "")
            return render_build(
                model,
                now,
                model.estimate_locked(now).build,
                silent_s=self._silence.silent_s(),
                builder_error=error if state.outcome is Outcome.FAILURE else None,
            )

    def on_steps(self, last: StepCompleted) -> None:
        self._silence.saw(last, self.model.state.start_mono_ns)

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        self._silence.saw(event, self.model.state.start_mono_ns)
        self._errors.saw(event)
        if not self._started:
            self._started = True
            self._live.start()

    def close(self) -> None:
        if self._started:
            self._live.stop()  # draws the final frame
        else:
            self.console.print(self._renderable())


class PlainLines:
    """A subscriber of the read model writing one line per notable event, for CI logs and
    pipes.

    Phases down to ``max_depth`` get a start and an end line; deeper ones only count toward a
    progress line written at most every ``progress_every_s`` of build time. Every line is a
    function of the events alone (times included), so a replay, or a watch of this build,
    writes the same ones.
    """

    name = "console"

    def __init__(
        self,
        model: ReadModel,
        stream: TextIO,
        *,
        max_depth: int = 2,
        progress_every_s: float = 10.0,
        show_eta: bool = True,
        heartbeat_s: float | None = SILENCE_SHOWN_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.model = model
        self.stream = stream
        self._show_eta = show_eta
        self.max_depth = max_depth
        self.progress_every_ns = int(progress_every_s * 1e9)
        self._last_progress_line_ns: int | None = None
        self._clock = clock
        self._silence = SilenceClock(clock)
        self._write_lock = threading.Lock()
        self._last_line_ns = clock.mono_ns()
        self._heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None
        self._errors = BuilderErrors()

    def on_steps(self, last: StepCompleted) -> None:
        self._silence.saw(last, self.model.state.start_mono_ns)
        line = self._progress_line(last)
        if line is not None:
            self._write(line)

    def on_event(self, event: Event, closed: Sequence[Phase]) -> None:
        self._silence.saw(event, self.model.state.start_mono_ns)
        kind = type(event)
        if kind is PhaseStarted or kind is PhaseFinished:  # most events told: no error in them
            line = self._phase_line(event, closed)  # type: ignore[arg-type]
        else:
            self._errors.saw(event)
            line = self._line_for(event, closed)
        if line is not None:
            self._write(line)  # a line is rare (a shallow phase, or every 10s at most)
        if self._beats is None and self._heartbeat_s is not None:
            self._beats = threading.Thread(
                target=self._beat, name="trt-otel-heartbeat", daemon=True
            )
            self._beats.start()

    def _write(self, line: str) -> None:
        """One line: names from the events in it (phases, reasons, the build id) escaped."""
        line = printable(line)
        with self._write_lock:
            self.stream.write(f"{line}\n")
            self.stream.flush()
            self._last_line_ns = self._clock.mono_ns()

    def _beat(self) -> None:
        """While TensorRT is silent, a line every ``heartbeat_s``: how long, and where."""
        assert self._heartbeat_s is not None
        every_ns = self._heartbeat_s * 1e9
        while not self._stop.wait(min(1.0, self._heartbeat_s / 4)):
            silent_s = self._silence.silent_s()
            if silent_s is None or silent_s < self._heartbeat_s:
                continue
            if self._clock.mono_ns() - self._last_line_ns < every_ns:
                continue
            with self.model.reading() as model:
                state = model.state
                if state.outcome is not None or state.start_mono_ns is None:
                    continue
                inner = state.innermost_open() or "-"
                ratio, steps = state.progress_ratio(), state.steps_completed_total
                liveness = state.activity.describe()
            said = f": {liveness}" if liveness is not None else ""
            self._write(
                f"[{self._silence.build_elapsed_s():8.1f}s] … silent for "
                f"{format_duration(silent_s)} in {inner} ({ratio:.0%}, {_count(steps, 'step')})"
                f"{said}"
            )

    def _stamp(self, event: Event) -> str:
        start = self.model.state.start_mono_ns
        elapsed = (event.mono_ns - start) / 1e9 if start is not None else 0.0
        return f"[{elapsed:8.1f}s]"

    def _line_for(self, event: Event, closed: Sequence[Phase]) -> str | None:
        if type(event) is StepCompleted:  # most events: at most a progress line
            return self._progress_line(event)
        if type(event) in _SAMPLES:  # not progress: a silent build's lines are the heartbeat's
            return None
        state = self.model.state
        if isinstance(event, BuildStarted):
            attempt = attempt_of(event.attributes)
            of = f"; attempt {attempt.number} of {attempt.of}" if attempt is not None else ""
            return f"{self._stamp(event)} build started ({event.build_id}{of})"
        if isinstance(event, CancelRequested):
            # A reason can come from outside (the HTTP view, a cancel URL): _write escapes it.
            return f"{self._stamp(event)} cancel requested by {event.source}: {event.reason}"
        if isinstance(event, Anomaly) and state.anomalies[event.kind] == 1:
            detail = event.detail
            return f"{self._stamp(event)} protocol anomaly ({event.kind.value}): {detail}"
        if isinstance(event, BuildFinished):
            took = format_duration((event.mono_ns - (state.start_mono_ns or event.mono_ns)) / 1e9)
            detail = f": {event.detail}" if event.detail else ""
            said = self._errors.said(event.detail)
            if event.outcome is Outcome.FAILURE and said is not None:
                detail += f"; TensorRT: {said}"  # its own reason (_write escapes it)
            return (
                f"{self._stamp(event)} build {event.outcome.value} in {took} "
                f"({_count(state.steps_completed_total, 'step')}, "
                f"{_count(state.phases_started_total, 'phase')})"
                f"{detail}"
            )
        return self._progress_line(event)

    def _phase_line(
        self, event: PhaseStarted | PhaseFinished, closed: Sequence[Phase]
    ) -> str | None:
        """A shallow phase's start or end; a deep one's start is progress."""
        if type(event) is PhaseStarted:
            phase = self.model.state.phases[event.seq]
            if phase.depth <= self.max_depth:
                indent = "  " * phase.depth
                steps = _count(phase.num_steps, "step")
                return f"{self._stamp(event)} {indent}▶ {phase.name} ({steps})"
            return self._progress_line(event)
        finished = closed[-1] if closed and closed[-1].name == event.name else None
        if finished is not None and finished.depth <= self.max_depth:
            took = format_duration((finished.duration_ns() or 0) / 1e9)
            indent = "  " * finished.depth
            return (
                f"{self._stamp(event)} {indent}✓ {finished.name} "
                f"{_finished_steps(finished)} in {took}"
            )
        return None

    def _progress_line(self, event: Event) -> str | None:
        last = self._last_progress_line_ns
        if last is not None and event.mono_ns - last < self.progress_every_ns:
            return None
        if last is None:
            self._last_progress_line_ns = event.mono_ns
            return None
        self._last_progress_line_ns = event.mono_ns
        state = self.model.state
        inner = state.innermost_open() or "-"
        eta = ""
        if self._show_eta and state.cancel is None:  # no estimate of a build being stopped
            eta = f"; {format_eta(self.model.estimate_locked(event.mono_ns).build)}"
        return (
            f"{self._stamp(event)} … {state.progress_ratio():.0%} "
            f"({_count(state.steps_completed_total, 'step')}; in {inner}{eta})"
        )

    def close(self) -> None:
        self._stop.set()
        with self._write_lock:
            self.stream.flush()
