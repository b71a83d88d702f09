"""The policy runner: asks a build's policy, every tenth of a second on a thread of its own,
whether the build must stop, and cancels it with the decision's reason, source and policy.

A policy that raises is said once and counted, never a cancel: a bug in a policy must not stop
a build nobody asked to stop.
"""

from __future__ import annotations

import logging
import threading

from trt_otel.control.policies import BuildView, Decision, Policy, PolicyHealth, Warn
from trt_otel.core.observed import CancellableBuild

_logger = logging.getLogger(__name__)


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
