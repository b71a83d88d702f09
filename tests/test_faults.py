"""Faults and abuse: protocol violations from TensorRT, a full disk, a scrape during shutdown,
bad input at the command line. The monitor never raises, always answers a bool, loses nothing
silently, and the build goes on."""

from __future__ import annotations

import resource
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli import CLI
from trt_otel import Anomaly, BuildMonitor, JournalWriter, read_journal
from trt_otel.app.cli import main
from trt_otel.capture.binding import ProgressMonitorBase
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState, PhaseStatus
from trt_otel.testing import CollectingFollower
from trt_otel.views.spans import SpanProjection

NAMES = st.sampled_from(["Building engine", "Timing", "Measuring tactic time", "", 'é\n"x"'])
ODD = st.one_of(st.none(), st.integers(-5, 5), st.binary(max_size=3), st.floats(allow_nan=True))
NAME_ARG = st.one_of(NAMES, NAMES, NAMES, ODD)
COUNT_ARG = st.one_of(
    st.integers(-3, 40), st.integers(2**62, 2**70), st.booleans(), st.text(max_size=2), ODD
)
CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), NAME_ARG, st.one_of(st.none(), NAME_ARG), COUNT_ARG),
        st.tuples(st.just("step"), NAME_ARG, COUNT_ARG),
        st.tuples(st.just("step"), NAMES, st.integers(0, 40)),
        st.tuples(st.just("finish"), NAME_ARG),
    ),
    max_size=80,
)


def play(monitor: ProgressMonitorBase, calls: list[tuple[Any, ...]]) -> list[object]:
    answers: list[object] = []
    for call in calls:
        if call[0] == "start":
            monitor.phase_start(call[1], call[2], call[3])
            answers.append(None)
        elif call[0] == "step":
            answers.append(monitor.step_complete(call[1], call[2]))
        else:
            monitor.phase_finish(call[1])
            answers.append(None)
    return answers


def shape(state: BuildState) -> dict[int, tuple[object, ...]]:
    return {i: (p.name, p.parent_id, p.steps_completed, p.status) for i, p in state.phases.items()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=CALLS, end=st.booleans())
def test_any_callback_sequence_is_answered_and_folds_consistently(
    calls: list[tuple[Any, ...]], end: bool
) -> None:
    monitor = BuildMonitor()
    collector = CollectingFollower()
    monitor.log.follow(collector, min_interval_s=0.0)
    answers = play(monitor, calls)
    if end:
        monitor.end()
    monitor.close()

    steps = [a for call, a in zip(calls, answers, strict=True) if call[0] == "step"]
    assert all(type(a) is bool and a for a in steps), "never a cancel, never a non-bool"
    assert monitor.internal_errors == 0
    events = collector.events
    assert [e.seq for e in events] == list(range(len(events)))
    state = monitor.state
    # The fold is consistent with itself...
    for name, phase_id in state.open_by_name.items():
        phase = state.phases[phase_id]
        assert phase.name == name and phase.status is PhaseStatus.OPEN
    for phase in state.phases.values():
        if phase.parent_id is not None:
            assert state.phases[phase.parent_id].depth + 1 == phase.depth
        else:
            assert phase.depth == 0 and phase.id in state.roots
    assert sum(state.anomalies.values()) == sum(isinstance(e, Anomaly) for e in events)
    assert state.steps_completed_total == len(steps)
    if end:
        assert not state.open_by_name
    # ...and a replay of its events ends in the same state.
    replayed = BuildState()
    for event in events:
        replayed.apply(event)
    assert replayed.open_by_name == state.open_by_name
    assert replayed.anomalies == state.anomalies
    assert {
        i: (p.name, p.parent_id, p.steps_completed, p.status) for i, p in replayed.phases.items()
    } == {i: (p.name, p.parent_id, p.steps_completed, p.status) for i, p in state.phases.items()}
    # Spans: every phase ends as one, and the build's span closes the trace.
    projection = SpanProjection()
    spans = [s for e in events for s in projection.apply(e)] + projection.finish()
    if events:
        assert len(spans) == state.phases_started_total + 1
        assert all(s.start_ns <= s.end_ns for s in spans)


@settings(max_examples=50, deadline=None)
@given(calls=CALLS)
def test_what_the_monitor_records_survives_the_journal(
    calls: list[tuple[Any, ...]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("journal") / "j.jsonl"
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(path))
    collector = CollectingFollower()
    monitor.log.follow(collector)
    play(monitor, calls)
    monitor.end()
    monitor.close()
    journal = read_journal(path)
    assert journal.problems == []
    assert journal.events == collector.events


def test_callbacks_from_many_threads_with_broken_arguments_keep_answering() -> None:
    monitor = BuildMonitor()
    answers: list[object] = []
    lock = threading.Lock()

    def hammer(index: int) -> None:
        name = f"phase {index}"
        got = []
        monitor.phase_start(name, None, 1000)
        for step in range(1000):
            got.append(monitor.step_complete(name if step % 7 else None, step))  # type: ignore[arg-type]
            monitor.phase_finish(b"nonsense")  # type: ignore[arg-type]
        monitor.phase_finish(name)
        with lock:
            answers.extend(got)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 4000 and all(a is True for a in answers)
    assert monitor.internal_errors == 0
    assert not monitor.state.open_by_name


def limit_file_size() -> None:
    """In the child: files may not grow past 16 KiB (a full disk, as the journal sees it)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))


@pytest.mark.e2e
def test_a_full_disk_stops_the_journal_not_the_build(tmp_path: Path) -> None:
    journal = tmp_path / "full.jsonl"
    result = subprocess.run(
        [*CLI, "demo", "--speed", "0", "--no-progress",
         "--no-gpu", "--journal", str(journal), "--in-process"],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=limit_file_size,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "build success" in result.stderr
    assert "journal" in result.stderr and "File too large" in result.stderr
    recorded = read_journal(journal)
    assert 0 < len(recorded.events) < 5000, "a prefix was written, and it reads back"


def test_a_scrape_during_shutdown_is_harmless() -> None:
    from trt_otel.views.prometheus import MetricSources, MetricsServer, metrics_registry

    monitor = BuildMonitor()
    server = MetricsServer(metrics_registry(MetricSources(monitor)), 0)
    url = f"http://127.0.0.1:{server.port}/metrics"
    failures: list[BaseException] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    response.read()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # the server went away: expected
            except BaseException as error:  # anything else is a bug
                failures.append(error)

    scrapers = [threading.Thread(target=scrape) for _ in range(4)]
    for thread in scrapers:
        thread.start()
    monitor.start()
    monitor.end()
    server.close()
    stop.set()
    for thread in scrapers:
        thread.join(10)
    assert not failures


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--timeout", "soon"], None),
        (["--timeout", "0s"], None),
        (["--grace", "-1s"], None),
        (["--cancel-url", "ftp://flags"], None),
        (["--cancel-url", "not a url"], None),
        (["--http-port", "70000"], None),
        (["--otlp-endpoint", "grpc://collector:4317"], "not an http:// or https:// URL"),
        (["--gpu-interval", "0"], None),
        (["--history", "/nonexistent"], "is not a directory"),
    ],
)
def test_invalid_options_are_refused_before_the_build(
    args: list[str], message: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    if message is None:
        with pytest.raises(SystemExit) as exit_info:
            main(["demo", *args])
        assert exit_info.value.code == 2
    else:
        assert main(["demo", "--no-gpu", *args]) == 2
        assert message in capsys.readouterr().err


class _Flag:
    value = 0


def without_stamps(events: list[Any]) -> list[tuple[object, ...]]:
    import msgspec

    stamps = ("seq", "wall_ns", "mono_ns", "thread")
    return [
        (
            event.type,
            *(
                getattr(event, f.name)
                for f in msgspec.structs.fields(event)
                if f.name not in stamps
            ),
        )
        for event in events
        if event.type != "build_start"
    ]


@settings(max_examples=200, deadline=None)
@given(calls=CALLS, end=st.booleans())
def test_callbacks_recorded_in_a_worker_replay_into_the_same_events(
    calls: list[tuple[Any, ...]], end: bool
) -> None:
    from trt_otel.capture.worker import RecordingMonitor

    direct = BuildMonitor()
    direct.start()
    recorder = RecordingMonitor(_Flag(), None)
    answers = [play(m, calls) for m in (direct, recorder)]
    assert answers[0] == answers[1], "the worker answers as the monitor does"
    if end:
        direct.end()
        recorder.end()
    replayed = BuildMonitor()
    replayed.start()
    for record in recorder.records:
        replayed.record([record])
    # As the supervisor replays: a frame at once, into a monitor whose fold is the read model.
    model = ReadModel()
    supervising = BuildMonitor(model=model)
    supervising.start()
    supervising.record(recorder.records)
    expected = without_stamps(direct.log.recent())
    for monitor in (replayed, supervising):
        assert monitor.internal_errors == 0
        assert without_stamps(monitor.log.recent()) == expected
    assert model.state.anomalies == direct.state.anomalies
    assert model.state.steps_completed_total == direct.state.steps_completed_total
    stamps = [(r[1], r[2], r[3]) for r in recorder.records]
    kept = [(e.wall_ns, e.mono_ns, e.thread) for e in replayed.log.recent()[1:]]
    assert set(kept) <= set(stamps), "events keep the time and thread of their callback"
