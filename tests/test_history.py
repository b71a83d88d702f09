"""``--history``: which earlier builds are builds of the same thing (the baseline of ``diff``,
``--fail-if-slower`` and the forecast), and which journals of a history folder are read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from journals import write_journal
from trt_otel import BuildMonitor, ManualClock
from trt_otel.app.cli import main
from trt_otel.app.diffing import (
    MAX_HISTORY_JOURNALS,
    history_baseline,
    history_journals,
    last_build,
    matches,
)
from trt_otel.app.reporting import build_reports
from trt_otel.core.events import Event, Outcome
from trt_otel.views.report.model import BuildReport


def built(clock: ManualClock, seconds: float, **attributes: str) -> list[Event]:
    """The events of a successful build of ``seconds`` on ``clock``, with ``attributes``."""
    return ended(clock, seconds, Outcome.SUCCESS, attributes)


def ended(
    clock: ManualClock, seconds: float, outcome: Outcome, attributes: Mapping[str, str]
) -> list[Event]:
    """The events of a build of ``seconds`` on ``clock`` that ended with ``outcome``."""
    monitor = BuildMonitor(attributes=attributes, clock=clock)
    monitor.start()
    monitor.phase_start("Building engine", None, 1)
    clock.advance(seconds)
    monitor.step_complete("Building engine", 0)
    monitor.phase_finish("Building engine")
    monitor.end(outcome)
    return monitor.log.recent()


def recorded(path: Path, **attributes: str) -> BuildReport:
    """A successful build with ``attributes``, read back from its journal at ``path``."""
    (report,) = build_reports([write_journal(path, built(ManualClock(), 10, **attributes))])
    return report


RTX, TRT = "tensorrt-rtx", "tensorrt"
F1, F2 = {"fingerprint": "f1"}, {"fingerprint": "f2"}
M1, M2 = {"model.sha256": "m1"}, {"model.sha256": "m2"}


@pytest.mark.parametrize(
    ("history", "candidate", "same"),
    [
        # The fingerprint covers the model, the backend and every option: it decides alone.
        ({**F1, **M1}, {**F1, **M2}, True),
        ({**F1, **M1}, {**F2, **M1}, False),
        # Where one of them has none, the model and the backend decide.
        ({"fingerprint": "f1", "model.sha256": "m1", "trt.backend": RTX},
         {"model.sha256": "m1", "trt.backend": RTX}, True),
        ({"model.sha256": "m1", "trt.backend": RTX},
         {"fingerprint": "f1", "model.sha256": "m1", "trt.backend": RTX}, True),
        ({"fingerprint": "f1", "model.sha256": "m1", "trt.backend": RTX},
         {"model.sha256": "m2", "trt.backend": RTX}, False),
        # Both must be the same: the same model built by another library is another build.
        ({**M1, "trt.backend": RTX}, {**M1, "trt.backend": TRT}, False),
        ({**M1, "trt.backend": RTX}, {**M2, "trt.backend": RTX}, False),
        # Nothing known of the model: never the same build.
        ({"trt.backend": RTX}, {"trt.backend": RTX}, False),
    ],
)  # fmt: skip
def test_a_build_of_the_same_thing(
    tmp_path: Path, history: dict[str, str], candidate: dict[str, str], same: bool
) -> None:
    earlier = recorded(tmp_path / "earlier.jsonl", **history)
    this = recorded(tmp_path / "this.jsonl", **candidate)
    assert matches(earlier, this) is same
    assert matches(this, earlier) is same, "whichever is the candidate"


def test_the_newest_journals_are_read_newest_first_up_to_the_bound(tmp_path: Path) -> None:
    count = MAX_HISTORY_JOURNALS + 2
    for age in range(count):  # journal-0 the newest
        path = tmp_path / f"journal-{age}.jsonl"
        path.touch()
        os.utime(path, (1_700_000_000 - age, 1_700_000_000 - age))
    (tmp_path / "a-folder.jsonl").mkdir()
    (tmp_path / "notes.txt").touch()
    this = tmp_path / "journal-1.jsonl"

    read = history_journals(tmp_path, exclude=this)
    assert len(read) == MAX_HISTORY_JOURNALS
    assert read[:3] == [tmp_path / "journal-0.jsonl", tmp_path / "journal-2.jsonl",
                        tmp_path / "journal-3.jsonl"]  # fmt: skip
    assert read[-1] == tmp_path / f"journal-{MAX_HISTORY_JOURNALS}.jsonl"
    assert tmp_path / f"journal-{count - 1}.jsonl" not in read, "the oldest is left out"


def test_a_candidate_is_never_its_own_baseline(tmp_path: Path) -> None:
    """Its own journal in the history folder (``--history`` where the build writes its
    journal) is no baseline: only the other builds of the same thing are."""
    folder = tmp_path / "history"
    folder.mkdir()
    this = recorded(folder / "this.jsonl", **M1, **{"trt.backend": RTX})
    assert history_baseline(folder, this) is None
    recorded(folder / "earlier.jsonl", **M1, **{"trt.backend": RTX})
    baseline = history_baseline(folder, this)
    assert baseline is not None and "median of 1 matching builds" in baseline.label


def test_diff_compares_a_journals_last_build(tmp_path: Path) -> None:
    """A journal of several builds (a retry ladder's): its last is the one compared."""
    clock = ManualClock()
    events = built(clock, 10) + built(clock, 20)
    numbered = [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events)]
    journal = write_journal(tmp_path / "ladder.jsonl", numbered)
    assert len(build_reports([journal])) == 2
    assert last_build(journal).duration_s == 20


def test_the_median_of_a_history_says_the_record_of_its_newest_build(tmp_path: Path) -> None:
    """The median's times are every matching build's, but its record (what a diff says
    differs: the builder's version, the options) is the newest build's: the history's
    present, not its first day."""
    folder = tmp_path / "history"
    folder.mkdir()
    clock = ManualClock()
    for version in ("1.0", "1.1", "1.2"):  # built in that order, the newest last
        events = built(clock, 10, **M1, **{"trt.backend": RTX, "trt.version": version})
        write_journal(folder / f"build-{version}.jsonl", events)
        clock.advance(60)
    this = recorded(tmp_path / "this.jsonl", **M1, **{"trt.backend": RTX, "trt.version": "1.3"})

    baseline = history_baseline(folder, this)
    assert baseline is not None and baseline.builds == 3
    assert baseline.attributes["trt.version"] == "1.2"


@pytest.mark.parametrize("outcome", [Outcome.CANCELLATION, Outcome.TIMEOUT, Outcome.FAILURE])
def test_only_successful_builds_are_a_baseline(tmp_path: Path, outcome: Outcome) -> None:
    """A build stopped early (cancelled, timed out) or failed is no measure of how long the
    model takes to build: left out of the median, a usual build never reads as slower."""
    folder = tmp_path / "history"
    folder.mkdir()
    same = {**M1, "trt.backend": RTX}
    write_journal(folder / "stopped.jsonl", ended(ManualClock(), 1, outcome, same))
    this = recorded(tmp_path / "this.jsonl", **same)
    assert history_baseline(folder, this) is None
    recorded(folder / "earlier.jsonl", **same)
    baseline = history_baseline(folder, this)
    assert baseline is not None and baseline.builds == 1


@pytest.mark.parametrize(("ending", "code"), [("cancelled", 3), ("failed", 4)])
def test_a_build_that_did_not_succeed_keeps_its_exit_code_under_the_gate(
    tmp_path: Path, ending: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--fail-if-slower`` judges a successful build's time: a cancelled or failed build is
    not passed by a gate with nothing to compare it with (exit 0), nor failed as slower."""
    history = tmp_path / "history"
    history.mkdir()
    model = tmp_path / "bad.onnx"
    model.write_bytes(b"\x08\x01garbage that is not onnx")
    endings = {
        # A timeout inside a silent window: cancelled at the first step after it.
        "cancelled": ["--silence", "1s", "--timeout", "0.2s"],
        "failed": ["--model", str(model)],
    }
    demo = [
        "demo", "--speed", "0", "--no-progress", "--no-gpu", "--no-summary", "--in-process",
        "--journal", str(tmp_path / "j.jsonl"), "--history", str(history),
        "--fail-if-slower", "5",
    ]  # fmt: skip
    assert main([*demo, *endings[ending]]) == code
    assert "--fail-if-slower" not in capsys.readouterr().err, "no gate was run"
