"""A cluster started afresh when one of its daemons exits while it starts (Ray's nodes and SLURM's
daemons alike: their ports are chosen free, then bound a moment later, and on a busy machine
another process can take one in between)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

START_ATTEMPTS = 3


@contextlib.contextmanager
def started_afresh(
    start: Callable[[contextlib.ExitStack[bool | None]], T],
    exited: type[BaseException],
    attempts: int = START_ATTEMPTS,
) -> Iterator[T]:
    """What ``start`` starts on a stack of its own (closed when the context ends), started
    again on a fresh stack, up to ``attempts`` times in all, while it raises ``exited``."""
    for attempt in range(1, attempts + 1):
        stack: contextlib.ExitStack[bool | None] = contextlib.ExitStack()
        try:
            started = start(stack)
        except exited:
            stack.close()
            if attempt == attempts:
                raise
            continue
        with stack:
            yield started
        return
