"""Durations as people write them on a command line, and as they read them in a terminal.

One parser serves every ``DURATION`` option: a plain number of seconds (``90``, ``1.5``) or
numbers with units, alone or compound (``500ms``, ``90s``, ``15m``, ``1h30m``, ``2d``). It
refuses what no option can mean: negative values, ``inf``/``nan``/``1e400`` (not a duration in
this syntax) and anything over :data:`MAX_DURATION_S`, so every later ``time.monotonic() + x``,
``Event.wait(x)`` and nanosecond conversion stays finite.

No library was a good fit: ``pytimeparse`` knows no ``ms`` and no plain seconds, and
``durationpy`` (Go's syntax) ignores text between the parts (``1hxx30m`` reads as ``1h30m``).
"""

from __future__ import annotations

import math
import re

MAX_DURATION_S = 365 * 86_400.0
"""The longest duration accepted (a year): longer is a typo, and would overflow the timers."""

UNITS_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0}

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_PART = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)\s*")
_DURATION = re.compile(rf"(?:{_NUMBER}\s*(?:ms|s|m|h|d)\s*)+")
_PLAIN = re.compile(_NUMBER)

EXAMPLES = "like 90, 90s, 15m, 1h30m or 500ms"


class DurationError(ValueError):
    """A duration that cannot be read, or that no option can mean; the message says which."""


def parse_duration(text: str) -> float:
    """Seconds in ``text``: finite, 0 or more, at most :data:`MAX_DURATION_S`."""
    stripped = text.strip().lower()
    negative = stripped.startswith("-")
    body = stripped.lstrip("+-").strip()
    if _PLAIN.fullmatch(body):
        seconds = float(body)
    elif _DURATION.fullmatch(body):
        seconds = sum(float(number) * UNITS_S[unit] for number, unit in _PART.findall(body))
    else:
        raise DurationError(f"{text!r} is not a duration ({EXAMPLES})")
    if negative and seconds != 0:
        raise DurationError(f"{text!r} must be 0 or more")
    # A number of 400 digits parses, as inf: the same refusal as an overflow.
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise DurationError(f"{text!r} is longer than the limit of {MAX_DURATION_S / 86_400:g}d")
    return seconds


def parse_positive_duration(text: str) -> float:
    """:func:`parse_duration`, also refusing 0."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise DurationError(f"{text!r} must be longer than 0s")
    return seconds


MAX_SHOWN_HOURS = 9_999
"""Longer is said as ``>9999h``: over a year, which no build takes, but a crafted journal's
clock (times are read from it) can claim three hundred years."""


def format_duration(seconds: float) -> str:
    """``0.4s``, ``12.3s``, ``4m05s``, ``2h03m``; ``-1.5s`` for a clock that went back (times
    come from a journal's clock), ``>9999h`` past :data:`MAX_SHOWN_HOURS`, ``?`` for a
    value that is not a number."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 0 and round(seconds, 1) < 0:
        return "-" + format_duration(-seconds)
    seconds = seconds if seconds > 0 else 0.0  # -0.04 s is "0.0s", not "-0.0s"
    if seconds >= (MAX_SHOWN_HOURS + 1) * 3600:
        return f">{MAX_SHOWN_HOURS}h"
    if round(seconds, 1) < 60:  # 59.96 s would read "60.0s": it is a minute
        return f"{seconds:.1f}s"
    minutes, secs = divmod(max(60, int(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
