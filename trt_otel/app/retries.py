"""``--retry OPTIONS``: the rungs of a retry ladder, read and checked before anything starts.

Each rung is a set of options laid over the first attempt's: builder options (a lower
``--builder-optimization-level``, a smaller ``--workspace``), and the two per-attempt limits,
``--timeout`` and ``--stall-timeout`` (a fallback may be given more time). A rung is parsed by
the same parser code as the command line, onto a copy of the command's own options, so an
option a rung does not give keeps the original's value, and a bad one is refused as the command
line's would be (exit 2). Repeatable options (``--shapes``, ``--precision``) add to the
original's.
"""

from __future__ import annotations

import argparse
import copy
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from trt_otel.app.arguments import (
    Parser,
    add_builder_options,
    builder_options,
    check_sampling,
    positive_seconds,
)
from trt_otel.app.config import SessionConfig, UsageError
from trt_otel.builder.options import BuildOptions

MAX_RUNGS = 8
"""Attempts after the first, at most: a ladder is a few fallbacks, not a loop."""
MAX_RUNG_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Rung:
    """One retry: the options it lays over the first attempt's, as given and as values."""

    text: str
    builder: BuildOptions
    timeout_s: float | None
    stall_timeout_s: float | None

    def session(self, session: SessionConfig) -> SessionConfig:
        """``session`` with this rung's per-attempt limits."""
        return replace(
            session,
            policy=replace(
                session.policy, timeout_s=self.timeout_s, stall_timeout_s=self.stall_timeout_s
            ),
        )


def add_retry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retry",
        action="append",
        default=[],
        metavar="OPTIONS",
        help="after a timeout, a deadline, a stall, a memory limit or a dead worker, build "
        "again with these options laid over the original's (repeatable: a ladder of "
        'fallbacks), e.g. --retry "--builder-optimization-level 1 --workspace 1G"; builder '
        "options, --timeout and --stall-timeout",
    )


class _RungParser(Parser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def rung_parser() -> Parser:
    """What a rung may give: the builder options, ``--timeout`` and ``--stall-timeout``."""
    parser = _RungParser(prog="--retry", add_help=False)
    add_builder_options(parser)
    parser.add_argument("--timeout", type=positive_seconds)
    parser.add_argument("--stall-timeout", type=positive_seconds)
    return parser


def retry_rungs(args: argparse.Namespace, *, threads: int | None = None) -> tuple[Rung, ...]:
    """The ``--retry`` rungs of a parsed command line, checked (a :class:`UsageError` names
    the rung that is wrong)."""
    given: list[str] = list(getattr(args, "retry", None) or ())
    if len(given) > MAX_RUNGS:
        raise UsageError(f"--retry: at most {MAX_RUNGS} rungs, not {len(given)}")
    return tuple(parse_rung(args, text, threads=threads) for text in given)


def parse_rung(args: argparse.Namespace, text: str, *, threads: int | None = None) -> Rung:
    """One rung, laid over ``args`` (the command's own options)."""
    shown = text if len(text) <= 80 else text[:77] + "..."
    if len(text) > MAX_RUNG_CHARS:
        raise UsageError(f"--retry {shown!r}: over {MAX_RUNG_CHARS} characters")
    try:
        tokens = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--retry {shown!r}: {error}") from None
    if not tokens:
        raise UsageError("--retry needs options, e.g. --retry '--builder-optimization-level 1'")
    laid: Any = copy.deepcopy(args)
    try:
        rung_parser().parse_args(tokens, namespace=laid)
        builder = builder_options(laid, threads=threads)
        check_sampling(laid.stall_timeout, laid.stall_on, getattr(laid, "sample_interval", None))
    except UsageError as error:
        raise UsageError(f"--retry {shown!r}: {error}") from None
    return Rung(" ".join(tokens), builder, laid.timeout, laid.stall_timeout)


def rung_paths(text: str) -> list[tuple[str, Path]]:
    """The paths a rung names (``--timing-cache``), with their options: a caller that confines
    paths (the MCP server) checks these as it checks the command line's own."""
    try:
        laid = rung_parser().parse_args(shlex.split(text))
    except (UsageError, ValueError) as error:
        raise UsageError(f"--retry: {error}") from None
    found = []
    for action in rung_parser()._actions:
        value = getattr(laid, action.dest, None)
        if action.type is Path and action.option_strings and value is not None:
            found.append((action.option_strings[0], Path(value)))
    return found
