"""A forecast before the build (``--history``): the median, the p90 and the peak of the same
build's earlier runs; for a build never made, the nearest builds scaled by the model's size; kept
in the build's record and held against what the build took, in its last lines and its report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cli import run_cli, run_demo
from trt_otel import read_journal
from trt_otel.app.engine_store import StoreVisit, stored_builds
from trt_otel.builder.store import EngineStore, store_key
from trt_otel.core.eta import History, PastBuild
from trt_otel.core.events import BuildStarted
from trt_otel.core.forecast import (
    BASIS,
    BUILDS,
    EXPECTED,
    P90,
    PEAK,
    Forecast,
    forecast,
    nearest_builds,
    percentile,
    scale_to,
)

MIB = 1 << 20


def past(
    total_s: float,
    *,
    size: int | None = None,
    name: str = "model.onnx",
    backend: str = "tensorrt-rtx",
    peak: int | None = None,
) -> PastBuild:
    return PastBuild(f"{total_s}.jsonl", total_s, {}, peak, size, name, backend)


def test_a_build_made_before_is_forecast_from_its_runs() -> None:
    history = History([past(60, peak=900 * MIB), past(70), past(100, peak=1200 * MIB)])
    ahead = forecast(history, {})
    assert ahead == Forecast(70.0, percentile([60, 70, 100], 0.9), 3, "history", 1200 * MIB)
    assert ahead.p90_s == pytest.approx(94.0)  # between the second and the slowest, near it
    assert ahead.describe() == "expected 1m10s (p90 1m34s), peak 1.2 GiB, from 3 builds"


def test_no_history_or_nothing_to_scale_is_no_forecast() -> None:
    assert forecast(None, {"model.bytes": 10}) is None
    assert forecast(History([]), {"model.bytes": 10}) is None
    others = History([], others=[past(30, size=1000)])
    assert forecast(others, {}) is None, "a model of no known size is not scaled"
    assert forecast(others, {"model.bytes": 1000, "trt.backend": "tensorrt"}) is None


def test_a_new_build_is_scaled_from_the_nearest_of_its_backend_its_own_name_first() -> None:
    edited = [past(20, size=2000, name="net.onnx"), past(40, size=4000, name="net.onnx")]
    others = [
        past(11, size=1100, name="other.onnx"),
        past(12, size=1200, name="other.onnx"),
        past(9, size=1000, name="other.onnx", backend="tensorrt"),
        *edited,
    ]
    assert nearest_builds(others, 1000, "tensorrt-rtx", "net.onnx") == edited
    nearest = nearest_builds(others, 1000, "tensorrt-rtx", "new.onnx")
    assert [b.total_s for b in nearest] == [11, 12, 20], "the closest in size, of this backend"
    ahead = forecast(
        History([], others=others),
        {"model.bytes": 3000, "model.path": "/models/net.onnx", "trt.backend": "tensorrt-rtx"},
    )
    assert ahead is not None
    assert ahead.basis == "scaled" and ahead.builds == 2
    assert ahead.expected_s == pytest.approx(30.0), "on the line through its two sizes"
    assert ahead.describe().endswith("from 2 builds of other models, scaled by size")


def test_scaling_follows_the_line_where_sizes_differ_and_proportion_where_they_do_not() -> None:
    # 5 s of fixed cost and 10 s a kilobyte, each build 1 s off the line.
    line = [past(16, size=1000), past(24, size=2000), past(36, size=3000)]
    assert scale_to(line, 4000) == pytest.approx([46.0, 44.0, 46.0])
    assert scale_to([past(10, size=1000), past(30, size=1000)], 3000) == pytest.approx([30, 90])
    falling = [past(30, size=1000), past(10, size=2000)]  # a slope below zero says nothing
    assert scale_to(falling, 4000) == pytest.approx([120.0, 20.0])
    assert min(scale_to(line, 1)) >= 0.0


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([5.0], 0.9) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 0.9) == 10.0
    assert percentile([10.0, 0.0], 0.5) == 5.0


def test_a_forecast_read_from_a_record_is_checked() -> None:
    ahead = Forecast(72.0, 91.0, 5, "scaled", 2 << 30)
    assert Forecast.of(ahead.attributes()) == ahead
    for bad in (
        {EXPECTED: "72"},
        {EXPECTED: math.nan},
        {EXPECTED: -1.0},
        {EXPECTED: True},
        {P90: 0},
        {BUILDS: 0},
        {BUILDS: "5"},
    ):
        assert Forecast.of({**ahead.attributes(), **bad}) is None, bad
    odd = Forecast.of({**ahead.attributes(), BASIS: "\x1b[31m", PEAK: -5})
    assert odd == Forecast(72.0, 91.0, 5, "history", None)


def test_its_error_is_signed_and_never_minus_zero() -> None:
    ahead = Forecast(72.0, 91.0, 5, "history")
    assert ahead.error(90.0) == pytest.approx(0.25)
    assert ahead.judged(80.0) == "took 1m20s against 1m12s expected (+11%)"
    assert ahead.judged(71.8).endswith("(+0%)")
    assert ahead.judged(54.0).endswith("(-25%)")


@pytest.mark.e2e
def test_a_build_with_history_is_forecast_and_judged_and_its_report_says_so(
    tmp_path: Path,
) -> None:
    history = tmp_path / "history"
    history.mkdir()
    first = run_demo("--speed", "0", "--no-gpu", "--journal", history / "1.jsonl")
    assert first.returncode == 0, first.stderr
    assert "forecast" not in first.stderr, "nothing to go by yet"
    journal = tmp_path / "2.jsonl"
    second = run_demo("--speed", "0", "--no-gpu", "--journal", journal, "--history", history)
    assert second.returncode == 0, second.stderr
    lines = [line for line in second.stderr.splitlines() if "forecast:" in line]
    assert len(lines) == 2, second.stderr
    assert "expected" in lines[0] and lines[0].endswith("from 1 build")
    assert " against " in lines[1] and lines[1].endswith("%)")
    (start,) = [e for e in read_journal(journal).events if isinstance(e, BuildStarted)]
    recorded = Forecast.of(start.attributes)
    assert recorded is not None and recorded.builds == 1 and recorded.basis == "history"
    report = run_cli("report", journal, "--format", "markdown")
    assert report.returncode == 0, report.stderr
    assert "forecast: took " in report.stdout
    diffed = run_cli("diff", history / "1.jsonl", journal)
    assert diffed.returncode == 0, diffed.stderr
    assert "trt.forecast" not in diffed.stdout, "what was expected is no difference"


def test_the_engine_stores_records_are_a_source_beside_the_history() -> None:
    stored_same = [past(50, peak=2 * MIB), past(70)]
    ahead = forecast(None, {}, stored=(stored_same, []))
    assert ahead is not None and (ahead.expected_s, ahead.builds) == (60.0, 2)
    merged = forecast(History([past(90)]), {}, stored=(stored_same, []))
    assert merged is not None and (merged.expected_s, merged.builds) == (70.0, 3)
    new = {"model.bytes": 2000, "model.path": "net.onnx", "trt.backend": "tensorrt-rtx"}
    scaled = forecast(None, new, stored=([], [past(10, size=1000, name="net.onnx")]))
    assert scaled is not None and (scaled.basis, scaled.expected_s) == ("scaled", 20.0)


def test_a_stores_records_become_earlier_builds_checked(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    engine = tmp_path / "built.engine"
    engine.write_bytes(b"engine")
    attributes = {"model.sha256": "a" * 64, "model.path": "/m/net.onnx", "model.bytes": 1000,
                  "trt.backend": "tensorrt-rtx", "trt.version": "1.7.1"}  # fmt: skip
    key = store_key(attributes)
    store.put(key, attributes, engine, build_s=12.0, build_id="b1", peak_rss_bytes=3 * MIB)
    store.put(key, attributes, engine, build_s=14.0, build_id="b2", peak_rss_bytes=2 * MIB)
    other = {**attributes, "trt.options.fp16": "true"}
    for n, build_s in enumerate((30.0, 100.0, 20.0)):  # one engine, built three times
        store.put(store_key(other), other, engine, build_s=build_s, build_id=f"b{3 + n}")
    same, others = stored_builds(StoreVisit(store, key, None))
    assert [(b.total_s, b.peak_rss_bytes, b.model_bytes) for b in same] == [
        (12.0, 3 * MIB, 1000),
        (14.0, 3 * MIB, 1000),  # the highest peak of the builds that made it is kept
    ]
    assert [(b.total_s, b.model_name, b.backend, b.peak_rss_bytes) for b in others] == [
        # The median of the builds that made it; no peak recorded: unknown, not 0 bytes.
        (30.0, "net.onnx", "tensorrt-rtx", None)
    ]
    assert stored_builds(None) == ([], [])


def test_a_stored_build_that_took_no_time_is_no_earlier_build_to_forecast_from(
    tmp_path: Path,
) -> None:
    store = EngineStore(tmp_path / "store")
    engine = tmp_path / "built.engine"
    engine.write_bytes(b"engine")
    attributes = {"model.sha256": "a" * 64, "trt.backend": "tensorrt-rtx"}
    key = store_key(attributes)
    store.put(key, attributes, engine, build_s=0.0004, build_id="b1")  # kept as 0.0 s
    other = {**attributes, "trt.options.fp16": "true"}
    store.put(store_key(other), other, engine, build_s=0.0, build_id="b2")
    assert [entry.record.build_s for entry in store.entries()] == [[0.0], [0.0]]
    assert stored_builds(StoreVisit(store, key, None)) == ([], [])


def test_the_nearest_builds_are_nearest_in_proportion_not_in_bytes() -> None:
    # Against 1000 bytes: 450 is 550 bytes away but 2.2 times smaller; 2100 is 1100 bytes away
    # but only 2.1 times larger. A builder's time follows the model's scale, not its difference.
    others = [past(9, size=450), past(36, size=2100), past(32, size=1900), past(30, size=1800)]
    nearest = nearest_builds(others, 1000, "tensorrt-rtx", "")
    assert [b.model_bytes for b in nearest] == [1800, 1900, 2100]
