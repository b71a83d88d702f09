"""What a command was asked to do, as typed values: the only shape configuration has past the
command line.

:mod:`trt_otel.app.arguments` turns parsed options into these; :mod:`trt_otel.app.session` and the
commands read nothing else. Each group is a frozen dataclass with the defaults a library user
gets, so ``SessionConfig()`` is a build with nothing attached, and a command takes only the
groups it needs (``replay`` takes :class:`SpanConfig`, ``watch`` :class:`ConsoleConfig`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trt_otel.capture.supervisor import DEFAULT_GRACE_S
from trt_otel.control.defaults import DEFAULT_MARGIN
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
DEFAULT_METRICS_INTERVAL_S = 10.0
"""How often ``--otlp-metrics`` pushes, by default."""


class UsageError(Exception):
    """Bad input found before a build starts (exit code 2)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """When to cancel the build, and how long a cancelled build gets before it is stopped."""

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

    def policy(
        self, *, history: History | None = None, project: Projector | None = None
    ) -> Policy | None:
        """The cancel policy these settings describe (any of them decides), or None. A
        deadline projects the build's end from ``history`` and ``project`` (without them it is
        a timeout)."""
        # Imported here: a build that asks for no policy (most) never pays for them.
        from trt_otel.control.deadline import Deadline
        from trt_otel.control.policies import (
            CancelFile,
            CancelUrl,
            MemoryGuard,
            Stall,
            Timeout,
            any_of,
        )
        from trt_otel.core.projection import before_start

        policies: list[Policy] = []
        if self.timeout_s is not None:
            policies.append(Timeout(self.timeout_s))
        if self.deadline_s is not None:
            policies.append(
                Deadline(
                    self.deadline_s,
                    margin=self.deadline_margin,
                    project=project,
                    at_start=before_start(history),
                )
            )
        if self.stall_timeout_s is not None:
            policies.append(Stall(self.stall_timeout_s, on=self.stall_on))
        if self.max_memory_bytes is not None or self.min_available_bytes is not None:
            policies.append(
                MemoryGuard(
                    max_rss_bytes=self.max_memory_bytes,
                    min_available_bytes=self.min_available_bytes,
                )
            )
        if self.cancel_file is not None:
            policies.append(CancelFile(self.cancel_file))
        if self.cancel_url is not None:
            policies.append(
                CancelUrl(
                    self.cancel_url,
                    interval_s=self.cancel_url_interval_s,
                    fail_closed=self.cancel_url_fail_closed,
                )
            )
        return any_of(*policies) if policies else None


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
    linger_s: float = 15.0
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
    sample_interval_s: float = 1.0
    """How often the builder's process is sampled (the GPU's own interval is the same)."""
    gpu: GpuConfig = field(default_factory=GpuConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """One observed, cancellable build."""

    observe: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    in_process: bool = False
    """Build in the calling process: no worker to stop from outside, so a cancel takes effect
    at TensorRT's next step only."""


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
