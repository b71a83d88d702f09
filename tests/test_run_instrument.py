"""``trt_otel.instrument()`` and ``uninstrument()``: the same recording as ``trt-otel run``,
in the program's own process, configured from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prometheus_server import free_port
from runs import residual_net
from trt_otel import read_journal
from trt_otel.app.instrumentation import InstrumentError, InstrumentSettings
from trt_otel.core.events import BuildFinished, BuildStarted

pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install -e '.[dev]')")

PROGRAM = Path(__file__).parent / "programs" / "instrumented.py"


def run_instrumented(
    tmp_path: Path, *models: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    journal = tmp_path / "instrumented.jsonl"
    result = subprocess.run(
        [sys.executable, str(PROGRAM), *map(str, models)],
        capture_output=True,
        text=True,
        env={**os.environ, "TRT_OTEL_JOURNAL": str(journal), **env},
        timeout=300,
        check=False,
    )
    return result, journal


@pytest.mark.e2e
def test_each_build_while_instrumented_is_a_build_of_the_journal_and_none_after(
    mnist: Path, tmp_path: Path
) -> None:
    result, journal = run_instrumented(tmp_path, mnist, mnist)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "result 1: engine",
        "result 2: engine",
        "after: engine",
        "restored: True",
    ]
    events = read_journal(journal).events
    starts = [e for e in events if isinstance(e, BuildStarted)]
    ends = [e for e in events if isinstance(e, BuildFinished)]
    assert [s.attributes["network.name"] for s in starts] == ["net1", "net2"]
    assert [e.outcome for e in ends] == ["success", "success"]
    assert events[-1] is ends[-1]


@pytest.mark.e2e
def test_a_timeout_from_the_environment_cancels_a_build_in_process(tmp_path: Path) -> None:
    model = residual_net(400, tmp_path)
    result, journal = run_instrumented(tmp_path, model, TRT_OTEL_TIMEOUT="0.3s")
    assert result.returncode == 0, result.stderr
    assert "result 1: None" in result.stdout.splitlines()
    (end,) = [e for e in read_journal(journal).events if isinstance(e, BuildFinished)]
    assert end.outcome == "timeout"


@pytest.mark.e2e
def test_the_metrics_count_the_builds_of_the_process(mnist: Path, tmp_path: Path) -> None:
    port = free_port()
    result, _ = run_instrumented(
        tmp_path,
        mnist,
        mnist,
        TRT_OTEL_PROMETHEUS_PORT=str(port),
        SCRAPE=f"http://127.0.0.1:{port}/metrics",
    )
    assert result.returncode == 0, result.stderr
    assert 'trt_run_builds_total{outcome="success"} 2.0' in result.stdout.splitlines()


def test_settings_come_from_arguments_over_the_environment() -> None:
    env = {"TRT_OTEL_TIMEOUT": "15m", "TRT_OTEL_JOURNAL": "env.jsonl", "TRT_OTEL_PROGRESS": "off"}
    settings = InstrumentSettings.resolve(env, journal="given.jsonl")
    assert settings.journal == Path("given.jsonl")
    assert settings.timeout_s == 900.0
    assert settings.progress is False


@pytest.mark.parametrize(
    ("variable", "value"),
    [("TRT_OTEL_TIMEOUT", "soon"), ("TRT_OTEL_PROGRESS", "fancy"), ("TRT_OTEL_HTTP_PORT", "99999")],
)
def test_a_bad_setting_is_a_clear_error(variable: str, value: str) -> None:
    with pytest.raises(InstrumentError, match=value):
        InstrumentSettings.resolve({variable: value})


def test_a_stall_timeout_shorter_than_two_samples_is_refused_as_the_option_is() -> None:
    """The stall counts work between two samples of the builder's process (one a second):
    ``instrument(stall_timeout=1)`` would stop a builder computing through a silent window as
    hung, where ``--stall-timeout 1s`` is refused."""
    with pytest.raises(InstrumentError, match=r"stall_timeout 1\.5s: shorter than 2 samples"):
        InstrumentSettings.resolve({}, stall_timeout=1.5)
    with pytest.raises(InstrumentError, match="give 2s or more"):
        InstrumentSettings.resolve({"TRT_OTEL_STALL_TIMEOUT": "500ms"})
    assert InstrumentSettings.resolve({}, stall_timeout="2s").stall_timeout_s == 2.0


EXITS_INSTRUMENTED = """
import sys
sys.path.insert(0, {programs!r})
import trt_otel
trt_otel.instrument()
from engines import build
print("result:", "None" if build(sys.argv[1], name="net") is None else "engine", flush=True)
# no uninstrument(): the process exits, and its journal must still end
"""


@pytest.mark.e2e
def test_a_program_that_exits_instrumented_ends_its_journal_every_time(
    mnist: Path, tmp_path: Path
) -> None:
    script = tmp_path / "exits_instrumented.py"
    script.write_text(EXITS_INSTRUMENTED.format(programs=str(PROGRAM.parent)))
    for attempt in range(3):
        journal = tmp_path / f"exits-{attempt}.jsonl"
        result = subprocess.run(
            [sys.executable, str(script), str(mnist)],
            capture_output=True, text=True, timeout=300, check=False,
            env={**os.environ, "TRT_OTEL_JOURNAL": str(journal)},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["result: engine"]
        events = read_journal(journal).events
        assert isinstance(events[0], BuildStarted), (attempt, events)
        assert isinstance(events[-1], BuildFinished), (attempt, events[-1:])
        assert events[-1].outcome == "success"


def test_a_port_may_be_zero_to_pick_one_and_up_to_65535() -> None:
    """``TRT_OTEL_HTTP_PORT=0`` asks for a free port, as ``--http-port 0`` does."""
    env = {"TRT_OTEL_HTTP_PORT": "0", "TRT_OTEL_PROMETHEUS_PORT": "65535"}
    settings = InstrumentSettings.resolve(env)
    assert (settings.http_port, settings.prometheus_port) == (0, 65535)
    with pytest.raises(InstrumentError, match="not a port"):
        InstrumentSettings.resolve({"TRT_OTEL_HTTP_PORT": "-1"})
