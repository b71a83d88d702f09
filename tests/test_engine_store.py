"""The engine store (``--engine-store``): a build whose key is stored is served, byte for byte, and
recorded as a build of its own; one that is not says why; damaged entries are found by their
digest and built again; two builds of one key build once; a store that cannot be used never
fails a build. Real files, real locks, real processes, and TensorRT-RTX's real builder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import CLI, run_cli, start_cli
from nvml_standin import fake_nvml
from rtx_builds import import_rtx, write_conv, write_residual
from trt_otel import JournalWriter, read_journal
from trt_otel.app.config import StoreConfig
from trt_otel.app.engine_store import (
    MAX_REASON_CHARS,
    StoreStatus,
    StoreVisit,
    engines_summary,
    store_status,
    visit_store,
)
from trt_otel.app.fleet import Fleet
from trt_otel.app.store_command import StoreCommand, run_store
from trt_otel.builder.build import BuildJob, BuildResult
from trt_otel.builder.onnx_models import CONV_SHAPES, RESIDUAL_SHAPES
from trt_otel.builder.options import BuildOptions
from trt_otel.builder.store import (
    NO_ENGINE_YET,
    EngineStore,
    Entry,
    key_inputs,
    miss_reason,
    store_key,
)
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.events import (
    BuildFinished,
    BuildOutput,
    BuildStarted,
    Outcome,
    PhaseStarted,
)
from trt_otel.core.forecast import Forecast
from trt_otel.views.prometheus import BuildSample, MetricSources, build_metrics, sample_build
from waiting import wait_for_text

BASE: dict[str, Any] = {
    "model.path": "/models/resnet.onnx",
    "model.sha256": "3f9a" + "0" * 60,
    "trt.backend": "tensorrt-rtx",
    "trt.version": "1.7.1.116",
    "trt.options.optimization_level": 3,
    "trt.options.timing_cache": "/caches/a.cache",
    "host.name": "builder-1",
}


def attributes(**changed: Any) -> dict[str, Any]:
    merged = {**BASE, **changed}
    return {key: value for key, value in merged.items() if value is not None}


# -- the key ----------------------------------------------------------------------------------


def test_the_key_covers_what_decides_the_engine_and_nothing_else() -> None:
    key = store_key(BASE)
    assert len(key) == 64
    assert store_key(attributes(**{"host.name": "builder-2"})) == key
    assert store_key(attributes(**{"trt.options.timing_cache": "/other.cache"})) == key
    for changed in (
        {"model.sha256": "8c1e" + "0" * 60},
        {"trt.version": "1.7.2.4"},
        {"trt.backend": "tensorrt"},
        {"trt.options.optimization_level": 1},
        {"trt.options.workspace": "1G"},
        {"gpu.compute_capability": "9.0"},
    ):
        assert store_key(attributes(**changed)) != key, changed


def test_a_tensorrt_engine_is_keyed_to_its_gpu_model() -> None:
    h200 = attributes(**{"trt.backend": "tensorrt", "gpu.name": "NVIDIA H200"})
    h100 = attributes(**{"trt.backend": "tensorrt", "gpu.name": "NVIDIA H100"})
    assert store_key(h200) != store_key(h100)
    rtx = [attributes(**{"gpu.name": name}) for name in ("NVIDIA H200", "NVIDIA H100")]
    assert store_key(rtx[0]) == store_key(rtx[1]), "TensorRT-RTX engines are not per model"
    assert "gpu.name" in key_inputs(h200) and "gpu.name" not in key_inputs(rtx[0])


def test_a_tensorrt_build_whose_record_has_no_gpu_is_keyed_to_the_gpu_nvml_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--no-gpu`` leaves the GPU out of the build's record; the store asks NVML for it once,
    so that an engine built on one GPU model is never served on another."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    recorded = attributes(**{"trt.backend": "tensorrt"})
    job = BuildJob(model_path=tmp_path / "m.onnx", engine_path=tmp_path / "out.engine")
    with contextlib.ExitStack() as stack:
        visit = visit_store(stack, StoreConfig(tmp_path / "store"), job, recorded)
    assert visit is not None
    assert (recorded["gpu.name"], recorded["gpu.compute_capability"]) == ("NVIDIA H200", "9.0")
    h200 = attributes(**{"trt.backend": "tensorrt", "gpu.name": "NVIDIA H200",
                         "gpu.compute_capability": "9.0"})  # fmt: skip
    assert visit.key == store_key(h200)
    named_only = attributes(**{"trt.backend": "tensorrt", "gpu.name": "NVIDIA H200"})
    with contextlib.ExitStack() as stack:
        visit_store(stack, StoreConfig(tmp_path / "store"), job, named_only)
    assert named_only["gpu.compute_capability"] == "9.0", "the architecture is asked for too"


def test_a_tensorrt_build_whose_gpu_cannot_be_named_does_not_use_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without NVML the key could not tell one GPU model from another: the build goes on without
    the store (said once), serving nothing and storing nothing. TensorRT-RTX's engines are not
    per GPU model: its builds use the store all the same."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    store = tmp_path / "store"
    stored(EngineStore(store), tmp_path, attributes(**{"trt.backend": "tensorrt"}), b"engine")
    output = tmp_path / "out.engine"
    job = BuildJob(model_path=tmp_path / "m.onnx", engine_path=output)
    recorded = attributes(**{"trt.backend": "tensorrt"})
    with contextlib.ExitStack() as stack:
        assert visit_store(stack, StoreConfig(store), job, recorded) is None
    said = capsys.readouterr().err
    assert "store: not used: a TensorRT engine runs only on the GPU model it was built for" in said
    assert "nvidia-ml-py is not installed" in said
    assert not output.exists(), "nothing served"
    assert "trt.store.key" not in recorded
    rtx = attributes()
    with contextlib.ExitStack() as stack:
        assert visit_store(stack, StoreConfig(store), job, rtx) is not None


# -- one entry ----------------------------------------------------------------------------------


def stored(store: EngineStore, tmp_path: Path, given: dict[str, Any], data: bytes) -> Entry:
    engine = tmp_path / "built.engine"
    engine.write_bytes(data)
    return store.put(store_key(given), given, engine, build_s=42.0, build_id="b1")


def test_an_engine_stored_is_served_byte_for_byte(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    stored(store, tmp_path, BASE, b"an engine")
    entry = store.lookup(store_key(BASE), warn=pytest.fail)
    assert entry is not None and entry.record.saves_s == 42.0
    output = tmp_path / "out.engine"
    assert store.serve(entry, output, warn=pytest.fail) == b"an engine"
    assert output.read_bytes() == b"an engine"
    assert store.lookup(store_key(attributes(**{"trt.version": "1.7.2"})), warn=pytest.fail) is None


def test_what_a_hit_saves_is_the_median_of_the_builds_that_made_it(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    engine = tmp_path / "e"
    engine.write_bytes(b"x")
    for seconds in (10.0, 50.0, 20.0):
        store.put(store_key(BASE), BASE, engine, build_s=seconds, build_id="b")
    entry = store.lookup(store_key(BASE), warn=pytest.fail)
    assert entry is not None and entry.record.build_s == [10.0, 50.0, 20.0]
    assert entry.record.saves_s == 20.0


def test_a_corrupt_engine_is_found_by_its_digest_removed_and_not_served(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    entry = stored(store, tmp_path, BASE, b"an engine")
    entry.engine.write_bytes(b"an engin3")  # same size, other bytes
    warnings: list[str] = []
    assert store.serve(entry, tmp_path / "out.engine", warn=warnings.append) is None
    assert not (tmp_path / "out.engine").exists()
    assert "does not match its SHA-256" in warnings[0]
    assert store.lookup(store_key(BASE), warn=warnings.append) is None
    assert store.verify() == []  # removed, so nothing is left to be wrong


@pytest.mark.parametrize(
    "damage",
    ["truncated", "not json", "a list", "huge", "another key", "a link", "no engine"],
)
def test_a_damaged_entry_is_reported_removed_and_built_again(tmp_path: Path, damage: str) -> None:
    store = EngineStore(tmp_path / "store")
    entry = stored(store, tmp_path, BASE, b"an engine")
    record = entry.folder / "record.json"
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(record.read_bytes())
    if damage == "truncated":
        entry.engine.write_bytes(b"an en")
    elif damage == "not json":
        record.write_bytes(b"\x00\xff{")
    elif damage == "a list":
        record.write_text("[]")
    elif damage == "huge":
        record.write_text(json.dumps({"key": "k" * 300_000}))
    elif damage == "another key":
        record.write_text(record.read_text().replace(store_key(BASE), "0" * 64))
    elif damage == "a link":
        record.unlink()
        record.symlink_to(elsewhere)
    else:
        entry.engine.unlink()
    assert store.verify() != []
    warnings: list[str] = []
    assert store.lookup(store_key(BASE), warn=warnings.append) is None
    assert len(warnings) == 1 and "is damaged" in warnings[0]
    assert not entry.folder.exists()
    assert elsewhere.exists(), "a link is removed, never what it points at"


def test_the_least_recently_used_entries_go_first(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    entries = [
        stored(store, tmp_path, attributes(**{"trt.options.optimization_level": level}), b"x" * 100)
        for level in (1, 2, 3)
    ]
    for age, entry in zip((300, 100, 200), entries, strict=True):
        os.utime(entry.folder, (entry.record.created - age, entry.record.created - age))
    removed = store.prune(150)
    assert [e.record.key for e in removed] == [entries[0].record.key, entries[2].record.key]
    assert [e.record.key for e in store.entries()] == [entries[1].record.key]


def test_a_bound_on_the_store_never_evicts_what_was_just_stored(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store", max_bytes=50)
    first = stored(store, tmp_path, BASE, b"x" * 100)
    assert [e.record.key for e in store.entries()] == [first.record.key]
    second = stored(store, tmp_path, attributes(**{"trt.version": "1.7.2"}), b"y" * 100)
    assert [e.record.key for e in store.entries()] == [second.record.key]


# -- why it rebuilt ---------------------------------------------------------------------------


def test_a_miss_says_what_differs_most_decisive_first(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    stored(store, tmp_path, BASE, b"e")
    newer = attributes(**{"trt.version": "1.7.2.4", "trt.options.builder_optimization_level": 1})
    reason = miss_reason(store.nearest(newer), newer)
    assert reason == "tensorrt-rtx 1.7.1.116 -> 1.7.2.4; options: +builder_optimization_level 1"
    changed = attributes(**{"model.sha256": "8c1e" + "0" * 60})
    assert miss_reason(store.nearest(changed), changed) == (
        "the model changed (sha256 3f9a0000.. -> 8c1e0000..)"
    )
    other = attributes(**{"model.path": "/models/bert.onnx", "model.sha256": "ab" * 32})
    assert miss_reason(store.nearest(other), other) == "no engine of this model in the store yet"


# -- two builds of one key --------------------------------------------------------------------


def test_a_second_build_of_a_key_waits_for_the_first_and_says_for_whom(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    key = store_key(BASE)
    said: list[str] = []
    waiting, done = threading.Event(), threading.Event()

    def second() -> None:
        def say(message: str) -> None:
            said.append(message)
            waiting.set()

        with store.building(key, holder="the second", say=say):
            done.set()

    with store.building(key, holder="pid 1 on builder-1", say=pytest.fail):
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(30)
        assert not done.is_set(), "the second build went on while the first held its key"
    thread.join(30)
    assert done.is_set()
    assert said == ["store: waiting for pid 1 on builder-1, which builds this engine"]


# -- the metrics ---------------------------------------------------------------------------------


def metric_values(**store: Any) -> dict[str, float]:
    sample = BuildSample(
        state="success", progress_ratio=1.0, start_s=None, end_s=None, last_progress_s=None,
        steps_total=0, phases_started_total=0, phases=(), cancel_reason=None, anomalies={},
        events_total=0, callbacks_total=0, callback_s_total=0.0, internal_errors=0,
        fold_errors=0, followers=(), info={}, **store,
    )  # fmt: skip
    return {
        s.name: s.value
        for family in build_metrics(sample)
        for s in family.samples
        if s.name.startswith("trt_engine_store")
    }


def test_the_store_counts_what_it_served_and_what_that_saved() -> None:
    assert metric_values() == {}
    assert metric_values(store_hit=True, store_saved_s=42.0) == {
        "trt_engine_store_hits_total": 1,
        "trt_engine_store_misses_total": 0,
        "trt_engine_store_saved_seconds_total": 42.0,
    }
    assert metric_values(store_hit=False)["trt_engine_store_misses_total"] == 1


# -- the command, end to end -------------------------------------------------------------------


def started(journal: Path) -> BuildStarted:
    (start,) = [e for e in read_journal(journal).events if isinstance(e, BuildStarted)]
    return start


def duration_s(journal: Path) -> float:
    """What the journal's build took, from its start to its end."""
    (end,) = [e for e in read_journal(journal).events if isinstance(e, BuildFinished)]
    return (end.mono_ns - started(journal).mono_ns) / 1e9


@pytest.mark.e2e
def test_a_real_engine_is_served_again_and_a_changed_option_or_model_or_a_damaged_entry_rebuilt(
    tmp_path: Path,
) -> None:
    import_rtx()
    model = write_conv(tmp_path / "conv.onnx")
    store = tmp_path / "store"

    def build(engine: str, journal: str, *options: str) -> tuple[str, Path]:
        result = run_cli(
            "build", model, "-o", tmp_path / engine, "--shapes", CONV_SHAPES, "--no-progress",
            "--engine-store", store, "--journal", tmp_path / journal, *options,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stderr, tmp_path / journal

    said, first = build("first.engine", "first.jsonl")
    assert "store: no engine of this model in the store yet: building" in said
    assert started(first).attributes["trt.store.hit"] is False
    assert "forecast:" not in said, "nothing to go by yet"

    said, second = build("second.engine", "second.jsonl")
    assert "store: served" in said
    assert (tmp_path / "second.engine").read_bytes() == (tmp_path / "first.engine").read_bytes()
    events = read_journal(second).events
    attributes = started(second).attributes
    assert attributes["trt.store.hit"] is True and attributes["trt.store.saved_s"] > 0
    assert not [e for e in events if isinstance(e, PhaseStarted)], "nothing was built"
    (output,) = [e for e in events if isinstance(e, BuildOutput)]
    (built,) = [e for e in read_journal(first).events if isinstance(e, BuildOutput)]
    assert output.attributes["engine.sha256"] == built.attributes["engine.sha256"]
    assert (events[-1].mono_ns - events[0].mono_ns) / 1e9 < 1.0

    said, third = build("third.engine", "third.jsonl", "--builder-optimization-level", "1")
    assert "rebuilding: options: +optimization_level 1" in said
    assert started(third).attributes["trt.store.miss_reason"] == "options: +optimization_level 1"
    # No --history: the store's record of the other options' engine is what it goes by.
    assert "scaled by size" in said and "from 1 build of other models" in said
    ahead = Forecast.of(started(third).attributes)
    assert ahead is not None and (ahead.basis, ahead.builds) == ("scaled", 1)
    assert ahead.expected_s == pytest.approx(duration_s(first), abs=0.01), "the same size"

    before = started(first).attributes["model.sha256"]
    write_conv(model, layers=10)  # the same file, now another model
    said, fourth = build("fourth.engine", "fourth.jsonl")
    after = started(fourth).attributes["model.sha256"]
    reason = f"the model changed (sha256 {before[:8]}.. -> {after[:8]}..)"
    assert f"rebuilding: {reason}" in said
    assert started(fourth).attributes["trt.store.miss_reason"] == reason

    # Its entry damaged: found by its digest, removed, and the real engine built again.
    key = started(fourth).attributes["trt.store.key"]
    stored_engine = store / "v1" / "entries" / key / "engine"
    stored_engine.write_bytes(b"!" + stored_engine.read_bytes()[1:])
    said, fifth = build("fifth.engine", "fifth.jsonl")
    assert "does not match its SHA-256" in said
    assert started(fifth).attributes["trt.store.hit"] is False
    assert [e for e in read_journal(fifth).events if isinstance(e, PhaseStarted)], "built"

    listing = run_cli("store", "ls", store)
    assert listing.returncode == 0 and listing.stdout.endswith("3 entries\n")
    assert run_cli("store", "verify", store).returncode == 0, "stored again, intact"


@pytest.mark.e2e
def test_a_corrupt_entry_is_rebuilt_and_a_store_that_cannot_be_used_fails_nothing(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    demo = ("demo", "--speed", "0", "--no-progress", "--engine-store", store)
    assert run_cli(*demo, "-o", tmp_path / "a.engine").returncode == 0
    (engine,) = store.glob("v1/entries/*/engine")
    two_hours_ago = time.time() - 7200  # an entry's last use is its folder's time
    os.utime(engine.parent, (two_hours_ago, two_hours_ago))
    listed = run_cli("store", "ls", store)
    assert "used 2h00m ago" in listed.stdout, listed.stdout
    (entry,) = json.loads(run_cli("store", "ls", store, "--json").stdout)["entries"]
    assert entry["last_used"] == pytest.approx(two_hours_ago, abs=0.01)
    engine.write_bytes(engine.read_bytes()[:-1] + b"!")
    checked = run_cli("store", "verify", store)
    assert checked.returncode == 4 and "does not match its SHA-256" in checked.stdout
    rebuilt = run_cli(*demo, "-o", tmp_path / "b.engine", "--journal", tmp_path / "b.jsonl")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "is damaged" in rebuilt.stderr or "corrupt" in rebuilt.stderr
    hit = started(tmp_path / "b.jsonl").attributes["trt.store.hit"]
    assert hit is False, "found, refused, built: no hit"
    assert (tmp_path / "b.engine").read_bytes() == (tmp_path / "a.engine").read_bytes()
    assert run_cli("store", "verify", store).returncode == 0, "stored again, intact"

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    built = run_cli("demo", "--speed", "0", "--engine-store", not_a_folder, "-o", tmp_path / "c")
    assert built.returncode == 0
    assert "store: not used: engine store" in built.stderr and "is not a folder" in built.stderr


@pytest.mark.e2e
def test_two_builds_of_one_key_at_once_build_once(tmp_path: Path) -> None:
    import_rtx()
    model = write_residual(tmp_path / "deep.onnx", blocks=300)
    store = tmp_path / "store"
    processes = []
    with contextlib.ExitStack() as stack:
        for name in ("a", "b"):
            process = start_cli(
                "build", model, "-o", tmp_path / f"{name}.engine", "--shapes", RESIDUAL_SHAPES,
                "--no-progress", "--engine-store", store, "--journal", tmp_path / f"{name}.jsonl",
            )  # fmt: skip
            stack.callback(_kill, process)
            processes.append(process)
            if name == "a":  # holds the key once its build has started
                wait_for_text(tmp_path / "a.jsonl", b'"build_start"')
        errors = [p.communicate(timeout=300)[1] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], errors
    assert "store: waiting for pid" in errors[1] and "which builds this engine" in errors[1]
    assert [started(tmp_path / f"{n}.jsonl").attributes["trt.store.hit"] for n in "ab"] == [
        False,
        True,
    ]
    assert (tmp_path / "a.engine").read_bytes() == (tmp_path / "b.engine").read_bytes()


@pytest.mark.e2e
@pytest.mark.parametrize(("stop", "code"), [(signal.SIGTERM, 3), (signal.SIGINT, 130)])
def test_a_build_stopped_while_it_waits_for_its_key_says_so_and_exits_as_stopped(
    tmp_path: Path, stop: signal.Signals, code: int
) -> None:
    """A build waiting for another process's build of the same engine, stopped (a scheduler's
    SIGTERM, Ctrl-C): nothing of it started, so it says so and exits as a stop does, instead
    of dying of the signal with nothing said."""
    store = tmp_path / "store"
    same = ("--no-progress", "--speed", "0", "--silence", "10m", "--engine-store", store)
    with contextlib.ExitStack() as stack:
        first = start_cli("demo", "-o", tmp_path / "a.engine", "--journal", tmp_path / "a.jsonl",
                          *same, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        stack.callback(_kill, first)
        wait_for_text(tmp_path / "a.jsonl", b'"build_start"')  # it holds the key
        said = tmp_path / "b.err"
        with said.open("w") as stderr:
            second = start_cli("demo", "-o", tmp_path / "b.engine", *same,
                               stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
        stack.callback(_kill, second)
        wait_for_text(said, b"store: waiting for pid")
        second.send_signal(stop)
        assert second.wait(60) == code, said.read_text()
    assert f"store: stopped ({stop.name if code == 3 else 'Ctrl-C'}) while waiting" in (
        said.read_text()
    )
    assert "Traceback" not in said.read_text()
    assert not (tmp_path / "b.engine").exists()


def _kill(process: Any) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture(autouse=True)
def no_store_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TRT_OTEL_ENGINE_STORE", raising=False)
    yield


# -- what the mutants that survived showed untested --------------------------------------------


def test_serving_an_entry_makes_it_the_last_to_be_evicted(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    older = stored(store, tmp_path, BASE, b"a" * 100)
    newer = stored(store, tmp_path, attributes(**{"trt.version": "1.7.2"}), b"b" * 100)
    os.utime(older.folder, (older.record.created - 300,) * 2)
    os.utime(newer.folder, (newer.record.created - 100,) * 2)
    assert store.serve(older, tmp_path / "out", warn=pytest.fail) is not None
    assert [e.record.key for e in store.prune(100)] == [newer.record.key]


def test_a_store_exactly_at_its_bound_keeps_everything(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    stored(store, tmp_path, BASE, b"a" * 100)
    stored(store, tmp_path, attributes(**{"trt.version": "1.7.2"}), b"b" * 100)
    assert store.prune(200) == []
    assert len(store.entries()) == 2


def test_a_stored_engine_refused_by_its_digest_is_no_hit_in_the_builds_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found, refused, built: the build's record says it was not served."""
    store = tmp_path / "store"
    entry = stored(EngineStore(store), tmp_path, BASE, b"an engine")
    entry.engine.write_bytes(b"an engin3")  # same size, other bytes
    output = tmp_path / "out.engine"
    job = BuildJob(model_path=tmp_path / "m.onnx", engine_path=output)
    recorded = dict(BASE)
    with contextlib.ExitStack() as stack:
        visit = visit_store(stack, StoreConfig(store), job, recorded)
    assert visit is not None and visit.served is None
    assert "does not match its SHA-256" in capsys.readouterr().err
    assert store_status(recorded) == StoreStatus(
        served=False, saved_s=None, miss_reason=NO_ENGINE_YET
    )
    assert not output.exists(), "nothing served"


def test_store_verify_exits_4_while_an_engine_is_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = EngineStore(tmp_path / "store")
    entry = stored(store, tmp_path, BASE, b"an engine")
    assert run_store(StoreCommand("verify", store.root)) == 0
    entry.engine.write_bytes(b"an engin3")
    assert run_store(StoreCommand("verify", store.root)) == 4
    said = capsys.readouterr().out
    assert "does not match its SHA-256" in said and said.endswith("1 of 1 entries damaged\n")


def test_store_ls_says_each_engines_model_backend_and_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an entry was built from and with, read from its record: two engines of one
    model differing by the library's version are told apart by the listing alone."""
    store = EngineStore(tmp_path / "store")
    stored(store, tmp_path, BASE, b"a" * 100)
    stored(store, tmp_path, attributes(**{"trt.version": "1.8.0.5"}), b"b" * 100)

    assert run_store(StoreCommand("ls", tmp_path / "store", json=True)) == 0
    listed = json.loads(capsys.readouterr().out)["entries"]
    assert sorted((e["model"], e["backend"], e["version"]) for e in listed) == [
        ("resnet.onnx", "tensorrt-rtx", "1.7.1.116"),
        ("resnet.onnx", "tensorrt-rtx", "1.8.0.5"),
    ]
    assert run_store(StoreCommand("ls", tmp_path / "store")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("resnet.onnx  tensorrt-rtx 1.8.0.5  100 B" in line for line in lines) == 1
    assert lines[-1] == "2 entries"


def test_an_entry_keeps_the_durations_of_its_latest_builds(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    engine = tmp_path / "e"
    engine.write_bytes(b"x")
    for seconds in range(1, 12):
        store.put(store_key(BASE), BASE, engine, build_s=float(seconds), build_id="b")
    entry = store.lookup(store_key(BASE), warn=pytest.fail)
    assert entry is not None and entry.record.build_s == [float(s) for s in range(2, 12)]


def test_the_nearest_build_is_the_one_that_differs_least(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    stored(
        store, tmp_path, attributes(**{"trt.version": "1.7.0", "trt.options.workspace": "1G"}), b"a"
    )
    stored(store, tmp_path, attributes(**{"trt.options.workspace": "1G"}), b"b")
    asked = attributes()
    assert miss_reason(store.nearest(asked), asked) == "options: -workspace 1G"


def ended_build(outcome: Outcome, seconds: float) -> BuildMonitor:
    """A build's record that began ``seconds`` ago and has just ended."""
    monitor = BuildMonitor(attributes=dict(BASE), backend="none")
    now = time.monotonic_ns()
    monitor.start_at(time.time_ns(), now - int(seconds * 1e9), "MainThread")
    monitor.end(outcome)
    return monitor


@pytest.mark.parametrize("outcome", [Outcome.FAILURE, Outcome.CANCELLATION, Outcome.TIMEOUT])
def test_a_build_that_did_not_succeed_is_never_stored(tmp_path: Path, outcome: Outcome) -> None:
    store = EngineStore(tmp_path / "store")
    engine = tmp_path / "half.engine"
    engine.write_bytes(b"half")
    monitor = ended_build(outcome, 2.0)
    job = BuildJob(model_path=tmp_path / "m.onnx", engine_path=engine, options=BuildOptions())
    visit = StoreVisit(store, store_key(BASE), None)
    visit.keep(monitor, BuildResult(outcome, "", engine, 4), job)
    visit.keep(monitor, None, job)  # interrupted
    assert store.entries() == []
    monitor.close()


def test_a_stored_build_records_how_long_it_took(tmp_path: Path) -> None:
    store = EngineStore(tmp_path / "store")
    engine = tmp_path / "built.engine"
    engine.write_bytes(b"whole")
    monitor = ended_build(Outcome.SUCCESS, 2.0)
    job = BuildJob(model_path=tmp_path / "m.onnx", engine_path=engine, options=BuildOptions())
    StoreVisit(store, store_key(BASE), None).keep(
        monitor, BuildResult(Outcome.SUCCESS, "", engine, 5), job
    )
    (entry,) = store.entries()
    assert 2.0 <= entry.record.build_s[0] < 3.0
    monitor.close()


def test_a_scrape_reads_the_store_from_the_build_record() -> None:
    for recorded, expected in (
        ({"trt.store.hit": True, "trt.store.saved_s": 42.5}, (True, 42.5)),
        ({"trt.store.hit": False}, (False, 0.0)),
        ({"trt.store.hit": "yes", "trt.store.saved_s": 1}, (None, 0.0)),
        ({"trt.store.hit": True, "trt.store.saved_s": -5}, (True, 0.0)),
        ({}, (None, 0.0)),
    ):
        monitor = BuildMonitor(attributes={**BASE, **recorded}, backend="none")
        monitor.start()
        sample = sample_build(MetricSources(monitor))
        assert (sample.store_hit, sample.store_saved_s) == expected, recorded
        monitor.close()


@pytest.mark.e2e
def test_a_build_on_another_host_of_a_shared_store_waits_and_is_served(tmp_path: Path) -> None:
    """Another host sharing the store's folder, as near as one machine comes: a build in a pid
    and host namespace of its own (its pids and host name are not this one's), on the same
    files. Its build of the same key waits for this one's, by the lock alone, and is served."""
    import_rtx()
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("another host is simulated with unshare(1) as root")
    model = write_residual(tmp_path / "deep.onnx", blocks=300)
    store = tmp_path / "store"

    def arguments(name: str) -> list[str]:
        return [
            "build", str(model), "-o", str(tmp_path / f"{name}.engine"), "--shapes",
            RESIDUAL_SHAPES, "--no-progress", "--engine-store", str(store), "--journal",
            str(tmp_path / f"{name}.jsonl"),
        ]  # fmt: skip

    with contextlib.ExitStack() as stack:
        here = start_cli(*arguments("here"))
        stack.callback(_kill, here)
        wait_for_text(tmp_path / "here.jsonl", b'"build_start"')
        elsewhere = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--uts", "sh", "-c",
             'hostname host-b && exec "$@"', "sh", *CLI, *arguments("elsewhere")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        stack.callback(_kill, elsewhere)
        errors = [p.communicate(timeout=300)[1] for p in (here, elsewhere)]
    assert [here.returncode, elsewhere.returncode] == [0, 0], errors
    assert f"store: waiting for pid {here.pid} on {socket.gethostname()}" in errors[1]
    served = started(tmp_path / "elsewhere.jsonl").attributes
    assert served["trt.store.hit"] is True and served["host.name"] == "host-b"
    assert (tmp_path / "elsewhere.engine").read_bytes() == (tmp_path / "here.engine").read_bytes()


def test_a_run_of_many_builds_is_summed_up_in_one_line() -> None:
    def built(reason: str = NO_ENGINE_YET) -> StoreStatus:
        return StoreStatus(served=False, saved_s=None, miss_reason=reason)

    served = StoreStatus(served=True, saved_s=72.0, miss_reason=None)
    upgrade = "trt.version: 1.7.1.116 -> 1.7.2.4"
    stores = [served, served, None, built(upgrade), built(), built(upgrade), served]
    assert engines_summary(stores) == (f"engines: 3 served, 2 rebuilt ({upgrade}), 1 built")
    many = [built(f"options: +opt {n}") for n in range(5)]
    assert engines_summary(many) == (
        "engines: 0 served, 5 rebuilt (options: +opt 0; options: +opt 1; options: +opt 2; 2 more)"
    )
    assert engines_summary([None, None]) is None, "no build used a store"


def test_a_builds_store_visit_in_its_status_is_read_checked() -> None:
    assert store_status({}) is None
    assert store_status({"trt.store.hit": "yes"}) is None
    assert store_status({"trt.store.hit": True, "trt.store.saved_s": 1.5}) == StoreStatus(
        served=True, saved_s=1.5, miss_reason=None
    )
    missed = store_status({"trt.store.hit": False, "trt.store.miss_reason": "x" * 10_000})
    assert missed is not None and len(missed.miss_reason or "") == MAX_REASON_CHARS
    odd = store_status({"trt.store.hit": False, "trt.store.saved_s": True})
    assert odd is not None and odd.saved_s is None, "a bool is no number of seconds"


def test_the_fleets_list_says_what_the_store_did_for_each_build(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    visits: dict[str, dict[str, Any]] = {
        "0123456789aa": {"trt.store.hit": True, "trt.store.saved_s": 3.0},
        "0123456789bb": {"trt.store.hit": False, "trt.store.miss_reason": "options: +fp16 true"},
        "0123456789cc": {},
    }
    for build_id, attributes in visits.items():
        folder = fleet.state_dir / build_id
        folder.mkdir(parents=True)
        record = {"id": build_id, "kind": "demo", "argv": ["demo"], "pid": 2**22 + 1,
                  "started_wall_s": 0.0, "model": None, "engine": None}  # fmt: skip
        (folder / "build.json").write_text(json.dumps(record))
        monitor = BuildMonitor(attributes=attributes)
        monitor.log.follow(JournalWriter(folder / "journal.jsonl"))
        monitor.start()
        monitor.end()
        monitor.close()
    listed = {build.id: build.store for build in fleet.list()}
    assert listed["0123456789aa"] == StoreStatus(served=True, saved_s=3.0, miss_reason=None)
    rebuilt = listed["0123456789bb"]
    assert rebuilt is not None and rebuilt.miss_reason == "options: +fp16 true"
    assert listed["0123456789cc"] is None
    assert engines_summary(listed.values()) == (
        "engines: 1 served, 1 rebuilt (options: +fp16 true)"
    )


@pytest.mark.e2e
def test_prune_says_what_it_removed_and_the_bytes_left(tmp_path: Path) -> None:
    store = tmp_path / "store"
    demo = ("demo", "--speed", "0", "--no-progress", "--engine-store", store)
    assert run_cli(*demo, "-o", tmp_path / "a.engine").returncode == 0
    older = json.loads(run_cli("store", "ls", store, "--json").stdout)["entries"]
    (first,) = older
    os.utime(store / "v1" / "entries" / first["key"], (time.time() - 60, time.time() - 60))
    options = ("--builder-optimization-level", "1")
    assert run_cli(*demo, *options, "-o", tmp_path / "b.engine").returncode == 0
    entries = json.loads(run_cli("store", "ls", store, "--json").stdout)["entries"]
    assert len(entries) == 2
    (newer,) = [e for e in entries if e["key"] != first["key"]]
    pruned = run_cli("store", "prune", store, "--max", str(newer["bytes"] + 1), "--json")
    answer = json.loads(pruned.stdout)
    assert [e["key"] for e in answer["removed"]] == [first["key"]], "the least recently used"
    left = json.loads(run_cli("store", "ls", store, "--json").stdout)["entries"]
    assert [e["key"] for e in left] == [newer["key"]]
    assert answer["bytes"] == newer["bytes"], "what is left, not what was removed"


def test_a_served_build_has_no_miss_reason_whatever_its_record_holds() -> None:
    # A journal is data from elsewhere: a hit with a miss reason beside it was served all the same.
    served = store_status({"trt.store.hit": True, "trt.store.miss_reason": "options: +fp16 true"})
    assert served == StoreStatus(served=True, saved_s=None, miss_reason=None)
    assert engines_summary([served]) == "engines: 1 served"
