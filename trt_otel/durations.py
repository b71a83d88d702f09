"""Durations as people read them in a terminal, a reason or a policy's description."""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    """``0.4s``, ``12.3s``, ``4m05s``, ``2h03m``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
