"""Cancel policies: what decides that a build must stop, and why.

A policy looks at a :class:`BuildView` (a snapshot of the build's state) and the outside world, and
answers with a :class:`Decision` or None. A :class:`PolicyRunner` asks it a few times a second on a
thread of its own and turns the first decision into ``monitor.cancel(...)``: a ``cancel`` event
carrying the reason, the kind of decider (``source``) and the policy's description, after which
the very next ``step_complete`` answers False. No policy does I/O on a callback thread, nor on the
runner's: those that ask the outside world (a file, a URL) are :class:`Polled`, each on a thread
of its own, so a FIFO, a hung mount or a server that never finishes its answer delays no other
policy; it is reported as stuck instead.

Policies compose: ``AnyOf(Timeout(7200), CancelFile("/tmp/stop"))`` decides when either does,
``AllOf(Stall(600), CancelFile(...))`` only when both do at once.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from trt_otel.control import defaults
from trt_otel.control.registry import (
    CancelFileConfig,
    CancelUrlConfig,
    MemoryConfig,
    PolicyContext,
    StallConfig,
    TimeoutConfig,
    required,
)
from trt_otel.core.activity import Verdict
from trt_otel.core.durations import format_duration
from trt_otel.core.events import CancelSource, GpuSample
from trt_otel.core.observed import CancellableBuild
from trt_otel.core.sizes import format_bytes
from trt_otel.core.urls import shown

_logger = logging.getLogger(__name__)

STALL_ON = defaults.STALL_ON

Warn = Callable[[str], None]

MAX_FLAG_BODY = 64 * 1024
"""Bytes read from a cancel URL's answer; a longer answer is an error, not a flag."""
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


class Polled(Policy):
    """A policy that asks the outside world (a file, a URL), on a thread of its own.

    :meth:`probe` may block: a FIFO, a hung network mount, a server that drips its answer. So it
    runs every ``interval_s`` on this policy's own thread, and :meth:`check` only reads the
    latest answer from memory: a probe that blocks delays no other policy. A probe that has not
    answered ``stuck_after_s`` after it began is an error (counted, and reported by the runner
    as a stuck policy), once per ``stuck_after_s`` it stays stuck; ``failures_to_close`` errors
    in a row decide (fail-closed) when the policy is built so.
    """

    stuck_hint = ""
    """What a stuck probe is most likely waiting for, for the message."""

    def __init__(
        self,
        *,
        interval_s: float,
        stuck_after_s: float,
        fail_closed: bool = False,
        failures_to_close: int = 3,
    ) -> None:
        self.interval_s = interval_s
        self.stuck_after_s = stuck_after_s
        self.fail_closed = fail_closed
        self.failures_to_close = failures_to_close
        self.polls = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_error: str | None = None
        self._answer: Decision | None = None
        self._lock = threading.Lock()
        self._probe_began: float | None = None
        self._overruns_counted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"trt-otel-policy-{self.source}", daemon=True
        )

    def probe(self) -> Decision | None:
        """Ask the outside world once (may block; raise for an error)."""
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # Never joined: a probe stuck in a system call cannot be interrupted, and its daemon
        # thread must not hold up the end of the build.
        self._stop.set()

    def check(self, view: BuildView) -> Decision | None:
        self._count_overrun()
        with self._lock:
            answer, errors = self._answer, self.consecutive_errors
        if answer is not None:
            return answer
        if self.fail_closed and errors >= self.failures_to_close:
            return Decision(
                f"{self.describe()} failed {errors} times in a row ({self.last_error}); "
                "failing closed",
                self.source,
            )
        return None

    def stuck_for_s(self) -> float | None:
        """How long the probe under way has been running, once that is past its limit."""
        began = self._probe_began
        if began is None:
            return None
        elapsed = time.monotonic() - began
        return elapsed if elapsed >= self.stuck_after_s else None

    def poll_once(self) -> None:
        """One probe, on the calling thread; updates the answer or the error counts."""
        with self._lock:
            self.polls += 1
            self._probe_began = time.monotonic()
            self._overruns_counted = 0
        try:
            answer = self.probe()
        except Exception as error:  # the probe's errors are this policy's to count
            self._finish_probe(None, _error_text(error))
        else:
            self._finish_probe(answer, None)

    def _finish_probe(self, answer: Decision | None, error: str | None) -> None:
        with self._lock:
            overran = self._overruns_counted > 0
            self._probe_began = None
            if error is None:
                self.consecutive_errors = 0
                self._answer = answer
            elif not overran:  # an overrun already counted this probe's failure
                self._failed_locked(error)

    def _count_overrun(self) -> None:
        stuck_s = self.stuck_for_s()
        if stuck_s is None:
            return
        with self._lock:
            due = int(stuck_s // self.stuck_after_s)
            if self._probe_began is None or due <= self._overruns_counted:
                return
            self._overruns_counted = due
            hint = f" ({self.stuck_hint})" if self.stuck_hint else ""
            self._failed_locked(f"no answer for {format_duration(stuck_s)}{hint}")

    def _failed_locked(self, error: str) -> None:
        self.errors += 1
        self.consecutive_errors += 1
        self.last_error = error

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.poll_once()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def health(self) -> PolicyHealth:
        self._count_overrun()
        return PolicyHealth(
            self.describe(), self.source, self.errors, self.last_error, self.stuck_for_s()
        )


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


class CancelFile(Polled):
    """Stop the build when ``path`` exists. Its first line, if any, is the reason.

    Existence is the signal, so the path is only ``stat``-ed; the reason is read without
    blocking, and only from a regular file (a FIFO or a device at the path is a signal with no
    reason). A hung mount blocks the ``stat`` on this policy's own thread: it is reported as
    stuck, and the other policies keep deciding.
    """

    source = CancelSource.FILE

    def __init__(
        self, path: str | Path, *, interval_s: float = 0.1, stuck_after_s: float = 2.0
    ) -> None:
        self.path = Path(path)
        self.stuck_hint = f"is {self.path} on a hung mount?"
        super().__init__(interval_s=interval_s, stuck_after_s=stuck_after_s)

    def describe(self) -> str:
        return f"file({self.path})"

    def probe(self) -> Decision | None:
        try:
            os.lstat(self.path)  # any entry is the signal: a dangling link or a loop too
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            info = os.stat(self.path)
        except OSError as error:
            what = "a symlink loop" if error.errno == errno.ELOOP else "a dangling symlink"
            return Decision(f"cancel file {self.path} appeared ({what})", self.source)
        reason = read_reason(self.path) if stat.S_ISREG(info.st_mode) else ""
        return Decision(reason or f"cancel file {self.path} appeared", self.source)


def read_reason(path: Path) -> str:
    """The first line of the regular file at ``path``, read without blocking ('' if none)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return ""  # it exists (unreadable, or gone again): the signal holds, with no reason
    try:
        # The path may have been swapped for a FIFO since the stat: read only a regular file.
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return ""
        first = os.read(descriptor, 4 * MAX_REASON).split(b"\n", 1)[0]
    except OSError:
        return ""
    finally:
        os.close(descriptor)
    return first.decode("utf-8", "replace").strip()[:MAX_REASON]


class FlagError(ValueError):
    """A cancel URL's answer that is not a flag."""


def parse_flag(status: int, body: bytes) -> tuple[bool, str | None]:
    """Read a cancel URL's answer: ``(cancel, reason)``. Raises FlagError for anything else.

    The answer format (documented in the README):

    - ``204 No Content``: keep building;
    - ``200`` with a JSON object ``{"cancel": true|false, "reason": "..."}`` (reason optional),
      a JSON ``true``/``false``, or the plain text ``true``/``false``/``1``/``0``/``yes``/``no``
      (case and surrounding whitespace ignored);
    - anything else (another status, a body over 64 KiB, other text) is an error.
    """
    if status == 204:
        return False, None
    if status != 200:
        raise FlagError(f"HTTP status {status}")
    if len(body) > MAX_FLAG_BODY:
        raise FlagError(f"an answer over {MAX_FLAG_BODY // 1024} KiB")
    text = body.decode("utf-8", "replace").strip()
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() in words:
        return words[text.lower()], None
    try:
        value = json.loads(text)
    except ValueError:
        raise FlagError(f"not a flag: {text[:60]!r}") from None
    if isinstance(value, bool):
        return value, None
    if isinstance(value, dict) and isinstance(value.get("cancel"), bool):
        reason = value.get("reason")
        return value["cancel"], str(reason)[:MAX_REASON] if reason else None
    raise FlagError(f"not a flag: {text[:60]!r}")


class CancelUrl(Polled):
    """Stop the build when a URL says so, polled every ``interval_s`` on a thread of its own.

    One poll (connect, headers and body together) gets ``request_timeout_s`` at most: a server
    that answers slowly, or drips its answer byte by byte, is an error like an unreachable one.
    Errors are counted and shown, and by default mean "keep building" (fail-open): a flaky flag
    server should not kill hours of work. With ``fail_closed``, ``failures_to_close`` errors in
    a row stop the build.
    """

    source = CancelSource.HTTP
    stuck_hint = "a name lookup or a connection that hangs?"

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = 5.0,
        request_timeout_s: float = 2.0,
        fail_closed: bool = False,
        failures_to_close: int = 3,
    ) -> None:
        self.url = url
        self.request_timeout_s = min(request_timeout_s, max(interval_s, 0.1))
        super().__init__(
            interval_s=interval_s,
            # The poll gives up at its own deadline; this only catches what no socket timeout
            # covers (a name lookup that hangs), a little later.
            stuck_after_s=self.request_timeout_s + 0.5,
            fail_closed=fail_closed,
            failures_to_close=failures_to_close,
        )

    def describe(self) -> str:
        mode = ", fail-closed" if self.fail_closed else ""
        return f"url({shown(self.url)}{mode})"

    def probe(self) -> Decision | None:
        import http.client

        try:
            status, body = fetch(self.url, self.request_timeout_s, MAX_FLAG_BODY + 1)
        except http.client.HTTPException as error:
            if isinstance(error, ConnectionError):  # went away: no text of the server's
                raise
            # Its text is the server's (a status line up to 64 KiB, ESC and all): quoted and
            # cut, as an answer that is no flag is.
            raise FlagError(f"not an HTTP answer: {str(error)[:60]!r}") from None
        cancel, reason = parse_flag(status, body)
        return (
            Decision(reason or f"cancel URL {shown(self.url)} said so", self.source)
            if cancel
            else None
        )


def fetch(url: str, timeout_s: float, max_bytes: int) -> tuple[int, bytes]:
    """``GET url``: its status and at most ``max_bytes`` of its body, all within ``timeout_s``
    (connect, TLS, headers and body: :mod:`~trt_otel.core.outbound`), straight to the server
    (no proxy). A redirect is not followed: it is a :class:`FlagError` naming its target.
    """
    import urllib.request

    from trt_otel.core import outbound  # with --cancel-url alone: http.client, ssl, email
    from trt_otel.core.deadlines import Deadline

    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with Deadline(timeout_s) as deadline:
        answer = outbound.call(request, deadline, max_bytes=max_bytes, proxies=False)
    redirect = answer.redirect()
    if redirect is not None:
        raise FlagError(
            f"HTTP status {redirect}: a cancel URL is not redirected; give the URL it names"
        )
    return answer.status, answer.body


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


def make_cancel_file(config: CancelFileConfig, context: PolicyContext) -> Policy:
    return CancelFile(required(config.cancel_file))


def make_cancel_url(config: CancelUrlConfig, context: PolicyContext) -> Policy:
    return CancelUrl(
        required(config.cancel_url),
        interval_s=config.cancel_url_interval_s,
        fail_closed=config.cancel_url_fail_closed,
    )


def any_of(*policies: Policy) -> Policy:
    """One policy from several: the policy itself when there is one."""
    return policies[0] if len(policies) == 1 else AnyOf(*policies)


class PolicyRunner:
    """Asks a policy, every ``interval_s`` on its own thread, whether the build must stop, and
    cancels it with the decision's reason. Errors of policies are reported once through
    ``warn`` and counted (:meth:`health`)."""

    def __init__(
        self,
        monitor: CancellableBuild,
        policy: Policy,
        *,
        interval_s: float = 0.1,
        warn: Warn | None = None,
    ) -> None:
        self.monitor = monitor
        self.policy = policy
        self.interval_s = interval_s
        self.decision: Decision | None = None
        self._warn = warn or (lambda message: _logger.warning("%s", message))
        self._warned: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trt-otel-policies", daemon=True)

    def start(self) -> PolicyRunner:
        self.policy.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.policy.stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def __enter__(self) -> PolicyRunner:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def view(self) -> BuildView:
        with self.monitor.log.lock:
            state = self.monitor.state
            activity = state.activity
            sample = activity.last_sample
            return BuildView(
                now_mono_ns=self.monitor.log.clock.mono_ns(),
                start_mono_ns=state.start_mono_ns,
                last_progress_mono_ns=state.last_progress_mono_ns,
                open_phase=state.innermost_open(),
                verdict=activity.verdict,
                last_active_mono_ns=activity.last_active_mono_ns,
                evidence=activity.evidence(),
                rss_bytes=sample.rss_bytes if sample is not None else None,
                available_bytes=sample.available_bytes if sample is not None else None,
                gpu=state.gpu,
            )

    def check_before_start(self) -> Decision | None:
        """Ask the policy whether the build should start at all; if not, cancel it (the caller
        then ends it without starting the builder). Returns the decision."""
        decision = self.policy.before_start()
        self._decide(decision)
        return decision

    def check_now(self) -> Decision | None:
        """Ask the policy once; cancel the build if it decides. Returns the decision."""
        decision = self.policy.check(self.view())
        self._decide(decision)
        return decision

    def _decide(self, decision: Decision | None) -> None:
        if decision is not None and self.decision is None:
            self.decision = decision
            self.monitor.cancel(
                decision.reason,
                source=decision.source,
                timeout=decision.timeout,
                policy=self.policy.describe(),
            )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            state = self.monitor.state
            if self.monitor.cancelled or state.outcome is not None:
                break
            try:
                self.check_now()
            except Exception as error:  # a policy bug must not kill the runner, nor the build
                _logger.exception("cancel policy %s failed", self.policy.describe())
                self._report(self.policy.describe(), f"{type(error).__name__}: {error}")
            self._report_policy_errors()
        self.policy.stop()

    def _report_policy_errors(self) -> None:
        for leaf in self.policy.leaves():
            health = leaf.health()
            if health is None:
                continue
            if health.stuck_s is not None:
                self._report(
                    health.policy,
                    f"{health.last_error}; the other policies keep deciding",
                    kind="stuck",
                )
            elif health.errors and health.last_error:
                self._report(health.policy, health.last_error)

    def _report(self, policy: str, error: str, kind: str = "error") -> None:
        # Once per policy and kind: a flaky server's every error would flood the terminal, but
        # a policy that goes on to be stuck is news.
        if (policy, kind) in self._warned:
            return
        self._warned.add((policy, kind))
        if kind == "stuck":
            self._warn(f"cancel policy {policy} is stuck: {error}")
        else:
            self._warn(f"cancel policy {policy}: {error}; further errors are only counted")

    def health(self) -> list[PolicyHealth]:
        return [h for leaf in self.policy.leaves() if (h := leaf.health()) is not None]
