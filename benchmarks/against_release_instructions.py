"""The command's cost against an earlier release's, in instructions: a figure that the
machine's load hardly moves.

``python benchmarks/against_release_instructions.py [COMMIT] [STEPS] [MORE_STEPS]`` (default:
the release 8f502ba, 100,000 steps) runs ``trt-otel demo --trace T --speed 0`` of
``command_cost.py``'s phase-dense trace with every view on (as ``against_release.py`` does:
``--journal``, ``--prometheus-port``, ``--http-port``, ``--otlp-endpoint`` of a collector that
is down, ``--cancel-file``), once for this checkout and once for the release, each under valgrind's
callgrind with every child process and thread traced, and prints the instructions of the
supervisor's replay thread (the callbacks checked, folded and told to every view), of the whole
supervisor (its start-up and its other threads too) and of the worker.

Wall-clock CPU on a shared 2-core machine moves a run by a fifth from one run to the next
(``against_release.py``'s rounds put the same two trees 1.07 to 1.37 apart). The replay thread's
instructions follow the events, and come out the same run after run, so a ratio of a few
percent is a ratio. The processes' totals also hold threads whose work follows the clock
(samplers, pollers, followers waking), which valgrind slows some 50 times, more on a loaded
machine: those totals move by a few percent. An instruction count is not CPU time (cache
misses and waits are not in it), and the runs are slow, so the trace is small. Both trees are
compiled first, as an installed package is. Needs ``valgrind`` (Debian's package); without it,
it says so and exits 0.

With ``MORE_STEPS``, both sizes are run, and the difference between them is printed too: what
each further step costs, start-up left out, which is what a build of a million steps pays
(a run's total at one size mixes the two).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from against_release import RELEASE, compiled, release_program, remove_release
from command_cost import ROOT, phase_dense_trace

DEAD_COLLECTOR = "http://127.0.0.1:9"
SUMMARY = re.compile(rb"^(?:summary|totals): (\d+)$", re.MULTILINE)
COMMAND = re.compile(rb"^cmd: (.*)$", re.MULTILINE)
PID = re.compile(rb"^pid: (\d+)$", re.MULTILINE)
REPLAY = "the replay thread"
"""The supervisor's busiest thread: it takes the worker's callbacks, checks and folds them and
tells every view. Its instructions follow the events; the other threads' follow the clock too
(samplers, pollers, followers waking), which valgrind slows 50 times, as far as the machine's
load lets it: their counts move with the load, the replay thread's hardly do."""


def instructions(program: list[str], trace: Path, folder: Path) -> dict[str, int]:
    """Run ``program``'s demo of ``trace`` under callgrind; the instructions of each process by
    its role (``supervisor``, ``worker``), and of the supervisor's replay thread."""
    folder.mkdir()
    command = [
        "valgrind", "--tool=callgrind", "--trace-children=yes", "--separate-threads=yes",
        f"--callgrind-out-file={folder}/callgrind.%p",
        *program, "demo", "--trace", str(trace), "--speed", "0",
        "--journal", str(folder / "run.jsonl"), "--prometheus-port", "0", "--http-port", "0",
        "--otlp-endpoint", DEAD_COLLECTOR, "--cancel-file", str(folder / "stop"),
        "--no-progress", "--no-gpu",
    ]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the run failed (exit {done.returncode}): {done.stderr[-2000:]!r}")
    counts: dict[str, int] = {}
    threads: dict[bytes, list[int]] = {}
    for output in folder.glob("callgrind.*"):
        text = output.read_bytes()
        total, called, pid = SUMMARY.search(text), COMMAND.search(text), PID.search(text)
        if total is None or called is None or pid is None:
            continue
        # The worker is started by multiprocessing's spawn, the supervisor by the command;
        # anything else (multiprocessing's resource tracker, where a tree starts one) is other.
        line = called.group(1)
        role = "worker" if b"spawn_main" in line else "supervisor" if b" demo " in line else "other"
        counts[role] = counts.get(role, 0) + int(total.group(1))
        if role == "supervisor":
            threads.setdefault(pid.group(1), []).append(int(total.group(1)))
    if len(threads) == 1:
        counts[REPLAY] = max(next(iter(threads.values())))
    return counts


def main() -> int:
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt install valgrind): no instruction counts")
        return 0
    commit = sys.argv[1] if len(sys.argv) > 1 else RELEASE
    sizes = [int(steps) for steps in sys.argv[2:4]] or [100_000]
    runs: list[tuple[dict[str, int], dict[str, int]]] = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        release = release_program(commit, folder)  # compiled, as this checkout is below
        compiled(ROOT)
        try:
            for steps in sizes:
                trace = folder / f"trace-{steps}.jsonl"
                callbacks = phase_dense_trace(trace, steps)
                print(f"{steps:,} steps, {callbacks:,} callbacks, every view on, under callgrind")
                now = instructions(
                    [str(ROOT / ".venv" / "bin" / "trt-otel")], trace, folder / f"now-{steps}"
                )
                then = instructions(release, trace, folder / f"then-{steps}")
                report(commit, now, then)
                runs.append((now, then))
        finally:
            remove_release(folder)
    if len(runs) == 2:
        (now_small, then_small), (now_large, then_large) = runs
        print(f"each further {sizes[1] - sizes[0]:,} steps (the larger run less the smaller):")
        report(
            commit,
            {role: now_large.get(role, 0) - now_small.get(role, 0) for role in now_large},
            {role: then_large.get(role, 0) - then_small.get(role, 0) for role in then_large},
        )
    return 0


def report(commit: str, now: dict[str, int], then: dict[str, int]) -> None:
    for role in (REPLAY, "supervisor", "worker", "other"):
        if abs(now.get(role, 0)) < 1e6 and abs(then.get(role, 0)) < 1e6:
            continue  # neither tree has it (or, between two runs, neither grew)
        ratio = now.get(role, 0) / then[role] if then.get(role) else float("nan")
        print(
            f"  {role:<17} now {now.get(role, 0) / 1e6:8,.0f} M instructions, {commit} "
            f"{then.get(role, 0) / 1e6:8,.0f} M: {ratio:.3f}x"
        )
    total_now = sum(v for k, v in now.items() if k != REPLAY)
    total_then = sum(v for k, v in then.items() if k != REPLAY)
    print(
        f"  {'all':<17} now {total_now / 1e6:8,.0f} M instructions, {commit} "
        f"{total_then / 1e6:8,.0f} M: {total_now / total_then:.3f}x"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    sys.exit(main())
