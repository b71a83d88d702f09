"""The cancel policies' defaults and choices, which the command line and its configuration
name without importing the policies: a build that asks for none never imports them (every
build pays for what the command line imports before it starts)."""

from __future__ import annotations

DEFAULT_MARGIN = 0.1
"""How far past a ``--deadline`` the earliest projected end must be before a build is stopped
early (a share of the deadline)."""

STALL_ON = ("activity", "callbacks")
"""What ``--stall-timeout`` counts: progress or work by the builder's process, or progress
alone."""

SAMPLE_INTERVAL_S = 1.0
"""How often the builder's process (and the GPU) is sampled unless told otherwise."""

SAMPLES_PER_STALL = 2
"""A stall counted on activity needs at least this many of the builder's process samples within
its timeout: work is measured between two samples, so a window with fewer cannot see a builder
that computes, and would stop it as if it were hung."""
