"""What a build is expected to take before it starts, from earlier builds (``--history``'s
journals and the engine store's records): shown as it starts, kept in its journal, and held
against what it took once it ends.

- **the same build** (the earlier builds :func:`~trt_otel.core.eta.same_build` matches: the same
  fingerprint, else the same model): the median and the 90th percentile of their durations, and
  the highest peak of their builder's memory where it was sampled;
- **a build never made before**: the nearest earlier builds of the same backend, those of a model
  of the same file name first (an edited model), else the closest in size, their durations
  scaled to this model's size (``model.bytes``): along the line through them where they differ
  in size, in proportion where they do not. A peak is not scaled: at the sizes measured, the
  builder's libraries, not the model, make most of it (benchmarks/forecast.py).

A forecast is advice for people and for the memory guard's first word; a deadline decides by
its projection (:mod:`trt_otel.core.projection`), which rests on the build's own progress too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trt_otel.core.durations import format_duration
from trt_otel.core.eta import History, PastBuild, model_file_name, model_size
from trt_otel.core.events import Outcome
from trt_otel.core.sizes import format_bytes
from trt_otel.core.state import BuildState

NEAREST = 3
"""How many of the nearest other builds a forecast of a new build scales."""
PREFIX = "trt.forecast."
"""The attributes of a forecast in a build's record (``build_start``), none of which decides the
engine or is compared by ``diff``."""
EXPECTED = PREFIX + "duration_s"
P90 = PREFIX + "p90_s"
PEAK = PREFIX + "peak_rss_bytes"
BUILDS = PREFIX + "builds"
BASIS = PREFIX + "basis"


@dataclass(frozen=True, slots=True)
class Forecast:
    expected_s: float
    """The median of what the builds it rests on took (scaled, for a new build)."""
    p90_s: float
    builds: int
    basis: str
    """``history`` (earlier builds of this build) or ``scaled`` (of other models, by size)."""
    peak_rss_bytes: int | None = None

    def describe(self) -> str:
        """``expected 1m12s (p90 1m31s), peak 2.1 GiB, from 5 builds``."""
        said = f"expected {format_duration(self.expected_s)}"
        if format_duration(self.p90_s) != format_duration(self.expected_s):
            said += f" (p90 {format_duration(self.p90_s)})"
        if self.peak_rss_bytes is not None:
            said += f", peak {format_bytes(self.peak_rss_bytes)}"
        said += f", from {self.builds} build{'s' if self.builds != 1 else ''}"
        if self.basis == "scaled":
            said += " of other models, scaled by size"
        return said

    def attributes(self) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            EXPECTED: round(self.expected_s, 3),
            P90: round(self.p90_s, 3),
            BUILDS: self.builds,
            BASIS: self.basis,
        }
        if self.peak_rss_bytes is not None:
            attributes[PEAK] = self.peak_rss_bytes
        return attributes

    def document(self, took_s: float | None = None) -> dict[str, Any]:
        """As JSON (MCP's ``build_status``): with ``error`` once the build took ``took_s``."""
        return {
            "expected_s": self.expected_s,
            "p90_s": self.p90_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "builds": self.builds,
            "basis": self.basis,
            "said": self.describe(),
            "error": None if took_s is None else round(self.error(took_s), 4),
        }

    @classmethod
    def of(cls, attributes: Mapping[str, Any]) -> Forecast | None:
        """The forecast a build's record holds (its ``build_start``'s attributes), if any: data
        from a journal, so checked for what it is."""
        expected, p90 = attributes.get(EXPECTED), attributes.get(P90)
        builds, basis, peak = attributes.get(BUILDS), attributes.get(BASIS), attributes.get(PEAK)
        if not (_seconds(expected) and _seconds(p90) and isinstance(builds, int) and builds > 0):
            return None
        assert isinstance(expected, int | float) and isinstance(p90, int | float)
        return cls(
            float(expected),
            float(p90),
            builds,
            basis if basis in ("history", "scaled") else "history",
            peak if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0 else None,
        )

    def error(self, took_s: float) -> float:
        """How far off it was: (took - expected) / expected (+0.25: it took 25% longer)."""
        return (took_s - self.expected_s) / self.expected_s

    def judged(self, took_s: float) -> str:
        """``took 1m20s against 1m12s expected (+11%)``."""
        percent = round(self.error(took_s) * 100)  # never "-0%"
        return (
            f"took {format_duration(took_s)} against {format_duration(self.expected_s)} "
            f"expected ({percent:+d}%)"
        )


def forecast(
    history: History | None,
    attributes: Mapping[str, Any],
    *,
    stored: tuple[Sequence[PastBuild], Sequence[PastBuild]] = ((), ()),
) -> Forecast | None:
    """The forecast of the build whose ``build_start`` attributes are ``attributes``, from
    ``history`` and the engine store's records (``stored``: the builds of this build's key,
    and one of each other key); None where they hold nothing to go by."""
    same_stored, other_stored = stored
    same = [*(history.builds if history is not None else ()), *same_stored]
    if same:
        return _from(same, [build.total_s for build in same], "history")
    size = model_size(attributes)
    if size is None:
        return None
    backend = str(attributes.get("trt.backend", ""))
    others = [*(history.others if history is not None else ()), *other_stored]
    nearest = nearest_builds(others, size, backend, model_file_name(attributes))
    if not nearest:
        return None
    return _from(nearest, scale_to(nearest, size), "scaled")


def _from(builds: Sequence[PastBuild], durations: Sequence[float], basis: str) -> Forecast:
    """The forecast that ``builds`` make, their ``durations`` as this build's."""
    peaks = [b.peak_rss_bytes for b in builds if b.peak_rss_bytes is not None]
    return Forecast(
        statistics.median(durations),
        percentile(durations, 0.9),
        len(builds),
        basis,
        max(peaks) if peaks else None,
    )


def nearest_builds(
    others: Sequence[PastBuild], size: int, backend: str, name: str
) -> list[PastBuild]:
    """The :data:`NEAREST` builds of ``backend`` closest in size to ``size``, among those of a
    model named ``name`` where there are any (an edited model is the best guide to itself)."""
    sized = [b for b in others if b.model_bytes is not None and b.backend == backend]
    same_name = [b for b in sized if name and b.model_name == name]
    pool = same_name or sized

    def distance(build: PastBuild) -> float:
        assert build.model_bytes is not None
        return abs(math.log(build.model_bytes / size))

    return sorted(pool, key=distance)[:NEAREST]


def scale_to(builds: Sequence[PastBuild], size: int) -> list[float]:
    """Each build's duration carried to a model of ``size`` bytes: along the least-squares
    line through the builds (duration against size) where they differ in size and it rises,
    else in proportion to size. Never below zero."""
    sizes = [float(b.model_bytes or 0) for b in builds]
    totals = [b.total_s for b in builds]
    mean_size, mean_total = statistics.fmean(sizes), statistics.fmean(totals)
    spread = sum((s - mean_size) ** 2 for s in sizes)
    slope = (
        sum((s - mean_size) * (t - mean_total) for s, t in zip(sizes, totals, strict=True)) / spread
        if spread > 0
        else 0.0
    )
    if slope > 0:
        # Each build keeps its own distance from the line: the spread of the forecast is theirs.
        return [max(0.0, t + slope * (size - s)) for s, t in zip(sizes, totals, strict=True)]
    return [t * size / s for s, t in zip(sizes, totals, strict=True)]


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` percentile of ``values``, by linear interpolation between the closest
    ranks (as ``statistics.quantiles``' inclusive method)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = share * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def forecast_status(state: BuildState) -> dict[str, Any] | None:
    """The forecast of ``state``'s build as a status document has it (fleet and MCP): None
    without one; with its error once the build succeeded."""
    forecast = Forecast.of(state.attributes)
    if forecast is None:
        return None
    took_s = None
    if state.outcome is Outcome.SUCCESS and state.end_mono_ns is not None:
        assert state.start_mono_ns is not None
        took_s = (state.end_mono_ns - state.start_mono_ns) / 1e9
    return forecast.document(took_s)
