"""Cancel policies: what decides that a build must stop, and why.

A policy looks at a :class:`BuildView` (a snapshot of the build's state) and the outside world, and
answers with a :class:`Decision` or None. The runner (:mod:`trt_otel.control.runner`) asks it a
few times a second on a thread of its own and turns the first decision into
``monitor.cancel(...)``: a ``cancel`` event carrying the reason, the kind of decider
(``source``) and the policy's description, after which the very next ``step_complete`` answers
False. No policy does I/O on a callback thread, nor on the runner's: those that ask the outside
world (a file, a URL: :mod:`trt_otel.control.probes`) each ask on a thread of its own, so a
FIFO, a hung mount or a server that never finishes its answer delays no other policy; it is
reported as stuck instead.

Policies compose: ``AnyOf(Timeout(7200), CancelFile("/tmp/stop"))`` decides when either does,
``AllOf(Stall(600), CancelFile(...))`` only when both do at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from trt_otel.control import defaults
from trt_otel.control.registry import (
    MemoryConfig,
    PolicyContext,
    StallConfig,
    TimeoutConfig,
    required,
)
from trt_otel.core.activity import Verdict
from trt_otel.core.durations import format_duration
from trt_otel.core.events import CancelSource, GpuSample
from trt_otel.core.sizes import format_bytes

_logger = logging.getLogger(__name__)

STALL_ON = defaults.STALL_ON

Warn = Callable[[str], None]

MAX_REASON = 200


@dataclass(frozen=True, slots=True)
class BuildView:
    """What a policy may look at, copied under the log's lock (times: monotonic ns)."""

    now_mono_ns: int
    start_mono_ns: int | None
    last_progress_mono_ns: int | None
    open_phase: str | None
    """The innermost open phase, for reasons that say where the build was."""
    verdict: Verdict | None = None
    """The builder's process: working, idle, stopped or gone; None where it is not sampled."""
    last_active_mono_ns: int | None = None
    """The last moment the builder's process was seen working."""
    evidence: str = ""
    """What the verdict rests on, in a few words (``CPU 0%, 455 MiB``)."""
    rss_bytes: int | None = None
    available_bytes: int | None = None
    """The host's available memory, at the latest sample."""
    gpu: GpuSample | None = None
    """The latest sample of the build's GPU; None where it is not sampled."""


@dataclass(frozen=True, slots=True)
class Decision:
    reason: str
    source: str
    """The kind of decider, short and bounded: a :class:`~trt_otel.core.events.CancelSource`."""
    timeout: bool = False


@dataclass(frozen=True, slots=True)
class PolicyHealth:
    policy: str
    source: str
    errors: int
    last_error: str | None
    stuck_s: float | None = None
    """How long the policy's check under way has gone without an answer, once past its limit."""


class Policy:
    """Base of every policy. Subclasses implement :meth:`check` and :meth:`describe`."""

    source: str = CancelSource.POLICY

    def describe(self) -> str:
        raise NotImplementedError

    def check(self, view: BuildView) -> Decision | None:
        """Should the build stop now? Called on the runner's thread; must not block."""
        raise NotImplementedError

    def before_start(self) -> Decision | None:
        """Should the build not start at all, from what is known already (a deadline that its
        history says it cannot meet)? Asked once, before the builder starts."""
        return None

    def start(self) -> None:
        """Begin background work (polling), if any."""

    def stop(self) -> None:
        """End background work; called once the build no longer needs deciding."""

    def leaves(self) -> Iterator[Policy]:
        """The policies this one is made of (itself, for a simple policy)."""
        yield self

    def health(self) -> PolicyHealth | None:
        """Errors met while deciding, for policies that can meet any."""
        return None

    def __repr__(self) -> str:
        return self.describe()


class Timeout(Policy):
    """Stop the build once it has run ``seconds`` (an outcome of ``timeout``)."""

    source = CancelSource.TIMEOUT

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError("a timeout must be longer than 0s")
        self.limit_ns = round(seconds * 1e9)

    def describe(self) -> str:
        return f"timeout({format_duration(self.limit_ns / 1e9)})"

    def check(self, view: BuildView) -> Decision | None:
        if view.start_mono_ns is None or view.now_mono_ns - view.start_mono_ns < self.limit_ns:
            return None
        limit = format_duration(self.limit_ns / 1e9)
        return Decision(f"the build ran past its timeout of {limit}", self.source, timeout=True)


class Stall(Policy):
    """Stop the build when it has made no progress (no step, no phase started or finished: a
    phase can go silent before its first step, so its start counts) for ``seconds``.

    ``on="activity"`` (the default) also asks the builder's process: a builder computing through
    a silent window (CPU in use) is not stalled, however long the window; one idle, stopped or
    gone for ``seconds`` is. Where the process is not sampled, progress alone decides.
    ``on="callbacks"``: progress alone, always.
    """

    source = CancelSource.STALL

    def __init__(self, seconds: float, *, on: str = "activity") -> None:
        if not seconds > 0:
            raise ValueError("a stall timeout must be longer than 0s")
        if on not in STALL_ON:
            raise ValueError(f"a stall is counted on {' or '.join(STALL_ON)}, not {on!r}")
        self.limit_ns = round(seconds * 1e9)
        self.on = on

    def describe(self) -> str:
        limit = format_duration(self.limit_ns / 1e9)
        return f"stall({limit})" if self.on == "activity" else f"stall({limit}, callbacks)"

    def check(self, view: BuildView) -> Decision | None:
        since = view.last_progress_mono_ns or view.start_mono_ns
        if since is None:
            return None
        watched = self.on == "activity" and view.verdict is not None
        if watched and view.last_active_mono_ns is not None:
            since = max(since, view.last_active_mono_ns)
        if view.now_mono_ns - since < self.limit_ns:
            return None
        where = f" in {view.open_phase!r}" if view.open_phase else ""
        limit = format_duration(self.limit_ns / 1e9)
        if not watched:
            return Decision(f"no progress for {limit}{where}", self.source)
        evidence = f" ({view.evidence})" if view.evidence else ""
        if view.verdict is Verdict.WORKING:
            # Its last sample said working, but no sample in the window showed work (they came
            # late, or only the first one came): said as it is, never as idle.
            return Decision(
                f"no progress for {limit}{where}, and no sample of the builder's process in "
                f"that time showed work (the last one: working{evidence})",
                self.source,
            )
        state = {Verdict.IDLE: "idle", Verdict.STOPPED: "stopped", Verdict.GONE: "gone"}[
            view.verdict  # type: ignore[index]
        ]
        return Decision(
            f"no progress and no activity for {limit}{where}: the builder's process is "
            f"{state}{evidence}",
            self.source,
        )


class MemoryGuard(Policy):
    """Stop the build before memory runs out: when the builder's resident memory exceeds
    ``max_rss_bytes``, or the host's available memory falls below ``min_available_bytes``. It
    reads the builder's process samples, so it decides even inside a silent window (where the
    build is then stopped from outside after the grace period)."""

    source = CancelSource.MEMORY

    def __init__(
        self, *, max_rss_bytes: int | None = None, min_available_bytes: int | None = None
    ) -> None:
        if max_rss_bytes is None and min_available_bytes is None:
            raise ValueError("a memory guard needs a maximum or a minimum")
        self.max_rss_bytes = max_rss_bytes
        self.min_available_bytes = min_available_bytes

    def describe(self) -> str:
        limits = []
        if self.max_rss_bytes is not None:
            limits.append(f"max {format_bytes(self.max_rss_bytes)}")
        if self.min_available_bytes is not None:
            limits.append(f"min available {format_bytes(self.min_available_bytes)}")
        return f"memory({', '.join(limits)})"

    def check(self, view: BuildView) -> Decision | None:
        limit, rss = self.max_rss_bytes, view.rss_bytes
        if limit is not None and rss is not None and rss > limit:
            return Decision(
                f"resident memory {format_bytes(rss)} exceeds --max-memory {format_bytes(limit)}",
                self.source,
            )
        floor, available = self.min_available_bytes, view.available_bytes
        if floor is not None and available is not None and available < floor:
            return Decision(
                f"the host's available memory {format_bytes(available)} is below "
                f"--min-available {format_bytes(floor)}",
                self.source,
            )
        return None


class _Composite(Policy):
    name = ""

    def __init__(self, *policies: Policy) -> None:
        if not policies:
            raise ValueError(f"{self.name} needs at least one policy")
        self.policies: Sequence[Policy] = policies

    def describe(self) -> str:
        return f"{self.name}({', '.join(p.describe() for p in self.policies)})"

    def start(self) -> None:
        for policy in self.policies:
            policy.start()

    def stop(self) -> None:
        for policy in self.policies:
            policy.stop()

    def leaves(self) -> Iterator[Policy]:
        for policy in self.policies:
            yield from policy.leaves()

    def before_start(self) -> Decision | None:
        # Refusing a build is one policy's call, whichever way the others are combined.
        return next((d for p in self.policies if (d := p.before_start()) is not None), None)


class AnyOf(_Composite):
    """Decides when any of its policies does (the first one, in order, gives the reason)."""

    name = "any_of"

    def check(self, view: BuildView) -> Decision | None:
        for policy in self.policies:
            decision = policy.check(view)
            if decision is not None:
                return decision
        return None


class AllOf(_Composite):
    """Decides when all of its policies do at the same time; the reasons are joined."""

    name = "all_of"

    def check(self, view: BuildView) -> Decision | None:
        decisions = []
        for policy in self.policies:
            decision = policy.check(view)
            if decision is None:
                return None
            decisions.append(decision)
        return Decision(
            "; ".join(d.reason for d in decisions),
            decisions[0].source if len(decisions) == 1 else CancelSource.ALL_OF,
            timeout=all(d.timeout for d in decisions),
        )


# -- made from their settings (the registry names these) -------------------------------------------


def make_timeout(config: TimeoutConfig, context: PolicyContext) -> Policy:
    return Timeout(required(config.timeout_s))


def make_stall(config: StallConfig, context: PolicyContext) -> Policy:
    return Stall(required(config.stall_timeout_s), on=config.stall_on)


def make_memory_guard(config: MemoryConfig, context: PolicyContext) -> Policy:
    return MemoryGuard(
        max_rss_bytes=config.max_memory_bytes, min_available_bytes=config.min_available_bytes
    )


def any_of(*policies: Policy) -> Policy:
    """One policy from several: the policy itself when there is one."""
    return policies[0] if len(policies) == 1 else AnyOf(*policies)
