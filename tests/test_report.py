"""``trt-otel report``: a finished build as a page in a real headless Chromium, as markdown, and as
a Trace Event Format file checked against that format's rules.

The main journal is a real TensorRT-RTX build made here by ``trt-otel build`` (its process
sampled, its silent window real); the crafted ones hold what an attacker would put in a phase
name. Screenshots go to ``TRT_OTEL_SCREENSHOTS`` when it is set.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from browser import chromium
from cli import run_cli
from journals import DATA, write_journal
from rtx_builds import import_rtx, write_residual
from trt_otel.builder.onnx_models import RESIDUAL_SHAPES
from trt_otel.core.events import (
    BuildFinished,
    BuildStarted,
    CancelRequested,
    Event,
    Outcome,
    PhaseFinished,
    PhaseStarted,
    ProcessSample,
    StepCompleted,
)
from trt_otel.core.journal_reader import read_journal

# On one worker: the real build of the rtx_journal fixture is made once a run.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("report")]

CANCELLED = DATA / "rtx-residual400-cancelled.jsonl"
EVIL = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>| `x` **y**'


@pytest.fixture(scope="module")
def rtx_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real TensorRT-RTX build's journal, its process sampled every half second."""
    import_rtx()
    folder = tmp_path_factory.mktemp("rtx")
    model = write_residual(folder / "residual.onnx")
    journal = folder / "build.jsonl"
    done = run_cli(
        "build", str(model), "-o", str(folder / "residual.engine"), "--shapes", RESIDUAL_SHAPES,
        "--journal", str(journal), "--no-progress", "--sample-interval", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return journal


def _event(cls: type[Event], seq: int, at_s: float, **fields: Any) -> Event:
    ns = int(at_s * 1e9)
    return cls(seq=seq, wall_ns=1_800_000_000_000_000_000 + ns, mono_ns=ns, thread="Main", **fields)


def crafted_journal(path: Path, name: str = EVIL) -> Path:
    """A build whose phase names, reason and attributes are markup, with a silence and a cancel."""
    events = [
        _event(BuildStarted, 0, 0.0, build_id="b1", attributes={"model.path": name, "x": name}),
        _event(PhaseStarted, 1, 0.1, name="Building engine", parent=None, num_steps=2),
        _event(PhaseStarted, 2, 0.2, name=name, parent="Building engine", num_steps=3),
        _event(StepCompleted, 3, 0.3, name=name, step=0),
        _event(ProcessSample, 4, 1.0, pid=1, status="running", cpu_percent=90.0, rss_bytes=2**28),
        _event(CancelRequested, 5, 4.0, reason=name, source="file"),
        _event(StepCompleted, 6, 4.5, name=name, step=1),
        _event(PhaseFinished, 7, 4.6, name=name),
        _event(PhaseFinished, 8, 4.7, name="Building engine"),
        _event(BuildFinished, 9, 4.8, outcome=Outcome.CANCELLATION, detail=name),
    ]
    return write_journal(path, events)


def _screenshot(driver: Any, name: str) -> None:
    folder = os.environ.get("TRT_OTEL_SCREENSHOTS")
    if folder:
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1280, min(height + 40, 4000))
        driver.save_screenshot(str(Path(folder) / name))


# -- the page, in Chromium -----------------------------------------------------------------------


@pytest.mark.slow
def test_the_page_of_a_real_build_shows_its_timeline_phases_and_resources_and_fetches_nothing(
    rtx_journal: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    done = run_cli("report", str(rtx_journal), "-o", str(page))
    assert done.returncode == 0, done.stderr
    with chromium() as driver:
        driver.get(page.as_uri())
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.timeline g.row .label'))"
            ".map(t => t.textContent)"
        )
        assert rows[0] == "Building engine"
        assert "Determining refit engines" in rows
        bars = driver.execute_script("return document.querySelectorAll('rect.bar').length")
        assert bars >= len(rows)
        silences = driver.execute_script(
            "return Array.from(document.querySelectorAll('.silent-window title'))"
            ".map(t => t.textContent)"
        )
        assert any("in Determining refit engines" in s for s in silences), silences
        table = driver.execute_script("return document.querySelector('table.phases').innerText")
        first_row = table.splitlines()[1]
        assert "Determining refit engines" in first_row  # the phase that took the time
        resources = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.resources .series text'))"
            ".map(t => t.textContent)"
        )
        assert "builder CPU" in resources and "builder memory" in resources
        record = driver.execute_script("return document.querySelector('table.record').innerText")
        assert "tensorrt-rtx" in record
        # Nothing came from outside: the page loaded no resource, and its policy allows none.
        fetched = driver.execute_script(
            "return performance.getEntriesByType('resource').map(r => r.name)"
        )
        assert fetched == []
        policy = driver.execute_script(
            "return document.querySelector('meta[http-equiv=\"Content-Security-Policy\"]').content"
        )
        assert "default-src 'none'" in policy
        # The page's own script ran under that policy (it folds rows): no violation.
        errors = [m for m in driver.get_log("browser") if m["level"] == "SEVERE"]
        assert errors == []
        _screenshot(driver, "report-rtx.png")


@pytest.mark.slow
def test_a_row_with_children_folds_and_unfolds_in_the_browser(
    rtx_journal: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    assert run_cli("report", str(rtx_journal), "-o", str(page)).returncode == 0
    visible = (
        "return Array.from(document.querySelectorAll('svg.timeline g.row'))"
        ".filter(r => r.getAttribute('visibility') !== 'hidden').length"
    )
    with chromium() as driver:
        driver.get(page.as_uri())
        before = driver.execute_script(visible)
        toggle = driver.find_element("css selector", "svg.timeline g.row .toggle")
        toggle.click()
        assert driver.execute_script(visible) == 1  # the root alone
        toggle.click()
        assert driver.execute_script(visible) == before


@pytest.mark.slow
def test_a_crafted_journal_is_shown_as_text_and_runs_nothing(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    done = run_cli("report", str(crafted_journal(tmp_path / "evil.jsonl")), "-o", str(page))
    assert done.returncode == 0, done.stderr
    with chromium() as driver:
        driver.get(page.as_uri())
        assert driver.execute_script("return window.pwned === undefined")
        assert driver.execute_script("return document.querySelectorAll('img').length") == 0
        scripts = driver.execute_script("return document.querySelectorAll('script').length")
        assert scripts == 1  # the page's own
        labels = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.timeline g.row title'))"
            ".map(t => t.textContent)"
        )
        assert any(EVIL in label for label in labels)
        notes = driver.execute_script(
            "return Array.from(document.querySelectorAll('.note')).map(n => n.innerText)"
        )
        assert any(n.startswith("Cancelled by file at 4.0s: <img") for n in notes), notes


def test_the_page_holds_no_unescaped_markup_from_the_journal(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert (
        run_cli("report", str(crafted_journal(tmp_path / "e.jsonl")), "-o", str(page)).returncode
        == 0
    )
    text = page.read_text(encoding="utf-8")
    assert "<img" not in text and "window.pwned=2</script>" not in text
    assert "&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;" in text


# -- markdown ------------------------------------------------------------------------------------


def test_markdown_names_the_outcome_the_phases_and_the_cancel_and_keeps_names_inert(
    tmp_path: Path,
) -> None:
    done = run_cli("report", str(crafted_journal(tmp_path / "e.jsonl")), "--format", "markdown")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "**cancellation** in 4.8s" in text
    assert "> Cancelled by **file** at 4.0s:" in text
    cancel_line = next(line for line in text.splitlines() if "Cancelled by" in line)
    assert cancel_line.endswith("; stopped 800 ms later"), cancel_line  # 4.0 s to its end at 4.8 s
    table = [line for line in text.splitlines() if line.startswith("| Building engine")]
    assert table, text
    # The name's pipe, backticks, stars and tags are escaped: the row keeps its 8 cells.
    evil_row = next(line for line in table if "onerror" in line)
    assert len(re.findall(r"(?<!\\)\|", evil_row)) == 9
    assert "<img" not in text and "<script" not in text
    assert '&lt;img src=x onerror="window.pwned=1"&gt;' in text


@pytest.mark.parametrize("form", ["markdown", "html"])
def test_control_characters_in_a_journal_do_not_reach_the_terminal(
    form: str, tmp_path: Path
) -> None:
    # ``report`` prints to stdout without ``-o``: a phase name that clears the screen and sets
    # the window's title is written as escapes, as the console writes it.
    name = "\x1b[2J\x1b[32mbuild success\x1b]0;pwned\x07 \x9b31m"
    journal = crafted_journal(tmp_path / "e.jsonl", name)
    done = run_cli("report", str(journal), "--format", form)
    assert done.returncode == 0, done.stderr
    assert not any((ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) < 0xA0 for c in done.stdout)
    assert "x1b" in done.stdout and "x07" in done.stdout and "x9b31m" in done.stdout


def test_markdown_of_a_real_cancelled_build(tmp_path: Path) -> None:
    done = run_cli("report", str(CANCELLED), "--format", "markdown")
    assert done.returncode == 0, done.stderr
    assert "**cancellation**" in done.stdout
    assert "Cancelled by **file**" in done.stdout
    assert "in Determining refit engines" in done.stdout


# -- chrome-trace --------------------------------------------------------------------------------

PHASES = {"X", "C", "i", "M"}


def check_trace_event_format(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The Trace Event Format's rules (the JSON Object Format) that Perfetto and
    chrome://tracing rely on; returns the events."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    complete: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    named_threads: set[tuple[int, int]] = set()
    for event in trace["traceEvents"]:
        assert event["ph"] in PHASES, event
        assert isinstance(event["name"], str) and event["name"], event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name"), event
            assert isinstance(event["args"]["name"], str)
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
            continue
        assert isinstance(event["ts"], int | float) and event["ts"] >= 0, event
        if event["ph"] == "X":
            assert isinstance(event["dur"], int | float) and event["dur"] >= 0, event
            complete[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
        elif event["ph"] == "C":
            assert event["args"] and all(isinstance(v, int | float) for v in event["args"].values())
        elif event["ph"] == "i":
            assert event["s"] in ("g", "p", "t"), event
    # Complete events of one thread nest: one starts inside another only if it ends inside it.
    for thread, spans in complete.items():
        assert thread in named_threads, thread
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, (thread, start, end, stack)
            stack.append(end)
    return list(trace["traceEvents"])


def test_the_trace_of_a_real_build_follows_the_format_with_every_phase_and_the_resources(
    rtx_journal: Path,
) -> None:
    done = run_cli("report", str(rtx_journal), "--format", "chrome-trace")
    assert done.returncode == 0, done.stderr
    events = check_trace_event_format(json.loads(done.stdout))
    phases = [e for e in events if e["ph"] == "X" and e["cat"] == "phase"]
    starts = [e for e in read_journal(rtx_journal).events if isinstance(e, PhaseStarted)]
    assert sorted(e["name"] for e in phases) == sorted(e.name for e in starts)
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    recorded = {e.thread for e in starts}
    assert recorded <= threads  # the phases are on the threads that made them
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"builder CPU", "builder memory"} <= counters
    assert [e["name"] for e in events if e["ph"] == "i"] == ["build success"]
    silent = [e for e in events if e.get("cat") == "silence"]
    assert "Determining refit engines" in [e["args"]["phase"] for e in silent]


def test_the_trace_of_a_cancelled_build_has_the_cancel_as_an_instant() -> None:
    done = run_cli("report", str(CANCELLED), "--format", "chrome-trace")
    events = check_trace_event_format(json.loads(done.stdout))
    instants = [e for e in events if e["ph"] == "i"]
    assert [e["name"] for e in instants] == ["cancel (file)", "build cancellation"]
    assert instants[0]["ts"] < instants[1]["ts"]


def test_phases_that_overlap_without_nesting_on_one_thread_go_to_another_lane(
    tmp_path: Path,
) -> None:
    # Two phases of one thread that overlap: A [0.1, 0.5], B [0.3, 0.9] (B's parent is A, but
    # A finished first, a protocol departure the fold tolerates).
    events = [
        _event(BuildStarted, 0, 0.0, build_id="b", attributes={}),
        _event(PhaseStarted, 1, 0.1, name="A", parent=None, num_steps=1),
        _event(PhaseStarted, 2, 0.2, name="C", parent=None, num_steps=1),
        _event(PhaseFinished, 3, 0.5, name="A"),
        _event(PhaseFinished, 4, 0.9, name="C"),
        _event(BuildFinished, 5, 1.0, outcome=Outcome.SUCCESS),
    ]
    write_journal(tmp_path / "j.jsonl", events)
    done = run_cli("report", str(tmp_path / "j.jsonl"), "--format", "chrome-trace")
    trace = check_trace_event_format(json.loads(done.stdout))
    lanes = {e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert lanes == {"Main", "Main (2)"}


# -- the command ---------------------------------------------------------------------------------


def test_several_journals_give_one_section_per_build(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    done = run_cli("report", str(CANCELLED), str(DATA / "rtx-conv8-success.jsonl"), "-o", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    assert text.count('<section class="build"') == 2
    assert "Build 1 of 2" in text and "Build 2 of 2" in text


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["/"], "not a regular file"),
        (["missing.jsonl"], "cannot read journal"),
        ([str(CANCELLED), "-o", "/"], "is a directory, not a regular file"),
        ([str(CANCELLED), "-o", "/no/such/dir/r.html"], "no directory /no/such/dir"),
        # A folder that takes no new file, whoever runs it (root too).
        ([str(CANCELLED), "-o", "/proc/r.html"], "-o /proc/r.html: cannot write in /proc"),
        ([str(CANCELLED), "--format", "pdf"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], said: str, tmp_path: Path) -> None:
    done = run_cli("report", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr
    if "--format" not in args:  # argparse's own errors come after the usage
        assert len(done.stderr.splitlines()) == 1, done.stderr


def test_the_output_is_never_one_of_the_journals(tmp_path: Path) -> None:
    """``report J -o J`` would replace the build's record with its page: refused, by the real
    path (a symlink to it, a ``..`` through another folder), and the journal stays whole."""
    journal = tmp_path / "build.jsonl"
    journal.write_bytes(CANCELLED.read_bytes())
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(journal)
    for output in ("build.jsonl", "sub/../build.jsonl", "link.jsonl", str(journal)):
        done = run_cli("report", str(CANCELLED), "build.jsonl", "-o", output, cwd=tmp_path)
        assert done.returncode == 2, (output, done.stderr)
        assert "is also the journal" in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert journal.read_bytes() == CANCELLED.read_bytes(), output
    assert (tmp_path / "link.jsonl").is_symlink()
