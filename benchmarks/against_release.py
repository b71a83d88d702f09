"""The command's whole-tree cost now, against an earlier release's, side by side on one trace.

``python benchmarks/against_release.py [COMMIT] [STEPS] [ROUNDS]`` (default: the release
8f502ba, a million steps, three rounds): the release's code is checked out in a worktree of its
own and run by this checkout's interpreter and libraries, each run importing its own code alone
(the editable install's finder is set aside, so no module of this checkout slips in). Each round
runs, one after the other: this checkout with every view on, this checkout without the HTTP view
(``--http-port``), and the release with every view on, measured as ``command_cost.py`` measures
them: whole-tree CPU, peak resident set of the supervisor and the worker, and how long after the
last callback the journal's ``build_end`` was on disk.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from command_cost import ROOT, Run, phase_dense_trace, run_command

RELEASE = "8f502ba"
ENTRY = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {tree!r})
import trt_otel
assert trt_otel.__file__.startswith({tree!r}), trt_otel.__file__
from trt_otel.{module} import main
if __name__ == "__main__":
    sys.exit(main())
"""
"""The release's ``trt-otel``: a script (the build's worker, spawned, imports it again as its
main module, so it must be a file) that imports the release's code and none of this checkout's."""


def release_program(commit: str, folder: Path) -> list[str]:
    """A worktree of ``commit`` in ``folder``, and the command that runs its ``trt-otel``."""
    tree = folder / "release"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), commit],
        check=True,
    )
    module = "app.cli" if (tree / "trt_otel" / "app" / "cli.py").exists() else "cli"
    compiled(tree)
    entry = folder / "release_trt_otel.py"
    entry.write_text(ENTRY.format(tree=str(tree), module=module))
    return [sys.executable, str(entry)]


def remove_release(folder: Path) -> None:
    """Remove the worktree :func:`release_program` made in ``folder``."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder / "release")],
        check=False,
    )


def compiled(tree: Path) -> None:
    """Compile ``tree``'s package ahead, as an installed release's is: run where
    ``PYTHONDONTWRITEBYTECODE`` is set, a fresh worktree would compile every module afresh in
    every run, and the release would be charged for it."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tree / "trt_otel")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> int:
    commit = sys.argv[1] if len(sys.argv) > 1 else RELEASE
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        trace = folder / "trace.jsonl"
        callbacks = phase_dense_trace(trace, steps)
        release = release_program(commit, folder)
        compiled(ROOT)
        print(f"{steps:,} steps, {callbacks:,} callbacks; {rounds} rounds, alternating", flush=True)
        runs: dict[str, list[Run]] = {}
        try:
            for _ in range(rounds):
                for label, program, http in (
                    ("now, every view", None, True),
                    ("now, without --http-port", None, False),
                    (f"{commit}, every view", release, True),
                ):
                    run = run_command(trace, folder, speed=0, http=http, program=program)
                    runs.setdefault(label, []).append(run)
                    peaks = ", ".join(f"{k} {v:.0f} MiB" for k, v in sorted(run.peak_mib.items()))
                    print(
                        f"  {label:<28} CPU {run.cpu_s:5.1f} s; peak RSS {peaks}; build_end "
                        f"{run.last_callback_to_end_s:4.1f} s after the last callback; "
                        f"{run.events:,} events, exit {run.exit_code}",
                        flush=True,
                    )
        finally:
            remove_release(folder)
        print("medians:")
        for label, measured in runs.items():
            cpu = statistics.median(r.cpu_s for r in measured)
            peak = statistics.median(r.peak_mib.get("supervisor", 0.0) for r in measured)
            end = statistics.median(r.last_callback_to_end_s for r in measured)
            print(f"  {label:<28} CPU {cpu:5.1f} s, supervisor {peak:.0f} MiB, end {end:.1f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "tests"))
    sys.exit(main())
