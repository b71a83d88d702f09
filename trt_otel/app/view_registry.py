"""The views a session attaches to a build, declared once, in the order they start: each one's
name, the options that ask for it, whether a configuration wants it, and the function that
attaches it.

:func:`~trt_otel.app.components.attach_views` (``build``, ``demo``, ``run``, ``watch`` and
``replay`` alike) enters every view the configuration wants, in this order, on the session's
exit stack, so they stop in the reverse order; docs/architecture.md's table of views and the
tests read this. A new view is one module (the view, and the function that attaches it) and one
registration here.

Nothing here imports a view: an entry names the function that attaches it by module and name,
imported when a build wants it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trt_otel.app.config import ObservabilityConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from prometheus_client.registry import Collector

    from trt_otel.control.runner import PolicyRunner
    from trt_otel.control.signals import StopClock
    from trt_otel.core.observed import ObservedBuild
    from trt_otel.core.readmodel import ReadModel


@dataclass(slots=True)
class ViewContext:
    """What a view is attached with: the build, its read model, what the session was asked
    for, and the views started before it (by name; None for one not wanted)."""

    monitor: ObservedBuild | None
    """The build as it runs (None: a journal replayed, whose views read only the model)."""
    observe: ObservabilityConfig
    model: ReadModel
    runner: PolicyRunner | None
    attributes: Mapping[str, Any]
    collectors: Sequence[Collector] = ()
    resource: Resource | None = None
    """The OpenTelemetry resource the exports share, detected once (None: none exports)."""
    stop: StopClock | None = None
    """When a signal asked the build to stop: what waits at the end waits within its budget."""
    started: dict[str, Any] = field(default_factory=dict)

    @property
    def build(self) -> ObservedBuild:
        """The build as it runs, for a view that reads it (a replay asks for none)."""
        if self.monitor is None:
            raise RuntimeError("this view needs a running build, and a replay has none")
        return self.monitor

    def view(self, name: str) -> Any:
        """The view ``name`` as it was started (None where it was not wanted)."""
        if name not in _VIEWS:
            raise KeyError(f"no view named {name!r} is registered")
        return self.started.get(name)


Attach = Callable[[ViewContext], AbstractContextManager[Any]]


@dataclass(frozen=True, slots=True)
class ViewEntry:
    """A registered view."""

    name: str
    options: tuple[str, ...]
    """The options that ask for it (none: every session has it)."""
    wanted: Callable[[ObservabilityConfig], bool]
    attach: str
    """``module:function``, called with a :class:`ViewContext`: a context manager that starts
    the view as it is entered (yielding it, or None) and stops it as it is left."""
    summary: str
    reads: tuple[str, ...] = ()
    """The views it reads from the context, each registered before it."""

    @property
    def module(self) -> str:
        """The module its attaching function comes from."""
        return self.attach.partition(":")[0]

    def attached(self, context: ViewContext) -> AbstractContextManager[Any]:
        module, _, function = self.attach.partition(":")
        attach: Attach = getattr(importlib.import_module(module), function)
        return attach(context)


_VIEWS: dict[str, ViewEntry] = {}


def register(
    name: str,
    *,
    options: tuple[str, ...],
    wanted: Callable[[ObservabilityConfig], bool],
    attach: str,
    summary: str,
    reads: tuple[str, ...] = (),
) -> ViewEntry:
    """Declare a view, started after those registered before it."""
    if name in _VIEWS:
        raise ValueError(f"a view named {name!r} is already registered")
    unknown = [read for read in reads if read not in _VIEWS]
    if unknown:
        raise ValueError(f"view {name!r} reads {unknown}, not registered before it")
    if ":" not in attach:
        raise ValueError(f"view {name!r}: attach is module:function, not {attach!r}")
    entry = ViewEntry(name, options, wanted, attach, summary, reads)
    _VIEWS[name] = entry
    return entry


def views() -> tuple[ViewEntry, ...]:
    """Every registered view, in the order a session starts them."""
    return tuple(_VIEWS.values())


def wanted_by(observe: ObservabilityConfig) -> list[ViewEntry]:
    """The views ``observe`` asks for, in the order they start."""
    return [entry for entry in _VIEWS.values() if entry.wanted(observe)]


def metrics_wanted(observe: ObservabilityConfig) -> bool:
    """Whether anything reads the build's metrics: a scrape endpoint, a Pushgateway, OTLP
    metrics (asked for even without an endpoint, which is refused as it starts) or the HTTP
    view (its ``/metrics``)."""
    metrics = observe.metrics
    return (
        metrics.port is not None
        or metrics.pushgateway is not None
        or observe.spans.metrics
        or observe.http.port is not None
    )


_COMPONENTS = "trt_otel.app.components"

register(
    "logs",
    options=("--otlp-endpoint", "--otlp-logs-level"),
    wanted=lambda observe: observe.spans.logs_level is not None,
    attach=f"{_COMPONENTS}:attach_log_export",
    summary="the builder's messages (and trt-otel's warnings) as OTLP log records",
)
register(
    "spans",
    options=("--otlp-endpoint",),
    wanted=lambda observe: True,  # OTEL_* variables may configure it: it decides as it starts
    attach=f"{_COMPONENTS}:attach_span_export",
    summary="each phase an OpenTelemetry span, exported over OTLP",
)
# Before the endpoints, so that it is withdrawn after they close: after the last scrape that
# brings Prometheus the build's final values.
register(
    "scrape-target",
    options=("--prometheus-sd-dir",),
    wanted=lambda observe: observe.metrics.sd_dir is not None,
    attach=f"{_COMPONENTS}:attach_scrape_target",
    summary="the build's endpoint as a Prometheus file_sd target",
)
register(
    "metrics",
    options=("--prometheus-port", "--pushgateway", "--otlp-metrics", "--http-port"),
    wanted=metrics_wanted,
    attach=f"{_COMPONENTS}:attach_metrics_registry",
    summary="the build's one metrics registry: what a scrape, /metrics and a push read",
    reads=("spans",),
)
register(
    "prometheus",
    options=("--prometheus-port",),
    wanted=lambda observe: observe.metrics.port is not None,
    attach=f"{_COMPONENTS}:attach_metrics_endpoint",
    summary="Prometheus' scrape endpoint, awaiting a last scrape at the end",
    reads=("metrics",),
)
register(
    "otlp-metrics",
    options=("--otlp-metrics",),
    wanted=lambda observe: observe.spans.metrics,
    attach=f"{_COMPONENTS}:attach_otlp_metrics",
    summary="the metrics registry pushed over OTLP every interval, and once at the end",
    reads=("metrics",),
)
register(
    "http",
    options=("--http-port",),
    wanted=lambda observe: observe.http.port is not None,
    attach=f"{_COMPONENTS}:attach_status_server",
    summary="/status, /events, /metrics, POST /cancel and the live page",
    reads=("metrics",),
)
# Left first, in this order: the push (its warning is still a log record), then the OTLP
# exports begin their final flush together, each to wait, as it is left, for what remains of the
# one flush timeout.
register(
    "final-flush",
    options=(),
    wanted=lambda observe: True,
    attach=f"{_COMPONENTS}:attach_final_flush",
    summary="the OTLP exports' final flushes begun at once, within one flush timeout",
    reads=("spans", "logs", "otlp-metrics"),
)
register(
    "otlp-live",
    options=("--otlp-live",),
    wanted=lambda observe: observe.spans.live,
    attach="trt_otel.views.otlp_live:attach",
    summary="the open phases sent as snapshot spans while the build runs",
    reads=("spans",),
)
register(
    "pushgateway",
    options=("--pushgateway",),
    wanted=lambda observe: observe.metrics.pushgateway is not None,
    attach=f"{_COMPONENTS}:attach_final_push",
    summary="the final values pushed to a Pushgateway",
    reads=("metrics",),
)
register(
    "announce",
    options=("--prometheus-sd-dir",),
    wanted=lambda observe: observe.metrics.sd_dir is not None,
    attach=f"{_COMPONENTS}:attach_announcement",
    summary="the scrape target written once the endpoint it names is listening",
    reads=("scrape-target", "prometheus", "http"),
)
