"""One assembly of what watches a build, for every command that has a build to watch: ``build``
and ``demo`` (a build here or in its worker), ``run`` (every build of a program, on one log) and
``watch`` (a build elsewhere, through its journal).

Each command makes its own capture (a monitor, a program's builds, a followed journal), the one
read model of its log and its policies; :func:`attach_session` attaches the rest alike: the views
of :mod:`~trt_otel.app.view_registry` that the configuration asks for, the console, and the log's
followers (the journal, the read model where it is not the log's own fold, the HTTP view's
event feed), in that order on the session's exit stack, so that on exit the followers drain into
the views before any view stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trt_otel.app.components import (
    DEEP_QUEUE,
    Views,
    attach_views,
    console_view,
    following,
    open_journal,
)
from trt_otel.app.config import ConsoleConfig, ObservabilityConfig
from trt_otel.core.followers import Follower
from trt_otel.core.observed import ObservedBuild
from trt_otel.core.readmodel import ReadModel
from trt_otel.views.terminal import warn

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from trt_otel.control.policies import Policy
    from trt_otel.control.runner import PolicyRunner
    from trt_otel.control.signals import StopClock
    from trt_otel.views.http import StatusServer


def policy_runner(build: ObservedBuild, policy: Policy | None) -> PolicyRunner | None:
    """What runs ``policy`` against ``build`` (None: no policy); the policies are imported
    only for a build that has one."""
    if policy is None:
        return None
    from trt_otel.control.runner import PolicyRunner

    return PolicyRunner(build, policy, warn=warn)


def attach_session(
    stack: contextlib.ExitStack[Any],
    build: ObservedBuild,
    observe: ObservabilityConfig,
    *,
    model: ReadModel,
    runner: PolicyRunner | None = None,
    attributes: Mapping[str, Any] | None = None,
    collectors: Sequence[Collector] = (),
    console: ConsoleConfig | None = None,
    builds_in_a_run: bool = False,
    before_following: Callable[[Views], None] | None = None,
    stop: StopClock | None = None,
) -> Views:
    """Attach to ``build``'s log, on ``stack``, everything ``observe`` asks for: its views, the
    ``console`` (None: none), then the log's followers. ``builds_in_a_run``: the log holds one
    build after another (``run``), and the HTTP view's stream goes on across them.
    ``before_following``: told of the views once they are attached, before any event reaches
    them (to say where they are). ``stop``: when a signal asked the build to stop (what
    waits at the end waits within its budget)."""
    views = attach_views(
        stack,
        build,
        observe,
        runner=runner,
        model=model,
        collectors=collectors,
        attributes=attributes,
        stop=stop,
    )
    if console is not None:
        console_view(console, model)
    if before_following is not None:
        before_following(views)
    _follow(stack, build, model, observe, views.http, builds_in_a_run=builds_in_a_run)
    return views


def _follow(
    stack: contextlib.ExitStack[Any],
    build: ObservedBuild,
    model: ReadModel,
    observe: ObservabilityConfig,
    http: StatusServer | None,
    *,
    builds_in_a_run: bool,
) -> None:
    """The log's followers, each on its own thread behind a bounded queue; where the model is
    the log's own fold (a supervisor, a followed journal), the journal's lines and the HTTP feed
    are made as each batch's events are, on the appending thread."""
    log = build.log
    followers: list[tuple[Follower, int]] = []
    if observe.journal is not None:
        journal = open_journal(observe.journal, append=observe.journal_append)
        followers.append((journal, DEEP_QUEUE))
        if model.is_fold:
            log.add_batch_consumer(journal.encode_ahead)
    if not model.is_fold:
        followers.append((model, DEEP_QUEUE))
    inline: list[Follower] = []
    if http is not None:
        if builds_in_a_run:
            from trt_otel.views.http_feed import EventFeed

            http.feed = EventFeed(ends_with_build=False)  # no client yet
        if model.is_fold:
            inline.append(http.feed)
        else:
            followers.append((http.feed, DEEP_QUEUE))
    stack.enter_context(following(log, followers, model, inline=inline))
