"""The soak (``benchmarks/soak.py``, ``make soak`` runs 30 minutes of it), every fault once:
real TensorRT-RTX and simulated builds, two at a time (as ``make soak`` runs them), each with a
fault injected from outside, and each checked when it ends: its journal reads and ends (or
reads as unfinished), nothing the /events stream sent is missing from it, its exit code is its
outcome's, and nothing is left behind. The seed is fixed, so the order of the faults and their
moments are the same in every run; their timing is the machine's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rtx_builds import import_rtx

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
SOAK = BENCHMARKS / "soak.py"
SEED = 7
LIMIT_S = 600


def soak_faults() -> tuple[str, ...]:
    """The soak's faults, read from its source (importing it would import its peers)."""
    found = re.search(r"^FAULTS = \(([^)]*)\)", SOAK.read_text(encoding="utf-8"), re.MULTILINE)
    assert found is not None, "benchmarks/soak.py names no FAULTS"
    return tuple(re.findall(r'"([^"]+)"', found.group(1)))


@pytest.mark.e2e
@pytest.mark.timeout(LIMIT_S + 60)
def test_every_fault_loses_nothing_and_leaves_nothing_behind() -> None:
    import_rtx()
    done = subprocess.run(
        [sys.executable, str(SOAK), "--every-fault", "--concurrent", "2", "--seed", str(SEED)],
        capture_output=True, text=True, timeout=LIMIT_S, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    report = done.stdout + done.stderr
    assert "Traceback" not in done.stderr, report
    assert done.returncode == 0, report
    faults = soak_faults()
    assert f"\n{len(faults)} builds, 0 findings" in done.stdout, report
    # Each fault was injected once: one line per build ("  #3    sim    ctrl-c    exit 130 ...").
    injected = re.findall(r"^  #\d+\s+\S+\s+(\S+)", done.stdout, re.MULTILINE)
    assert sorted(injected) == sorted(faults), report
