"""The command line's option groups, and their conversion into :mod:`trt_otel.app.config` values.

Each group comes as a pair: ``add_*_options(parser)`` declares the options, and a function of
the same name without ``add_`` turns the parsed namespace into the group's frozen dataclass.
A command takes the pairs it needs (``build`` and ``demo`` all of them, ``replay`` the span
options, a new command any of them), and nothing past :mod:`trt_otel.app.cli` sees a namespace.
Values that argparse can check alone are checked here as options are parsed (exit 2 with
argparse's own message); those that need several options together raise :class:`UsageError`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from trt_otel.app.config import (
    DEFAULT_HTTP_LINGER_S,
    DEFAULT_METRICS_INTERVAL_S,
    DEFAULT_PROMETHEUS_LINGER_S,
    LOOPBACK,
    ConsoleConfig,
    GpuConfig,
    HttpConfig,
    MetricsConfig,
    ObservabilityConfig,
    PolicyConfig,
    SessionConfig,
    SpanConfig,
    StoreConfig,
    UsageError,
)
from trt_otel.builder.options import (
    DEFAULT_LOG_LEVEL,
    LOG_LEVELS,
    PRECISIONS,
    BuildOptions,
    OptionError,
    check_precisions,
    parse_memory_pool,
    parse_size,
    shape_ranges,
)
from trt_otel.capture.supervisor import DEFAULT_GRACE_S
from trt_otel.control import registry
from trt_otel.control.defaults import (
    SAMPLE_INTERVAL_S,
    SAMPLES_PER_STALL,
    STOP_BUDGET_ENV,
    STOP_BUDGET_S,
)
from trt_otel.control.registry import Option
from trt_otel.core import sizes
from trt_otel.core.durations import (
    DurationError,
    format_duration,
    parse_duration,
    parse_positive_duration,
)
from trt_otel.core.events import TENSORRT_SEVERITIES
from trt_otel.views.otlp_settings import (
    DEFAULT_FOLD_UNDER_NS,
    DEFAULT_LOGS_LEVEL,
    DEFAULT_SPAN_BUDGET,
    PROTOCOLS,
)

Group = argparse._ArgumentGroup  # what add_argument_group returns; argparse names it privately

# -- value types ---------------------------------------------------------------------------------


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _percentage(text: str) -> tuple[float, bool]:
    """The number of a percentage as people write one (``5``, ``5%``, ``12.5 %``), and whether
    it was written with its sign; anything else (``nan`` included) is refused."""
    number = text.strip().removesuffix("%").strip()
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (5, 5%)") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (5, 5%)")
    return value + 0.0, text.strip().endswith("%")  # -0 is 0


def percent(text: str) -> float:
    """A percentage, as people write one: ``5``, ``5%``, ``12.5 %``; finite and 0 or more (a
    gate of ``inf`` percent could never fire)."""
    value, _ = _percentage(text)
    if math.isinf(value):
        raise argparse.ArgumentTypeError(
            f"{text!r} is no limit: a gate that can never fire; give a percentage (5, 5%)"
        )
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0% or more")
    return value


def seconds(text: str) -> float:
    """A duration: a plain number of seconds, or with units: ``90s``, ``15m``, ``1h30m``."""
    try:
        return parse_duration(text)
    except DurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_seconds(text: str) -> float:
    try:
        return parse_positive_duration(text)
    except DurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def share(text: str) -> float:
    """A share, written as a percentage as :func:`percent` reads one (``10``, ``10%`` and
    ``10 %`` are all 10%), from 0% to 1000%; returned as a fraction (0.1). A bare number between
    0 and 1 (``0.1``) is refused as ambiguous: it would be a tenth of a percent, where it reads
    as a tenth (and was one, when this took fractions)."""
    value, signed = _percentage(text)
    if not 0 <= value <= 1000:  # inf too
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0% to 1000%")
    if not signed and 0 < value < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is ambiguous: write {value * 100:g}% for a share of {value:g}, or "
            f"{value:g}% (a percentage is written 10 or 10%)"
        )
    return value / 100


def size(text: str) -> int:
    """A memory size of more than 0 bytes: ``512MiB``, ``6GiB``, ``6G``, or bytes."""
    try:
        count = sizes.parse_size(text)
    except sizes.SizeError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 bytes")
    return count


class Parser(argparse.ArgumentParser):
    """Takes ``-1s`` for a value (a bad one, with its own message) rather than for an unknown
    option, which argparse reports as "expected one argument". Subcommands' parsers are of
    this class too (argparse makes them of their parent's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No abbreviations: ``--out`` must not stand for ``--output``, nor ``--http-addr`` for
        # ``--http-address``, where a caller (the MCP server) checks options by their names.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")
        self.unrecognized_hint = ""
        """Said after an unrecognized argument (``fleet submit``: where a build's options go)."""

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unrecognized option is reported by the command that was given
        it, so that the hint names that command's options."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            given = self._parser_of(parsed)
            hint = getattr(given, "unrecognized_hint", "")
            given.error(f"unrecognized arguments: {' '.join(extras)}{hint and f' ({hint})'}")
        return parsed

    def _parser_of(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest or "", None) or "")
                if isinstance(chosen, Parser):
                    return chosen._parser_of(parsed)
        return self

    def error(self, message: str) -> NoReturn:
        """The one line that matters and where the options are, not the whole usage first."""
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` for the options)\n")


def host_name(text: str) -> str:
    """A host name or IP literal as a ``Host`` header gives it, without a port."""
    name = text.strip().lower().removesuffix(".")
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*", name):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a host name (letters, digits, '-' and '.', no port)"
        )
    return name


def port(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port {number} is outside 0..65535")
    return number


def http_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def gateway_url(text: str) -> str:
    """A Pushgateway's base URL: the push adds its own path (``/metrics/job/...``), which a
    query, a fragment or a ``..`` segment would swallow or turn elsewhere."""
    url = http_url(text)
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise argparse.ArgumentTypeError(f"{text!r}: a Pushgateway URL has no query or fragment")
    if ".." in parts.path.split("/"):
        raise argparse.ArgumentTypeError(f"{text!r}: a Pushgateway URL has no '..' in its path")
    return url


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


# -- spans ---------------------------------------------------------------------------------------


def add_span_options(
    parser: argparse.ArgumentParser, *, flush_timeout_s: float = 3.0, metrics: bool = True
) -> Group:
    """The OpenTelemetry exports: spans, log records and (``metrics``) metrics over OTLP."""
    group = parser.add_argument_group(
        "spans (OTEL_EXPORTER_OTLP_*, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES honoured)"
    )
    group.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export each phase as an OpenTelemetry span to this OTLP collector "
        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; no export without one)",
    )
    group.add_argument(
        "--otlp-protocol",
        choices=PROTOCOLS,
        help="OTLP transport (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc on port 4317 "
        "and http/protobuf elsewhere)",
    )
    group.add_argument(
        "--span-budget",
        type=positive_int,
        default=DEFAULT_SPAN_BUDGET,
        metavar="N",
        help=f"after N spans, fold short leaf phases into their parent's span "
        f"(default: {DEFAULT_SPAN_BUDGET:,})",
    )
    group.add_argument(
        "--span-fold-under",
        type=seconds,
        default=DEFAULT_FOLD_UNDER_NS / 1e9,
        metavar="DURATION",
        help="beyond the budget, fold leaf phases shorter than this (default: 1s)",
    )
    group.add_argument(
        "--otlp-flush-timeout",
        type=seconds,
        default=flush_timeout_s,
        metavar="DURATION",
        help="at the end, wait at most this long for the last spans, log records and metrics "
        f"to be exported, all flushed at once (default: {flush_timeout_s:g}s)",
    )
    _add_signal_options(group, metrics=metrics)
    return group


LOGS_LEVELS = (*TENSORRT_SEVERITIES, "off")
"""``--otlp-logs-level`` choices: TensorRT's severities, or ``off``."""


def _add_signal_options(group: Group, *, metrics: bool) -> None:
    """Log records and (``metrics``) metrics over OTLP, to the spans' endpoint."""
    group.add_argument(
        "--otlp-logs-level",
        choices=LOGS_LEVELS,
        default=DEFAULT_LOGS_LEVEL,
        metavar="LEVEL",
        help="export TensorRT's messages this severe and more as OTLP log records, in the "
        f"trace of the phase they came in: {', '.join(LOGS_LEVELS)} (default: "
        f"{DEFAULT_LOGS_LEVEL})",
    )
    if metrics:
        group.add_argument(
            "--otlp-metrics",
            action="store_true",
            help="push the build's metrics (the names and labels of /metrics) to the OTLP "
            "endpoint too, every --otlp-metrics-interval and once at the end",
        )
        group.add_argument(
            "--otlp-metrics-interval",
            type=positive_seconds,
            default=DEFAULT_METRICS_INTERVAL_S,
            metavar="DURATION",
            help=f"how often --otlp-metrics pushes (default: {DEFAULT_METRICS_INTERVAL_S:g}s)",
        )
        group.add_argument(
            "--otlp-live",
            choices=("on", "off"),
            default="on",
            help="while the build runs, send each open phase as a snapshot span "
            "(trt.span.snapshot=true) within 5s of its start and every 30s after, so a trace "
            "backend shows a running build; off: the final spans only (default: on)",
        )


def span_config(args: argparse.Namespace) -> SpanConfig:
    level = args.otlp_logs_level
    return SpanConfig(
        endpoint=args.otlp_endpoint,
        protocol=args.otlp_protocol,
        span_budget=args.span_budget,
        fold_under_s=args.span_fold_under,
        flush_timeout_s=args.otlp_flush_timeout,
        logs_level=None if level == "off" else level,
        metrics=bool(getattr(args, "otlp_metrics", False)),
        metrics_interval_s=getattr(args, "otlp_metrics_interval", DEFAULT_METRICS_INTERVAL_S),
        live=getattr(args, "otlp_live", "off") == "on",  # replay: none
    )


# -- builder -------------------------------------------------------------------------------------


# Long: one add_argument per builder option, in the order --help shows them.
def add_builder_options(parser: argparse.ArgumentParser) -> Group:
    group = parser.add_argument_group(
        "builder (named after trtexec; trtexec's spellings are accepted too)"
    )
    for precision in PRECISIONS:
        group.add_argument(
            f"--{precision}",
            dest="precisions",
            action="append_const",
            const=precision,
            help=f"allow {precision} kernels",
        )
    group.add_argument(
        "--strongly-typed",
        "--stronglyTyped",
        action="store_true",
        help="a strongly typed network: its own types decide precision (no precision flags)",
    )
    group.add_argument(
        "--workspace", metavar="SIZE", help="workspace memory pool limit (e.g. 4G, 512M)"
    )
    group.add_argument(
        "--mem-pool-size",
        "--memPoolSize",
        action="append",
        default=[],
        metavar="POOL:SIZE",
        help="a memory pool limit: workspace, dlaSRAM, dlaLocalDRAM, dlaGlobalDRAM, tacticDRAM, "
        "tacticSharedMem (repeatable, or comma-separated)",
    )
    group.add_argument(
        "--builder-optimization-level",
        "--builderOptimizationLevel",
        type=int,
        choices=range(6),
        metavar="0-5",
        help="builder optimization level (TensorRT's default: 3)",
    )
    group.add_argument(
        "--max-threads", type=int, metavar="N", help="builder threads (TensorRT's max_threads)"
    )
    group.add_argument(
        "--timing-cache",
        "--timingCacheFile",
        type=Path,
        metavar="FILE",
        help="load the timing cache from FILE if it exists, and save it there after the build",
    )
    group.add_argument(
        "--shapes",
        action="append",
        default=[],
        metavar="INPUT:MIN,OPT,MAX",
        help="shape range of a dynamic input, e.g. input:1x3x224x224,8x3x224x224,32x3x224x224",
    )
    for bound, word in (("min", "smallest"), ("opt", "tuned-for"), ("max", "largest")):
        group.add_argument(
            f"--{bound}-shapes",
            f"--{bound}Shapes",
            dest=f"{bound}_shapes",
            action="append",
            default=[],
            metavar="INPUT:DIMS,...",
            help=f"{word} shapes of dynamic inputs, as trtexec writes them",
        )
    group.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=DEFAULT_LOG_LEVEL,
        help=f"least severe builder message kept as a log event (default: {DEFAULT_LOG_LEVEL})",
    )
    group.add_argument("--verbose", action="store_true", help="the same as --log-level verbose")
    return group


def builder_options(args: argparse.Namespace, *, threads: int | None = None) -> BuildOptions:
    """The builder options, checked: a bad one is exit 2 before anything starts. ``threads``
    stands in for ``--max-threads`` when that is not given (the demo's ``--threads``)."""
    if args.max_threads is not None:
        threads = args.max_threads
    if threads is not None and threads < 1:
        raise UsageError("--max-threads must be at least 1")
    precisions = tuple(dict.fromkeys(args.precisions or ()))
    try:
        check_precisions(precisions, args.strongly_typed)
        pools: dict[str, int] = {}
        if args.workspace is not None:
            pools["WORKSPACE"] = parse_size(args.workspace)
        for text in args.mem_pool_size:
            for item in text.split(","):
                pool, size = parse_memory_pool(item)
                pools[pool] = size
        shapes = shape_ranges(args.shapes, args.min_shapes, args.opt_shapes, args.max_shapes)
    except OptionError as error:
        raise UsageError(str(error)) from None
    if args.timing_cache is not None and args.timing_cache.is_dir():
        raise UsageError(f"--timing-cache {args.timing_cache} is a directory")
    return BuildOptions(
        precisions=precisions,
        strongly_typed=args.strongly_typed,
        memory_pools=pools,
        optimization_level=args.builder_optimization_level,
        max_threads=threads,
        timing_cache=args.timing_cache,
        shapes=shapes,
        log_level="verbose" if args.verbose else args.log_level,
    )


# -- cancel policies -----------------------------------------------------------------------------


def add_policy_options(parser: argparse.ArgumentParser) -> Group:
    """The options of every registered cancel policy (:mod:`trt_otel.control.registry`), in
    its order, and ``--grace``; the group is returned for a command's own additions (``build``
    and ``demo`` add ``--in-process``)."""
    group = parser.add_argument_group(
        "cancel policies (any of them stops the build; the reason shows everywhere)"
    )
    for entry in registry.policies():
        defaults = entry.defaults()
        for option in entry.options:
            add_policy_option(group, option, defaults.get(option.field))
    group.add_argument(
        "--grace",
        type=seconds,
        default=DEFAULT_GRACE_S,
        metavar="DURATION",
        help="time a cancelled build gets to stop at TensorRT's next step before its process "
        f"is terminated (default: {DEFAULT_GRACE_S:g}s)",
    )
    group.add_argument(
        "--stop-budget",
        type=positive_seconds,
        default=None,
        metavar="DURATION",
        help="how long a stop asked for by a signal (Ctrl-C, SIGTERM, a scheduler's) may take "
        "in all, to the journal's end and the spans' flush, before the next, harder signal "
        f"comes (default: ${STOP_BUDGET_ENV}, else {STOP_BUDGET_S:g}s, GitHub Actions' "
        "SIGINT to SIGTERM)",
    )
    return group


OPTION_TYPES: dict[str, Callable[[str], Any]] = {
    "duration": positive_seconds,
    "size": size,
    "share": share,
    "path": Path,
    "url": http_url,
}
"""How each kind of policy option's value is read (``choice`` and ``flag`` take no type)."""


def add_policy_option(group: Group, option: Option, default: Any) -> None:
    help_text = option.help.replace("%", "%%")  # argparse formats help with %
    if option.kind == "flag":
        group.add_argument(option.flag, action="store_true", help=help_text)
    elif option.kind == "choice":
        group.add_argument(option.flag, choices=option.choices, default=default, help=help_text)
    else:
        group.add_argument(
            option.flag,
            type=OPTION_TYPES[option.kind],
            default=default,
            metavar=option.metavar,
            help=help_text,
        )


def policy_config(args: argparse.Namespace) -> PolicyConfig:
    """The policies' settings from their options: as fields of :class:`PolicyConfig` for the
    policies that have them there, else as their own settings in ``more``."""
    fields: dict[str, Any] = {}
    more: list[object] = []
    own = {field.name for field in dataclasses.fields(PolicyConfig)}
    for entry in registry.policies():
        values = {option.field: getattr(args, option.dest) for option in entry.options}
        if own.issuperset(values):
            fields.update(values)
            continue
        settings = entry.config(**values)
        if entry.enabled(settings):
            more.append(settings)
    budget = stop_budget(getattr(args, "stop_budget", None), os.environ)
    return PolicyConfig(**fields, grace_s=args.grace, stop_budget_s=budget, more=tuple(more))


def stop_budget(given: float | None, environ: Mapping[str, str]) -> float:
    """``--stop-budget``, else ``$TRT_OTEL_STOP_BUDGET`` (a duration), else the default."""
    if given is not None:
        return given
    text = environ.get(STOP_BUDGET_ENV, "").strip()
    if not text:
        return STOP_BUDGET_S
    try:
        return positive_seconds(text)
    except argparse.ArgumentTypeError as error:
        raise UsageError(f"${STOP_BUDGET_ENV}={text!r}: {error}") from None


def add_in_process_option(group: Group) -> None:
    group.add_argument(
        "--in-process",
        action="store_true",
        help="build in this process instead of a worker process: no escalation, so a silent "
        "build stops only at its next step",
    )


# -- observability -------------------------------------------------------------------------------


def add_console_options(parser: argparse.ArgumentParser | Group) -> None:
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="plain lines instead of the live tree (the default when not on a terminal)",
    )


def console_config(args: argparse.Namespace) -> ConsoleConfig:
    return ConsoleConfig(live=not args.no_progress)


# Long: one add_argument per observability option, in the order --help shows them.
def add_observability_options(parser: argparse.ArgumentParser) -> Group:
    """Journal, HTTP view, GPU, history, Prometheus and the console (spans are their own
    group: :func:`add_span_options`)."""
    group = parser.add_argument_group("observability")
    group.add_argument("--journal", type=Path, help="write the build's events to this JSONL file")
    group.add_argument(
        "--http-port",
        type=port,
        metavar="PORT",
        help="serve a live page of the build at /, and /status, /events (SSE), /metrics, "
        "/healthz and POST /cancel on this port (0 picks a free one)",
    )
    group.add_argument(
        "--http-url-file",
        type=Path,
        metavar="PATH",
        help="write the HTTP view's URL to PATH once it serves (with --http-port 0, how another "
        "program finds it); removed when the view stops",
    )
    group.add_argument(
        "--http-address",
        default=LOOPBACK,
        metavar="ADDRESS",
        help=f"address to serve HTTP on (default: {LOOPBACK})",
    )
    group.add_argument(
        "--http-allowed-host",
        action="append",
        type=host_name,
        default=[],
        metavar="NAME",
        help="a name the HTTP view answers to besides its address and localhost (repeatable): "
        "requests naming another host are refused, so no web page can read it by DNS rebinding",
    )
    group.add_argument(
        "--cancel-token",
        metavar="TOKEN",
        help="bearer token POST /cancel requires (default: TRT_OTEL_CANCEL_TOKEN, else one is "
        "generated and written to a file only you can read)",
    )
    group.add_argument(
        "--gpu",
        metavar="GPU",
        help="the GPU to sample through NVML, by index or UUID (default: the first of "
        "CUDA_VISIBLE_DEVICES, else 0)",
    )
    group.add_argument(
        "--sample-interval",
        "--gpu-interval",
        dest="sample_interval",
        type=positive_seconds,
        default=SAMPLE_INTERVAL_S,
        metavar="DURATION",
        help="how often to sample the builder's process and the GPU (default: "
        f"{SAMPLE_INTERVAL_S:g}s); at most "
        "half of --stall-timeout, which needs two samples to see the builder work",
    )
    group.add_argument(
        "--no-gpu", action="store_true", help="do not sample the GPU (on where NVML is present)"
    )
    group.add_argument(
        "--history",
        type=Path,
        metavar="DIR",
        help="journals of earlier builds of this model, for an ETA from how long they took",
    )
    group.add_argument(
        "--prometheus-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus metrics on this port (0 picks a free one)",
    )
    group.add_argument(
        "--prometheus-address",
        default=LOOPBACK,
        metavar="ADDRESS",
        help=f"address to serve metrics on (default: {LOOPBACK}; 0.0.0.0 for every interface)",
    )
    group.add_argument(
        "--http-linger",
        type=seconds,
        metavar="DURATION",
        help="after the build, keep serving its final status up to this long, until a client "
        "has read it (default: 3s, and only when a client came by during the build; given, "
        "also for a first client that comes late)",
    )
    group.add_argument(
        "--prometheus-linger",
        type=seconds,
        default=DEFAULT_PROMETHEUS_LINGER_S,
        metavar="DURATION",
        help="after the build, wait up to this long for a last scrape "
        f"(default: {DEFAULT_PROMETHEUS_LINGER_S:g}s)",
    )
    group.add_argument(
        "--pushgateway",
        type=gateway_url,
        metavar="URL",
        help="push the final metrics to this Prometheus Pushgateway when the build ends",
    )
    group.add_argument(
        "--prometheus-sd-dir",
        type=Path,
        metavar="DIR",
        help="announce the metrics endpoint (--prometheus-port, else --http-port's /metrics) "
        "to Prometheus: a file_sd_configs target file in DIR, labelled with host, gpu, "
        "backend and model, written once it serves and removed after its last scrape",
    )
    group.add_argument(
        "--metrics-build-id",
        action="store_true",
        help="add the build id as a label of trt_build_info (one series per build)",
    )
    add_console_options(group)
    return group


def observability_config(args: argparse.Namespace) -> ObservabilityConfig:
    """Needs the groups of :func:`add_observability_options` and :func:`add_span_options`."""
    if args.history is not None and not args.history.is_dir():
        raise UsageError(f"--history {args.history} is not a directory of journals")
    check_sd_dir(args)
    return ObservabilityConfig(
        journal=args.journal,
        history=args.history,
        spans=span_config(args),
        http=HttpConfig(
            port=args.http_port,
            address=args.http_address,
            cancel_token=args.cancel_token,
            linger_s=args.http_linger if args.http_linger is not None else DEFAULT_HTTP_LINGER_S,
            linger_unwatched=args.http_linger is not None,
            url_file=args.http_url_file,
            allowed_hosts=tuple(args.http_allowed_host),
        ),
        metrics=MetricsConfig(
            port=args.prometheus_port,
            address=args.prometheus_address,
            linger_s=args.prometheus_linger,
            pushgateway=args.pushgateway,
            build_id_label=args.metrics_build_id,
            sd_dir=args.prometheus_sd_dir,
        ),
        sample_interval_s=args.sample_interval,
        gpu=GpuConfig(enabled=not args.no_gpu, device=args.gpu, interval_s=args.sample_interval),
        console=console_config(args),
    )


def check_sd_dir(args: argparse.Namespace) -> None:
    """``--prometheus-sd-dir`` needs an endpoint to announce and a folder to write in."""
    directory = args.prometheus_sd_dir
    if directory is None:
        return
    if args.prometheus_port is None and args.http_port is None:
        raise UsageError(
            "--prometheus-sd-dir announces a metrics endpoint: give --prometheus-port PORT "
            "(or --http-port PORT) too"
        )
    if not directory.is_dir():
        raise UsageError(f"--prometheus-sd-dir {directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"--prometheus-sd-dir {directory} is not writable")


# -- a whole session -----------------------------------------------------------------------------


def add_session_options(parser: argparse.ArgumentParser, *, in_process: bool = True) -> None:
    """Every group an observed, cancellable build takes: policies, spans, observability (and,
    for a build made here, the engine store)."""
    policies = add_policy_options(parser)
    if in_process:
        add_in_process_option(policies)
        add_store_options(parser)
    add_span_options(parser)
    add_observability_options(parser)


STORE_VARIABLE = "TRT_OTEL_ENGINE_STORE"


def add_store_options(parser: argparse.ArgumentParser) -> Group:
    group = parser.add_argument_group("engine store")
    group.add_argument(
        "--engine-store",
        type=Path,
        metavar="DIR",
        help="serve the engine from this folder when a build of the same model, options, "
        "backend version and GPU stored it, instead of building it again (and say why one "
        f"was rebuilt); store what a successful build makes (default: ${STORE_VARIABLE})",
    )
    group.add_argument(
        "--engine-store-max",
        type=size,
        metavar="SIZE",
        help="the most the store's engines may take, e.g. 50GiB; the least recently used "
        "are removed first",
    )
    return group


def store_config(args: argparse.Namespace, environ: Mapping[str, str]) -> StoreConfig:
    directory = getattr(args, "engine_store", None)
    if directory is None and environ.get(STORE_VARIABLE, "").strip():
        directory = Path(environ[STORE_VARIABLE].strip())
    max_bytes = getattr(args, "engine_store_max", None)
    if max_bytes is not None and directory is None:
        raise UsageError(f"--engine-store-max needs --engine-store DIR (or ${STORE_VARIABLE})")
    return StoreConfig(directory=directory, max_bytes=max_bytes)


def check_sampling(
    stall_timeout_s: float | None, stall_on: str, sample_interval_s: float | None
) -> None:
    """A stall counted on activity needs fresh samples of the builder's process within its
    timeout (:data:`~trt_otel.control.defaults.SAMPLES_PER_STALL`): with fewer, a builder
    computing through a silent window would be stopped as hung."""
    if stall_timeout_s is None or stall_on != "activity" or sample_interval_s is None:
        return
    if sample_interval_s * SAMPLES_PER_STALL <= stall_timeout_s:
        return
    interval, timeout = format_duration(sample_interval_s), format_duration(stall_timeout_s)
    most = format_duration(stall_timeout_s / SAMPLES_PER_STALL)
    raise UsageError(
        f"--sample-interval {interval} is too long for --stall-timeout {timeout}: the "
        "builder's work is measured between two samples, so the stall timeout must hold at "
        f"least {SAMPLES_PER_STALL} intervals (--sample-interval {most} or less, a longer "
        "--stall-timeout, or --stall-on callbacks)"
    )


def session_config(args: argparse.Namespace) -> SessionConfig:
    check_sampling(args.stall_timeout, args.stall_on, getattr(args, "sample_interval", None))
    return SessionConfig(
        observe=observability_config(args),
        policy=policy_config(args),
        store=store_config(args, os.environ),
        in_process=bool(getattr(args, "in_process", False)),
    )
