"""Where the supervisor's replay thread spends its time in the command itself, part by part.

``python benchmarks/replay_profile.py [STEPS]`` (default: a million steps) runs ``trt-otel demo
--trace T --speed 0`` of the phase-dense trace of ``command_cost.py`` with every view on
(``--journal``, ``--prometheus-port``, ``--http-port``, ``--otlp-endpoint`` of a collector that
is down, ``--cancel-file``) in a child process that samples the replay thread's stack: a thread
of its own reads it (``sys._current_frames``) every half millisecond, and the interpreter's
switch interval is 1 ms instead of 5, so the sampler gets the GIL that often. Each sample goes
to the first part below whose function is on the stack, so a subscriber's share is its own and
the read model's is what is left of the fold.

``projection_cost.py`` measures each part alone, in one thread; this is the same split in the
command, where the parts share the process with its other threads and the machine with the
worker. A sample is wall time of the replay thread: waiting for the GIL inside a part counts
to that part (the figures are shares, not CPU seconds), and the sampling itself slows the run.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

from command_cost import ROOT, phase_dense_trace

PARTS: tuple[tuple[str, frozenset[str]], ...] = (
    ("the live page's timeline", frozenset({"live.py:on_event", "live.py:on_steps"})),
    ("span export", frozenset({"otlp.py:on_event", "otlp.py:on_steps"})),
    ("log records", frozenset({"otlp_logs.py:on_event", "otlp_logs.py:on_steps"})),
    ("plain console lines", frozenset({"console.py:on_event", "console.py:on_steps"})),
    ("the journal's encoding", frozenset({"journal.py:encode_ahead"})),
    ("the HTTP feed", frozenset({"http_feed.py:handle"})),
    ("followers handed their batches", frozenset({"followers.py:offer_many"})),
    ("the read model (the fold, gaps, ETA)", frozenset({"readmodel.py:fold"})),
    ("the monitor (checks, events, the log)", frozenset({"monitor.py:record"})),
    ("the spool's frames decoded", frozenset({"transport.py:read"})),
)
"""Each part, by the functions that are its way in; a sample is the first part's whose
function is on its stack."""
OTHER = "other (waiting for frames, pacing)"
SAMPLE_S = 0.0005
SAMPLED = "--sampled"


def sampled_main(argv: list[str], out: Path) -> None:
    """In the child: run ``trt-otel`` on ``argv`` with the replay thread sampled; the counts
    of each part into ``out``."""
    sys.setswitchinterval(0.001)
    from trt_otel.capture import supervisor

    counts: collections.Counter[str] = collections.Counter()
    replay = supervisor._Replay._run

    def part_of(frame: FrameType | None) -> str:
        seen: set[str] = set()
        while frame is not None:
            code = frame.f_code
            seen.add(f"{os.path.basename(code.co_filename)}:{code.co_name}")
            frame = frame.f_back
        return next((name for name, ways_in in PARTS if ways_in & seen), OTHER)

    def sampled(self: supervisor._Replay) -> None:
        thread_id = threading.get_ident()
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                frame = sys._current_frames().get(thread_id)
                if frame is not None:
                    counts[part_of(frame)] += 1
                del frame
                time.sleep(SAMPLE_S)

        sampler = threading.Thread(target=sample, name="replay-sampler", daemon=True)
        sampler.start()
        try:
            replay(self)
        finally:
            done.set()
            sampler.join()
            out.write_text(json.dumps(dict(counts)))

    supervisor._Replay._run = sampled  # type: ignore[method-assign]
    from trt_otel.app.cli import main as cli

    sys.argv[0] = "trt-otel"
    cli(argv)


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    sys.path.insert(0, str(ROOT / "tests"))
    from prometheus_server import free_port

    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        trace, counts = folder / "trace.jsonl", folder / "counts.json"
        callbacks = phase_dense_trace(trace, steps)
        command = [
            sys.executable, __file__, SAMPLED, str(counts),
            "demo", "--trace", str(trace), "--speed", "0",
            "--journal", str(folder / "run.jsonl"),
            "--prometheus-port", str(free_port()),
            "--http-port", str(free_port()),
            "--otlp-endpoint", f"http://127.0.0.1:{free_port()}",
            "--cancel-file", str(folder / "stop"),
            "--no-progress", "--no-gpu",
        ]  # fmt: skip
        began = time.monotonic()
        done = subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False
        )
        wall_s = time.monotonic() - began
        if not counts.exists():
            print(f"the command left no samples (exit {done.returncode}): {done.stderr[-800:]}")
            return 1
        found: dict[str, int] = json.loads(counts.read_text())
    total = sum(found.values())
    print(
        f"{steps:,} steps, {callbacks:,} callbacks, every view on; the replay thread sampled "
        f"{total:,} times in {wall_s:.1f} s (exit {done.returncode}):"
    )
    for name in [*(name for name, _ in PARTS), OTHER]:
        print(f"  {name:42s} {found.get(name, 0) / total:6.1%}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == SAMPLED:
        sampled_main(sys.argv[3:], Path(sys.argv[2]))
    else:
        sys.exit(main())
