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

STOP_BUDGET_S = 7.5
"""How long a stop asked for by a signal may take, unless told (``--stop-budget``,
``TRT_OTEL_STOP_BUDGET``): GitHub Actions sends SIGTERM 7.5 s after a cancelled job's SIGINT,
and kills its processes 2.5 s later; Kubernetes and SLURM allow 30 s by default."""

STOP_BUDGET_ENV = "TRT_OTEL_STOP_BUDGET"

STOP_RESERVE_S = 1.0
"""Of a signal's stop budget, what is kept for stopping the builder's process and ending the
journal, besides the final flush of the spans."""
