"""Three minutes of the soak (``benchmarks/soak.py``, ``make soak`` runs 30): real TensorRT-RTX
and simulated builds, one at a time, each with a fault injected from outside, and each checked
when it ends: its journal reads and ends (or reads as unfinished), nothing the /events stream
sent is missing from it, its exit code is its outcome's, and nothing is left behind. The seed
is fixed, so the faults drawn are the same in every run; their timing is the machine's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rtx_builds import import_rtx

SOAK = Path(__file__).parent.parent / "benchmarks" / "soak.py"
MINUTES = 3
SEED = 7


@pytest.mark.e2e
@pytest.mark.timeout(MINUTES * 60 + 420)
def test_three_minutes_of_faults_lose_nothing_and_leave_nothing_behind() -> None:
    import_rtx()
    done = subprocess.run(
        [sys.executable, str(SOAK), "--minutes", str(MINUTES), "--concurrent", "1",
         "--seed", str(SEED)],
        capture_output=True, text=True, timeout=MINUTES * 60 + 400, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    report = done.stdout + done.stderr
    assert "Traceback" not in done.stderr, report
    assert done.returncode == 0, report
    assert " builds, 0 findings" in done.stdout, report
