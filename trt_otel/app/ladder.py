"""A retry ladder: the build again with other options when an attempt ends in a way another
attempt can mend.

An attempt that ran out of time (a timeout, a deadline), stalled, hit a memory limit or lost its
worker is retried with the next rung's options (:mod:`trt_otel.app.retries`); one that failed
(a model the parser refuses), was cancelled by the user (a cancel file, ``POST /cancel``, a
signal) or interrupted (Ctrl-C) is not: another attempt would fail the same way, or do what the
user said not to. ``--timeout`` and ``--stall-timeout`` apply to each attempt; ``--deadline`` to
the whole ladder, each attempt getting what is left of it.

Each attempt is a build of its own (:func:`~trt_otel.app.session.run_build`), with its own id,
in the one journal (each appended to what the attempts before wrote); its ``build_start``
names its number, the previous attempt's build id and why that one was retried
(:mod:`trt_otel.core.attempts`), which its span links to. The exit code is the last attempt's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from trt_otel.app.config import SessionConfig
from trt_otel.app.retries import Rung
from trt_otel.app.session import EXIT_CANCELLED, Ended, run_build
from trt_otel.builder.build import BuildJob
from trt_otel.control.registry import retried_sources
from trt_otel.core import attempts
from trt_otel.core.durations import format_duration
from trt_otel.core.events import Outcome
from trt_otel.views.terminal import say, warn

WORKER_DEATHS = ("WorkerDied", "SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT")
"""How a worker that died is recorded (``error_type``): the kernel's OOM killer, a crash."""


def retry_reason(ended: Ended) -> str | None:
    """Why ``ended`` is worth another attempt, or None when it is not."""
    if ended.outcome in (Outcome.TIMEOUT, Outcome.CANCELLATION):
        # Cancels another attempt may mend: the build ran out of time or memory (the
        # registered policies that say so).
        if ended.cancel_source in retried_sources():
            return f"{ended.outcome.value} ({ended.cancel_source}): {ended.detail}"
        return None
    if ended.outcome is Outcome.FAILURE and ended.error_type in WORKER_DEATHS:
        return f"failure ({ended.error_type}): {ended.detail}"
    return None


# Long: one loop over the rungs, its bookkeeping (deadline left, attributes) kept in one place.
def run_ladder(
    job: BuildJob, config: SessionConfig, attributes: dict[str, Any], rungs: Sequence[Rung]
) -> int:
    """Build ``job``, and again with each rung's options while an attempt ends in a way the
    next may mend; returns the last attempt's exit code."""
    if not rungs:
        return run_build(job, config, attributes).exit_code
    total = len(rungs) + 1
    began = time.monotonic()
    deadline_s = config.policy.deadline_s
    original = job.options.attributes()
    base = {k: v for k, v in attributes.items() if k not in original}
    ended: Ended | None = None
    why: str | None = None
    for number in range(1, total + 1):
        rung = rungs[number - 2] if number > 1 else None
        attempt_job, attempt_config = job, config
        attempt_attributes = {**attributes, attempts.ATTEMPT: number, attempts.ATTEMPTS: total}
        if rung is not None and ended is not None and why is not None:
            attempt_job = replace(job, options=rung.builder)
            attempt_config = rung.session(config)
            attempt_attributes = {
                **base,
                **rung.builder.attributes(),
                attempts.ATTEMPT: number,
                attempts.ATTEMPTS: total,
                attempts.PREVIOUS_BUILD_ID: ended.build_id,
                attempts.RETRY_REASON: why[:500],
                attempts.RUNG: rung.text,
            }
            say(f"attempt {number} of {total}: {rung.text}")
        if number > 1:  # the journal goes on after the attempts before
            observe = replace(attempt_config.observe, journal_append=True)
            attempt_config = replace(attempt_config, observe=observe)
        if deadline_s is not None:
            left_s = deadline_s - (time.monotonic() - began)
            if left_s <= 0:
                limit = format_duration(deadline_s)
                warn(f"attempt {number} not started: the {limit} deadline has passed")
                return ended.exit_code if ended is not None else EXIT_CANCELLED
            policy = replace(attempt_config.policy, deadline_s=left_s)
            attempt_config = replace(attempt_config, policy=policy)
        ended = run_build(attempt_job, attempt_config, attempt_attributes)
        why = retry_reason(ended)
        if ended.outcome is Outcome.SUCCESS:
            say(f"built by attempt {number} of {total}" + (f" ({rung.text})" if rung else ""))
            return ended.exit_code
        if why is None or number == total:
            break
        say(f"attempt {number} of {total} ended in {why}; retrying")
    assert ended is not None
    if why is not None:
        say(f"no attempt built the engine ({total} attempts)")
    return ended.exit_code
