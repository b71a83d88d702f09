"""Builder options as people write them (after ``trtexec`` where it has a name), checked before
any build starts.

- precision: ``--fp16``, ``--bf16``, ``--int8``, ``--fp8``, ``--strongly-typed`` (which lets the
  network's own types decide, so it excludes the precision flags);
- memory: ``--workspace SIZE`` and ``--mem-pool-size POOL:SIZE`` (``workspace:4G``,
  ``tacticSharedMem:48K``); sizes in bytes or with a unit (``K``, ``M``, ``G``, ``KiB``, ...,
  powers of 1024, as trtexec reads them);
- ``--builder-optimization-level 0..5``, ``--max-threads N``, ``--timing-cache FILE``;
- shapes of dynamic inputs: ``--shapes NAME:MIN,OPT,MAX`` or trtexec's ``--min-shapes``,
  ``--opt-shapes`` and ``--max-shapes`` (``NAME:1x3x224x224,OTHER:...``);
- ``--log-level``: the least severe builder message recorded as a log event.

:func:`unsupported_options` checks them against the builder library a build will use, so that
an option that library does not have is refused before the build, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trt_otel.capture import backends
from trt_otel.core import sizes

Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]

PRECISIONS = ("fp16", "bf16", "int8", "fp8")
MEMORY_POOLS = {
    # trtexec's names, and TensorRT's MemoryPoolType members they stand for.
    "workspace": "WORKSPACE",
    "dlasram": "DLA_MANAGED_SRAM",
    "dlalocaldram": "DLA_LOCAL_DRAM",
    "dlaglobaldram": "DLA_GLOBAL_DRAM",
    "tacticdram": "TACTIC_DRAM",
    "tacticsharedmem": "TACTIC_SHARED_MEMORY",
}
_POOL_FLAGS = {
    "WORKSPACE": "workspace",
    "DLA_MANAGED_SRAM": "dlaSRAM",
    "DLA_LOCAL_DRAM": "dlaLocalDRAM",
    "DLA_GLOBAL_DRAM": "dlaGlobalDRAM",
    "TACTIC_DRAM": "tacticDRAM",
    "TACTIC_SHARED_MEMORY": "tacticSharedMem",
}
LOG_LEVELS = ("internal_error", "error", "warning", "info", "verbose")


class OptionError(ValueError):
    """An option that cannot be used, with a message saying how to write it."""


DEFAULT_LOG_LEVEL = "info"
"""The least severe builder message kept as a log event."""


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """Builder options, by value (they travel to the build's worker process)."""

    precisions: tuple[str, ...] = ()
    strongly_typed: bool = False
    memory_pools: dict[str, int] = field(default_factory=dict)
    """TensorRT ``MemoryPoolType`` member name to bytes."""
    optimization_level: int | None = None
    max_threads: int | None = None
    timing_cache: Path | None = None
    shapes: dict[str, ShapeRange] = field(default_factory=dict)
    log_level: str = DEFAULT_LOG_LEVEL

    def attributes(self) -> dict[str, Any]:
        """The build record's ``trt.options.*`` attributes (what was asked for)."""
        record: dict[str, Any] = {}
        if self.precisions:
            record["trt.options.precision"] = ",".join(self.precisions)
        if self.strongly_typed:
            record["trt.options.strongly_typed"] = True
        for pool, size in sorted(self.memory_pools.items()):
            record[f"trt.options.memory_pool.{pool.lower()}"] = size
        if self.optimization_level is not None:
            record["trt.options.optimization_level"] = self.optimization_level
        if self.max_threads is not None:
            record["trt.options.max_threads"] = self.max_threads
        if self.timing_cache is not None:
            record["trt.options.timing_cache"] = str(self.timing_cache)
        for name, (low, opt, high) in sorted(self.shapes.items()):
            record[f"trt.options.shapes.{name}"] = "/".join(_dims(s) for s in (low, opt, high))
        return record


def _dims(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


MAX_POOL_BYTES = 2**64 - 1
"""The largest memory pool limit TensorRT's binding takes (a ``size_t``)."""


def parse_size(text: str) -> int:
    """``4G``, ``512MiB``, ``1048576``: bytes (see :mod:`trt_otel.core.sizes`): more than the
    host has is allowed (a limit, not an allocation), more than an EiB is refused as a typo."""
    try:
        return sizes.parse_size(text)
    except sizes.SizeError as error:
        if str(error).endswith("larger than any memory"):  # say where the limit is
            raise OptionError(
                f"{text!r} is larger than any memory: a memory pool size is at most "
                f"{sizes.MAX_SIZE_BYTES:,} bytes (1 EiB)"
            ) from None
        raise OptionError(str(error)) from None


def pool_size_problems(memory_pools: dict[str, int]) -> list[str]:
    """The pool sizes TensorRT's binding cannot take (a ``size_t``: 0 to 2**64-1), one message
    each: refused before the build, not a TypeError from inside it."""
    return [
        f"--mem-pool-size {_POOL_FLAGS.get(pool, pool)}: {size:,} bytes does not fit TensorRT's "
        f"memory pool limit (a size_t: 0 to {MAX_POOL_BYTES:,})"
        for pool, size in sorted(memory_pools.items())
        if not (isinstance(size, int) and 0 <= size <= MAX_POOL_BYTES)
    ]


def parse_memory_pool(text: str) -> tuple[str, int]:
    """``workspace:4G`` to ``("WORKSPACE", 4294967296)``."""
    name, sep, size = text.partition(":")
    if not sep:
        raise OptionError(f"{text!r}: write POOL:SIZE, e.g. workspace:4G")
    pool = MEMORY_POOLS.get(name.strip().lower().replace("_", ""))
    if pool is None:
        known = ", ".join(("workspace", "dlaSRAM", "dlaLocalDRAM", "dlaGlobalDRAM",
                           "tacticDRAM", "tacticSharedMem"))  # fmt: skip
        raise OptionError(f"unknown memory pool {name!r}; TensorRT has {known}")
    return pool, parse_size(size)


def parse_shape(text: str) -> Shape:
    """``1x3x224x224`` (or ``1,3,224,224`` inside ``--shapes``)."""
    parts = text.strip().lower().split("x")
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        raise OptionError(f"{text!r} is not a shape (write dimensions like 1x3x224x224)") from None
    if not shape or any(d < 0 for d in shape):
        raise OptionError(f"{text!r} is not a shape (dimensions are 0 or more)")
    return shape


def parse_shape_list(text: str) -> dict[str, Shape]:
    """trtexec's ``NAME:1x3x224x224,OTHER:1x10``."""
    shapes = {}
    for item in text.split(","):
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise OptionError(f"{item!r}: write INPUT:DIMS, e.g. input:1x3x224x224")
        shapes[name.strip()] = parse_shape(dims)
    return shapes


def parse_shape_range(text: str) -> tuple[str, ShapeRange]:
    """``--shapes NAME:MIN,OPT,MAX`` (each ``1x3x224x224``)."""
    name, sep, ranges = text.rpartition(":")
    parts = ranges.split(",")
    if not sep or not name or len(parts) != 3:
        raise OptionError(f"{text!r}: write INPUT:MIN,OPT,MAX, e.g. input:1x3x224x224,8x3x224x224,"
                          "32x3x224x224")  # fmt: skip
    low, opt, high = (parse_shape(p) for p in parts)
    return name.strip(), (low, opt, high)


def shape_ranges(
    ranges: list[str], minimum: list[str], optimum: list[str], maximum: list[str]
) -> dict[str, ShapeRange]:
    """Every input's (min, opt, max), from ``--shapes`` and trtexec's three options, checked:
    each input gets all three, of one rank, with min <= opt <= max."""
    shapes: dict[str, ShapeRange] = dict(parse_shape_range(r) for r in ranges)
    lows, opts, highs = (
        {k: v for text in texts for k, v in parse_shape_list(text).items()}
        for texts in (minimum, optimum, maximum)
    )
    named = set(lows) | set(opts) | set(highs)
    for name in sorted(named):
        if name in shapes:
            raise OptionError(f"input {name!r} has shapes from --shapes and from --min/opt/max")
        given = (("--min-shapes", lows), ("--opt-shapes", opts), ("--max-shapes", highs))
        missing = [flag for flag, shapes_given in given if name not in shapes_given]
        if missing:
            raise OptionError(f"input {name!r} needs {' and '.join(missing)} too")
        shapes[name] = (lows[name], opts[name], highs[name])
    for name, (low, opt, high) in shapes.items():
        if not len(low) == len(opt) == len(high):
            raise OptionError(f"input {name!r}: min, opt and max have different ranks")
        if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
            raise OptionError(
                f"input {name!r}: needs min <= opt <= max in every dimension "
                f"({_dims(low)}, {_dims(opt)}, {_dims(high)})"
            )
    return shapes


def check_precisions(precisions: tuple[str, ...], strongly_typed: bool) -> None:
    if strongly_typed and precisions:
        flags = ", ".join(f"--{p}" for p in precisions)
        raise OptionError(
            f"--strongly-typed takes the network's own types; it cannot be combined with {flags}"
        )


def unsupported_options(module: Any, options: BuildOptions) -> list[str]:
    """What in ``options`` the builder library ``module`` (``tensorrt``, ``tensorrt_rtx``, or
    the simulator) does not have, one message per option, naming the option and why; empty when
    it has them all. Read from the library's own API where it says (its enums and properties),
    and from :class:`~trt_otel.capture.backends.Backend` where it only says so at build time."""
    backend = backends.backend_of_module(module)
    version = backends.version_of(module, backend)
    title = f"{backend.title if backend else 'this TensorRT'} {version}"
    problems: list[str] = []
    flags = getattr(module, "BuilderFlag", None)
    for precision in options.precisions:
        if not hasattr(flags, precision.upper()):
            problems.append(
                f"--{precision}: {title} has no {precision} builder flag (its networks are "
                "strongly typed: the model's own types decide; export the model in that type)"
            )
    creation = getattr(module, "NetworkDefinitionCreationFlag", None)
    if options.strongly_typed and not hasattr(creation, "STRONGLY_TYPED"):
        problems.append(f"--strongly-typed: {title} has no strongly typed network flag")
    problems.extend(pool_size_problems(options.memory_pools))
    pools = getattr(module, "MemoryPoolType", None)
    for pool in sorted(options.memory_pools):
        flag = f"--mem-pool-size {_POOL_FLAGS.get(pool, pool)}"
        if not hasattr(pools, pool):
            problems.append(f"{flag}: {title} has no such memory pool")
        elif pool.startswith("DLA_") and backend is not None and not backend.dla:
            problems.append(f"{flag}: {title} builds for no DLA core, so it has no DLA pools")
    if backend is None:  # the simulator has every option of the API it simulates
        return problems
    config = getattr(module, "IBuilderConfig", None)
    if options.optimization_level is not None and not hasattr(config, "builder_optimization_level"):
        problems.append(f"--builder-optimization-level: {title} has no optimization levels")
    if options.max_threads is not None and not hasattr(
        getattr(module, "Builder", None), "max_threads"
    ):
        problems.append(f"--max-threads: {title} cannot limit its builder threads")
    if options.timing_cache is not None and (
        not backend.timing_cache or not hasattr(config, "create_timing_cache")
    ):
        problems.append(
            f"--timing-cache: {title} has no timing cache (TensorRT-RTX's timing-cache calls "
            "are no-ops since 1.2: it would neither load nor save one)"
        )
    return problems
