"""The cancel policies, declared once: each one's name, the options that turn it on, its typed
settings, the function that makes it, the cancel source its decisions carry, whether a retry
ladder retries a build it stopped, and the samplers it reads.

Whatever lists the policies reads this: the command line's policy options and their typed values
(:mod:`trt_otel.app.arguments`, :class:`~trt_otel.app.config.PolicyConfig`), the retry ladder's
retried sources, the checks that a policy has the samples it reads, and the tests that hold the
docs' tables to it. A new policy is one module (the policy and the function that makes it from
its settings) and one registration here (its settings and its entry).

Nothing here imports a policy: the command line reads this for every build, and a build that asks
for no policy never imports them. An entry names the function that makes its policy by module and
name, imported when a build has that policy.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from trt_otel.control.defaults import DEFAULT_MARGIN, STALL_ON
from trt_otel.core.events import CancelSource

if TYPE_CHECKING:
    from trt_otel.core.eta import History
    from trt_otel.core.projection import Projection

OptionKind = Literal["duration", "size", "share", "path", "url", "choice", "flag"]
"""How an option's value is written: ``90s``; ``6GiB``; ``10%``; a path; an ``http(s)://`` URL;
one of its ``choices``; no value (a flag)."""
Sampler = Literal["process", "gpu"]
"""What a policy reads besides the callbacks: the builder's process samples (psutil), or its
GPU's (NVML)."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option:
    """One command-line option of a policy, filling one field of its settings."""

    flag: str
    field: str
    """The settings' field it fills; its default is the option's."""
    kind: OptionKind
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    switch: bool = True
    """Given, it turns its policy on; else it only tunes one another option turns on."""

    @property
    def dest(self) -> str:
        """Its name in a parsed command line (``--max-memory``: ``max_memory``)."""
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a build knows when its policies are made, besides their settings."""

    history: History | None = None
    """Earlier builds of the model (``--history``)."""
    project: Callable[[int], Projection | None] | None = None
    """The build's projection at a monotonic time, while it runs (a read model's)."""


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """A registered policy."""

    name: str
    config: type[Any]
    """Its typed settings: a frozen dataclass whose fields its options fill."""
    factory: str
    """``module:function``, called with its settings and a :class:`PolicyContext`."""
    source: CancelSource
    options: tuple[Option, ...]
    retried_by_ladder: bool
    """Whether another attempt of a retry ladder may mend a build it stopped."""
    samplers: tuple[Sampler, ...] = ()

    @property
    def module(self) -> str:
        """The module its policy comes from, imported only for a build that has it."""
        return self.factory.partition(":")[0]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(self.config))

    def defaults(self) -> dict[str, Any]:
        """Its settings' defaults, by field: its options' defaults."""
        return {
            field.name: field.default
            for field in dataclasses.fields(self.config)
            if field.default is not dataclasses.MISSING
        }

    def enabled(self, settings: Any) -> bool:
        """Whether ``settings`` turn it on (one of its switches is given)."""
        return any(getattr(settings, o.field) is not None for o in self.options if o.switch)

    def given(self, settings: Any) -> list[str]:
        """The switches ``settings`` give, as their flags (for a message about them)."""
        return [o.flag for o in self.options if o.switch and getattr(settings, o.field) is not None]

    def make(self, settings: Any, context: PolicyContext) -> Any:
        """Its policy, made from ``settings`` (its module is imported now)."""
        module, _, function = self.factory.partition(":")
        return getattr(importlib.import_module(module), function)(settings, context)


_POLICIES: dict[str, PolicyEntry] = {}


def register(
    name: str,
    *,
    config: type[Any],
    factory: str,
    source: CancelSource,
    options: tuple[Option, ...],
    retried_by_ladder: bool,
    samplers: tuple[Sampler, ...] = (),
) -> PolicyEntry:
    """Add a policy to the registry (in the order ``--help`` shows and policies decide)."""
    entry = PolicyEntry(name, config, factory, source, options, retried_by_ladder, samplers)
    if name in _POLICIES:
        raise ValueError(f"a policy named {name!r} is registered already")
    if not isinstance(source, CancelSource):
        raise TypeError(f"policy {name!r}: its source must be a CancelSource, not {source!r}")
    if ":" not in factory:
        raise ValueError(f"policy {name!r}: its factory is 'module:function', not {factory!r}")
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"policy {name!r}: its settings must be a dataclass")
    if sorted(o.field for o in options) != sorted(entry.fields):
        raise ValueError(f"policy {name!r}: its options must fill its settings' fields, once each")
    if not any(o.switch for o in options):
        raise ValueError(f"policy {name!r}: no option turns it on")
    for other in _POLICIES.values():
        if other.source is source and other.retried_by_ladder != retried_by_ladder:
            # The ladder knows a stop by its source alone.
            raise ValueError(
                f"policy {name!r}: {other.name!r} gives the source {source.value!r} too, and a "
                "retry ladder retries both or neither"
            )
    taken = {o.flag for e in _POLICIES.values() for o in e.options}
    for option in options:
        if option.flag in taken:
            raise ValueError(f"policy {name!r}: {option.flag} belongs to another policy")
        if option.switch and entry.defaults().get(option.field, None) is not None:
            raise ValueError(f"policy {name!r}: {option.flag} turns it on, so defaults to None")
    _POLICIES[name] = entry
    return entry


def policies() -> tuple[PolicyEntry, ...]:
    """Every registered policy, in the order they were registered."""
    return tuple(_POLICIES.values())


def retried_sources() -> frozenset[CancelSource]:
    """The cancel sources after which a retry ladder tries again."""
    return frozenset(e.source for e in _POLICIES.values() if e.retried_by_ladder)


def required(value: T | None) -> T:
    """A setting that turns its policy on (so is given when the policy is made)."""
    if value is None:
        raise ValueError("a policy was made from settings that do not turn it on")
    return value


# -- the policies ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    timeout_s: float | None = None


register(
    "timeout",
    config=TimeoutConfig,
    factory="trt_otel.control.policies:make_timeout",
    source=CancelSource.TIMEOUT,
    retried_by_ladder=True,
    options=(Option("--timeout", "timeout_s", "duration", "stop after this long", "DURATION"),),
)


@dataclass(frozen=True, slots=True)
class DeadlineConfig:
    deadline_s: float | None = None
    deadline_margin: float = DEFAULT_MARGIN


register(
    "deadline",
    config=DeadlineConfig,
    factory="trt_otel.control.deadline:make_deadline",
    source=CancelSource.DEADLINE,
    retried_by_ladder=True,
    options=(
        Option(
            "--deadline",
            "deadline_s",
            "duration",
            "the build must end within this long: stopped as soon as its projection (from "
            "--history, or from its progress once half done) says it cannot, even with the "
            "margin; refused before it starts when its history says so; else a --timeout",
            "DURATION",
        ),
        Option(
            "--deadline-margin",
            "deadline_margin",
            "share",
            "how far past the deadline the earliest projected end must be before a build is "
            "stopped early, a percentage (5 and 5% are both 5%; 0 to 1000%) "
            f"(default: {DEFAULT_MARGIN * 100:.0f}%)",
            "PERCENT",
            switch=False,
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class StallConfig:
    stall_timeout_s: float | None = None
    stall_on: str = "activity"


register(
    "stall",
    config=StallConfig,
    factory="trt_otel.control.policies:make_stall",
    source=CancelSource.STALL,
    retried_by_ladder=True,
    samplers=("process",),
    options=(
        Option(
            "--stall-timeout",
            "stall_timeout_s",
            "duration",
            "stop when the build made no progress (no step, no phase started or finished) and "
            "its builder's process did no work (idle, stopped or gone) for this long; a builder "
            "computing through a silent window is not stalled",
            "DURATION",
        ),
        Option(
            "--stall-on",
            "stall_on",
            "choice",
            "what --stall-timeout counts: activity (progress or work by the builder's process; "
            "the default) or callbacks (progress alone, however busy the builder)",
            choices=STALL_ON,
            switch=False,
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    max_memory_bytes: int | None = None
    min_available_bytes: int | None = None


register(
    "memory",
    config=MemoryConfig,
    factory="trt_otel.control.policies:make_memory_guard",
    source=CancelSource.MEMORY,
    retried_by_ladder=True,
    samplers=("process",),
    options=(
        Option(
            "--max-memory",
            "max_memory_bytes",
            "size",
            "stop the build when its builder's resident memory exceeds SIZE (e.g. 6GiB)",
            "SIZE",
        ),
        Option(
            "--min-available",
            "min_available_bytes",
            "size",
            "stop the build when the host's available memory falls below SIZE (e.g. 2GiB)",
            "SIZE",
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class GpuMemoryConfig:
    max_gpu_memory_bytes: int | None = None


register(
    "gpu-memory",
    config=GpuMemoryConfig,
    factory="trt_otel.control.gpu_memory:make_gpu_memory_guard",
    source=CancelSource.MEMORY,
    retried_by_ladder=True,
    samplers=("gpu",),
    options=(
        Option(
            "--max-gpu-memory",
            "max_gpu_memory_bytes",
            "size",
            "stop the build when its builder's process holds more than SIZE of GPU memory "
            "(e.g. 8GiB); refused where no GPU is sampled",
            "SIZE",
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class CancelFileConfig:
    cancel_file: Path | None = None


register(
    "file",
    config=CancelFileConfig,
    factory="trt_otel.control.probes:make_cancel_file",
    source=CancelSource.FILE,
    retried_by_ladder=False,
    options=(
        Option(
            "--cancel-file",
            "cancel_file",
            "path",
            "stop when this file appears (its first line, if any, is the reason); it must not "
            "exist when the build starts",
            "PATH",
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class CancelUrlConfig:
    cancel_url: str | None = None
    cancel_url_interval_s: float = 5.0
    cancel_url_fail_closed: bool = False


register(
    "url",
    config=CancelUrlConfig,
    factory="trt_otel.control.probes:make_cancel_url",
    source=CancelSource.HTTP,
    retried_by_ladder=False,
    options=(
        Option(
            "--cancel-url",
            "cancel_url",
            "url",
            "stop when this URL answers true (polled; see the README for the answer format)",
            "URL",
        ),
        Option(
            "--cancel-url-interval",
            "cancel_url_interval_s",
            "duration",
            "how often to poll --cancel-url (default: 5s)",
            "DURATION",
            switch=False,
        ),
        Option(
            "--cancel-url-fail-closed",
            "cancel_url_fail_closed",
            "flag",
            "stop the build after 3 failed polls in a row (default: keep building)",
            switch=False,
        ),
    ),
)
