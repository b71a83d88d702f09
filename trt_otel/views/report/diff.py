"""What changed between two builds: their provenance first, then their phases side by side
(matched by path), the largest changes first, and a verdict.

A baseline is one build, or the median of several (``--history``): :class:`Figures` holds what
is compared of either. Pure: no clock, no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trt_otel.core.changes import attribute_change
from trt_otel.core.forecast import PREFIX as FORECAST
from trt_otel.core.sizes import format_bytes
from trt_otel.views.report.model import BuildReport, PathKey, outcome_text, seconds_text

FINGERPRINT_FIRST = (
    "fingerprint",
    "model.sha256",
    "trt.backend",
    "trt.version",
    "gpu.compute_capability",
)
"""Attributes said first: what decides the engine."""
NOT_COMPARED = frozenset({"engine.path", "model.path", "build_id"})
"""Where a file lies says nothing of the build (nor what it was expected to take, FORECAST)."""
SAME_WITHIN = 0.05
"""A change of the build's time within 5% is "about the same"."""
SHOWN_PHASES = 15


@dataclass(frozen=True, slots=True)
class PhaseFigures:
    total_s: float
    self_s: float
    steps: float
    silent_s: float
    peak_rss_bytes: float | None
    count: float


@dataclass(frozen=True, slots=True)
class Figures:
    """What a diff compares of a build, or of the median of several."""

    label: str
    outcome: str
    duration_s: float
    silent_s: float
    steps: float
    attributes: dict[str, str]
    phases: dict[PathKey, PhaseFigures]
    builds: int = 1
    """How many builds these figures are the median of."""


def figures_of(report: BuildReport, label: str) -> Figures:
    return Figures(
        label=label,
        outcome=outcome_text(report),
        duration_s=report.duration_s,
        silent_s=report.silent_s,
        steps=report.steps,
        attributes=dict(report.attributes),
        phases={
            row.path: PhaseFigures(
                row.total_s,
                row.self_s,
                row.steps,
                row.silent_s,
                None if row.peak_rss_bytes is None else float(row.peak_rss_bytes),
                row.count,
            )
            for row in report.rows
        },
    )


def median_of(builds: Sequence[Figures], label: str) -> Figures:
    """The median build: each figure the median of the builds that have it; the provenance of
    the latest."""
    latest = builds[-1]
    paths = {path for build in builds for path in build.phases}
    phases = {}
    for path in paths:
        found = [build.phases[path] for build in builds if path in build.phases]
        peaks = [f.peak_rss_bytes for f in found if f.peak_rss_bytes is not None]
        phases[path] = PhaseFigures(
            statistics.median(f.total_s for f in found),
            statistics.median(f.self_s for f in found),
            statistics.median(f.steps for f in found),
            statistics.median(f.silent_s for f in found),
            statistics.median(peaks) if peaks else None,
            statistics.median(f.count for f in found),
        )
    return Figures(
        label=label,
        outcome=latest.outcome,
        duration_s=statistics.median(b.duration_s for b in builds),
        silent_s=statistics.median(b.silent_s for b in builds),
        steps=statistics.median(b.steps for b in builds),
        attributes=latest.attributes,
        phases=phases,
        builds=len(builds),
    )


@dataclass(frozen=True, slots=True)
class PhaseChange:
    path: PathKey
    before: PhaseFigures | None
    after: PhaseFigures | None

    @property
    def time_change_s(self) -> float:
        return (self.after.total_s if self.after else 0.0) - (
            self.before.total_s if self.before else 0.0
        )

    @property
    def self_change_s(self) -> float:
        return (self.after.self_s if self.after else 0.0) - (
            self.before.self_s if self.before else 0.0
        )

    @property
    def weight(self) -> float:
        """How large the change is, for ordering: time first, then silent time, then steps
        and memory as tie-breakers."""
        before, after = self.before, self.after
        if before is None or after is None:
            return abs(self.time_change_s) + 1e-3
        memory = abs((after.peak_rss_bytes or 0) - (before.peak_rss_bytes or 0)) / 2**40
        steps = abs(after.steps - before.steps) / 1e9
        return abs(self.time_change_s) + abs(after.silent_s - before.silent_s) / 10 + memory + steps


@dataclass(slots=True)
class BuildDiff:
    baseline: Figures
    candidate: Figures
    provenance: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    phases: list[PhaseChange] = field(default_factory=list)

    @property
    def change_ratio(self) -> float:
        """The candidate's time over the baseline's, less one (+0.23: 23% slower)."""
        if self.baseline.duration_s <= 0:
            return 0.0
        return self.candidate.duration_s / self.baseline.duration_s - 1

    def slower_than(self, percent: float) -> bool:
        return self.change_ratio * 100 > percent

    def verdict(self) -> str:
        before, after = self.baseline, self.candidate
        times = f"{seconds_text(before.duration_s)} -> {seconds_text(after.duration_s)}"
        ratio = self.change_ratio
        if abs(ratio) <= SAME_WITHIN:
            said = f"about the same time ({ratio:+.0%}, {times})"
        elif ratio > 0:
            said = f"slower by {ratio:.0%} ({times})"
        else:
            said = f"faster by {-ratio:.0%} ({times})"
        if before.outcome != after.outcome:
            said += f"; outcome {before.outcome} -> {after.outcome}"
        # Where the time went: the phase whose own time (not its children's) changed most.
        top = max(self.phases, key=lambda c: abs(c.self_change_s), default=None)
        if top is not None and abs(ratio) > SAME_WITHIN and abs(top.self_change_s) >= 0.05:
            said += f"; most in {top.path[-1]} ({top.self_change_s:+.1f}s of its own)"
        return said


def diff(baseline: Figures, candidate: Figures) -> BuildDiff:
    result = BuildDiff(baseline, candidate)
    result.provenance = _provenance(baseline.attributes, candidate.attributes)
    paths = list(dict.fromkeys([*baseline.phases, *candidate.phases]))
    changes = [
        PhaseChange(path, baseline.phases.get(path), candidate.phases.get(path)) for path in paths
    ]
    result.phases = sorted(changes, key=lambda change: -change.weight)
    return result


def _provenance(
    before: dict[str, str], after: dict[str, str]
) -> list[tuple[str, str | None, str | None]]:
    keys = [
        k
        for k in dict.fromkeys([*before, *after])
        if k not in NOT_COMPARED and not k.startswith(FORECAST)
    ]
    differing = [k for k in keys if before.get(k) != after.get(k)]
    first = [k for k in FINGERPRINT_FIRST if k in differing]
    options = sorted(k for k in differing if k.startswith("trt.options.") and k not in first)
    rest = sorted(k for k in differing if k not in first and k not in options)
    return [(k, before.get(k), after.get(k)) for k in [*first, *options, *rest]]


def render_diff(result: BuildDiff) -> str:
    """The diff as plain text: the builds, what differs in their record, the phases, the
    verdict (last, so a CI log's last line says it)."""
    before, after = result.baseline, result.candidate
    lines = [
        f"baseline:  {before.label}: {before.outcome} in {seconds_text(before.duration_s)}",
        f"candidate: {after.label}: {after.outcome} in {seconds_text(after.duration_s)}",
        "",
    ]
    if result.provenance:
        lines.append("what differs in the record:")
        lines += [f"  {attribute_change(*change)}" for change in result.provenance]
    else:
        lines.append("the records do not differ")
    lines += ["", *_phase_table(result), ""]
    lines.append(f"verdict: {result.verdict()}")
    return "\n".join(lines) + "\n"


def _phase_table(result: BuildDiff) -> list[str]:
    rows = [("phase", "time", "change", "steps", "silent", "peak memory")]
    for change in result.phases[:SHOWN_PHASES]:
        before, after = change.before, change.after
        name = "  " * (len(change.path) - 1) + change.path[-1]
        rows.append(
            (
                name if len(name) <= 48 else name[:47] + "…",
                _pair(before, after, lambda f: seconds_text(f.total_s)),
                f"{change.time_change_s:+.2f}s",
                _pair(before, after, lambda f: f"{f.steps:,.0f}"),
                _pair(before, after, lambda f: seconds_text(f.silent_s)),
                _pair(before, after, _peak),
            )
        )
    hidden = len(result.phases) - SHOWN_PHASES
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = ["phases, the largest changes first:"]
    out += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            for row in rows]  # fmt: skip
    if hidden > 0:
        out.append(f"  ... and {hidden} phases with smaller changes")
    return [line.rstrip() for line in out]


def _peak(figures: PhaseFigures) -> str:
    return "-" if figures.peak_rss_bytes is None else format_bytes(figures.peak_rss_bytes)


def _pair(
    before: PhaseFigures | None, after: PhaseFigures | None, show: Callable[[PhaseFigures], str]
) -> str:
    left = "absent" if before is None else show(before)
    right = "absent" if after is None else show(after)
    return left if left == right else f"{left} -> {right}"
