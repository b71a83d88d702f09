"""One attribute of a build's record that differs between two builds, in words: what ``diff``
says of two records, and what the engine store says of why it rebuilt."""

from __future__ import annotations

OPTION_PREFIX = "trt.options."


def attribute_change(key: str, before: str | None, after: str | None) -> str:
    """``options: +optimization_level 1``, ``options: workspace 1G -> 2G``, or
    ``trt.version: 1.7.1 -> 1.7.2`` (``(none)`` where one record lacks it)."""
    if key.startswith(OPTION_PREFIX):
        name = key.removeprefix(OPTION_PREFIX)
        if before is None:
            return f"options: +{name} {after}"
        if after is None:
            return f"options: -{name} {before}"
        return f"options: {name} {before} -> {after}"
    return f"{key}: {before if before is not None else '(none)'} -> " + (
        after if after is not None else "(none)"
    )
