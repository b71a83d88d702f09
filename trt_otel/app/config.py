"""What a command was asked to do, as typed values: the only shape configuration has past the
command line.

:mod:`trt_otel.app.arguments` turns parsed options into these; :mod:`trt_otel.app.session` and the
commands read nothing else. Each group is a frozen dataclass with the defaults a library user
gets, so ``SessionConfig()`` is a build with nothing attached, and a command takes only the
groups it needs (``replay`` takes :class:`SpanConfig`, ``watch`` :class:`ConsoleConfig`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trt_otel.capture.supervisor import DEFAULT_GRACE_S
from trt_otel.control import registry
from trt_otel.control.defaults import (
    DEFAULT_MARGIN,
    SAMPLE_INTERVAL_S,
    STOP_BUDGET_S,
    STOP_RESERVE_S,
)
from trt_otel.control.registry import PolicyEntry
from trt_otel.views.otlp_settings import (
    DEFAULT_FOLD_UNDER_NS,
    DEFAULT_LOGS_LEVEL,
    DEFAULT_SPAN_BUDGET,
    LOGS,
    METRICS,
    TRACES,
    OtlpSettings,
)

if TYPE_CHECKING:  # the policies are imported where one is asked for (PolicyConfig.policy)
    from trt_otel.control.deadline import Projector
    from trt_otel.control.policies import Policy
    from trt_otel.core.eta import History

LOOPBACK = "127.0.0.1"
DEFAULT_PROMETHEUS_LINGER_S = 15.0
"""After the build, how long the scrape endpoint waits for a last scrape."""
DEFAULT_METRICS_INTERVAL_S = 10.0
"""How often ``--otlp-metrics`` pushes, by default."""


class UsageError(Exception):
    """Bad input found before a build starts (exit code 2)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """When to cancel the build, and how long a cancelled build gets before it is stopped.

    The policies are those of :mod:`trt_otel.control.registry`. Those registered first have
    their settings as fields here (``PolicyConfig(timeout_s=90.0)``: each entry's settings'
    fields, by the same names); a policy registered since has its settings in ``more``, as its
    entry's own type (``more=(GpuMemoryConfig(max_gpu_memory_bytes=8 << 30),)``), so that a new
    policy changes nothing here."""

    timeout_s: float | None = None
    deadline_s: float | None = None
    """The build must end within this: stopped as soon as its projection says it cannot
    (:mod:`trt_otel.control.deadline`), refused when its history says so before it starts."""
    deadline_margin: float = DEFAULT_MARGIN
    stall_timeout_s: float | None = None
    stall_on: str = "activity"
    """``activity``: a stall is neither progress nor work by the builder's process;
    ``callbacks``: no progress, whatever the process does."""
    max_memory_bytes: int | None = None
    min_available_bytes: int | None = None
    cancel_file: Path | None = None
    cancel_url: str | None = None
    cancel_url_interval_s: float = 5.0
    cancel_url_fail_closed: bool = False
    grace_s: float = DEFAULT_GRACE_S
    """Time a cancelled build gets to stop at TensorRT's next step before its process is
    stopped from outside."""
    stop_budget_s: float = STOP_BUDGET_S
    """How long a stop asked for by a signal may take in all, to the journal's end and the
    spans' flush: its grace is what is left of it (see :func:`signal_grace_s`)."""
    more: tuple[object, ...] = ()
    """The settings of registered policies that have no fields above, one of each at most."""

    def __post_init__(self) -> None:
        kinds = {entry.config for entry in registry.policies()}
        for settings in self.more:
            if type(settings) not in kinds:
                raise TypeError(f"{settings!r} are not the settings of a registered policy")
        if len({type(settings) for settings in self.more}) != len(self.more):
            raise ValueError("the settings of a policy are given twice")

    def settings(self) -> list[tuple[PolicyEntry, Any]]:
        """The registered policies these settings turn on, each with its settings, in the
        registry's order."""
        chosen = []
        for entry in registry.policies():
            settings = self._settings_of(entry)
            if settings is not None and entry.enabled(settings):
                chosen.append((entry, settings))
        return chosen

    def _settings_of(self, entry: PolicyEntry) -> Any:
        names = entry.fields
        if set(names) <= {field.name for field in dataclasses.fields(self)}:  # fields here
            return entry.config(**{name: getattr(self, name) for name in names})
        return next((s for s in self.more if type(s) is entry.config), None)

    def options_reading(self, sampler: str) -> list[str]:
        """The options given whose policies read ``sampler``'s samples (``process``, ``gpu``):
        for a message saying they need it."""
        return [
            flag
            for entry, settings in self.settings()
            if sampler in entry.samplers
            for flag in entry.given(settings)
        ]

    def policy(
        self, *, history: History | None = None, project: Projector | None = None
    ) -> Policy | None:
        """The cancel policy these settings describe (any of them decides), or None. A
        deadline projects the build's end from ``history`` and ``project`` (without them it is
        a timeout)."""
        chosen = self.settings()
        if not chosen:
            return None
        # Imported here: a build that asks for no policy (most) never pays for them.
        from trt_otel.control.policies import any_of

        context = registry.PolicyContext(history=history, project=project)
        made: list[Policy] = [entry.make(settings, context) for entry, settings in chosen]
        return any_of(*made)


@dataclass(frozen=True, slots=True)
class SpanConfig:
    """OpenTelemetry span export; ``OTEL_*`` variables fill in what is not given here."""

    endpoint: str | None = None
    protocol: str | None = None
    span_budget: int = DEFAULT_SPAN_BUDGET
    fold_under_s: float = DEFAULT_FOLD_UNDER_NS / 1e9
    flush_timeout_s: float = 3.0
    """At the end, how long to wait for the last spans to be exported."""
    logs_level: str | None = DEFAULT_LOGS_LEVEL
    """The least severe of the builder's messages exported as OTLP log records; None: none."""
    metrics: bool = False
    """Push the build's metrics to the OTLP endpoint too (``--otlp-metrics``)."""
    live: bool = True
    """Send the open phases as snapshot spans while the build runs (``--otlp-live``, on unless
    switched off; a replay never sends them)."""
    metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_S

    def settings(
        self, environ: Mapping[str, str] | None = None, signal: str = TRACES
    ) -> OtlpSettings | None:
        """Where and how the ``signal`` (spans by default, ``logs``, ``metrics``) goes, or None
        when it is not wanted (no endpoint configured anywhere, or the signal turned off).

        Raises :class:`~trt_otel.views.otlp.OtlpConfigError` for settings that cannot work."""
        if signal == LOGS and self.logs_level is None:
            return None
        if signal == METRICS and not self.metrics:
            return None
        logs = None
        if signal == TRACES and self.settings(environ, LOGS) is not None:
            logs = self.logs_level
        return OtlpSettings.resolve(
            self.endpoint,
            self.protocol,
            environ=environ,
            span_budget=self.span_budget,
            fold_under_ns=round(self.fold_under_s * 1e9),
            signal=signal,
            logs_level=logs,
        )


DEFAULT_HTTP_LINGER_S = 3.0


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The build's HTTP view (``/``, ``/status``, ``/events``, ``/metrics``, ``POST /cancel``)."""

    port: int | None = None
    """None serves nothing; 0 picks a free port."""
    address: str = LOOPBACK
    cancel_token: str | None = None
    """None: ``TRT_OTEL_CANCEL_TOKEN``, else one generated per build."""
    linger_s: float = DEFAULT_HTTP_LINGER_S
    """After the build, how long the view keeps serving its final status, at most: until a
    client has read it (``/status``, ``/healthz`` or the end of ``/events``)."""
    linger_unwatched: bool = False
    """Linger even when no client came by during the build (one is expected late); else a
    build nobody watched ends at once."""
    url_file: Path | None = None
    """Where to write the view's URL once it serves (for a program that started the build with
    ``--http-port 0``); removed when the view stops."""
    allowed_hosts: tuple[str, ...] = ()
    """Names a request's ``Host`` may give besides the address served on and ``localhost``
    (``--http-allowed-host``): others are refused, against DNS rebinding."""


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """Prometheus: a scrape endpoint of its own and/or a push when the build ends."""

    port: int | None = None
    """None serves no endpoint of its own; 0 picks a free port."""
    address: str = LOOPBACK
    linger_s: float = DEFAULT_PROMETHEUS_LINGER_S
    """After the build, how long to wait for a last scrape (only when something scraped)."""
    pushgateway: str | None = None
    build_id_label: bool = False
    sd_dir: Path | None = None
    """A folder Prometheus' ``file_sd_configs`` watches: the endpoint is announced there while
    it serves (``--prometheus-sd-dir``)."""


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """GPU telemetry through NVML, where it is present."""

    enabled: bool = True
    device: str | None = None
    """Index or UUID; None: the first of ``CUDA_VISIBLE_DEVICES``, else 0."""
    interval_s: float = 1.0


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """The terminal view."""

    live: bool = True
    """The live tree when the stream is a terminal; False always writes plain lines."""


@dataclass(frozen=True, slots=True)
class ObservabilityConfig:
    """Everything that watches a build without deciding anything about it."""

    journal: Path | None = None
    journal_append: bool = False
    """Go on after what the journal holds (a retried build's later attempts), rather than start
    it afresh."""
    history: Path | None = None
    """Journals of earlier builds of the model, for an ETA from how long they took."""
    spans: SpanConfig = field(default_factory=SpanConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sample_interval_s: float = SAMPLE_INTERVAL_S
    """How often the builder's process is sampled (the GPU's own interval is the same)."""
    gpu: GpuConfig = field(default_factory=GpuConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The engine store (``--engine-store``): engines served instead of built again."""

    directory: Path | None = None
    """None: no store."""
    max_bytes: int | None = None
    """The most its engines may take; the least recently used go first."""


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """One observed, cancellable build."""

    observe: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    in_process: bool = False
    """Build in the calling process: no worker to stop from outside, so a cancel takes effect
    at TensorRT's next step only."""


def signal_grace_s(config: SessionConfig) -> float:
    """The grace of a cancel by a signal: the stop budget less the spans' final flush and a
    reserve for stopping the builder's process and ending the journal; never more than
    ``--grace``, and at least half a second for TensorRT's next step."""
    flush_s = config.observe.spans.flush_timeout_s
    left_s = config.policy.stop_budget_s - flush_s - STOP_RESERVE_S
    return max(0.5, min(config.policy.grace_s, left_s))


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trt-otel" / "builds"


def supervises(config: SessionConfig, control_file: Path | None) -> bool:
    """Whether watching a journal asks for more than the console: then watch runs a session."""
    observe = config.observe
    return (
        control_file is not None
        or config.policy.policy() is not None
        or observe.http.port is not None
        or observe.metrics.port is not None
        or observe.metrics.pushgateway is not None
        or observe.history is not None
        or observe.journal is not None
        or observe.spans.settings() is not None
    )
