"""``trt-otel fleet``'s command line: its parser, and the typed command it becomes.

Kept apart from the command's run (:mod:`trt_otel.app.fleet_command`), which needs a scheduler's
client: the parser (:mod:`trt_otel.app.commands`) imports this module, and nothing here imports
Ray.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trt_otel.app.arguments import Parser, non_negative_float, positive_seconds
from trt_otel.app.config import UsageError

ACTIONS = ("submit", "list", "status", "cancel", "wait")
RAY_ADDRESS_VARIABLE = "RAY_ADDRESS"
SHARED_DIR_VARIABLE = "TRT_OTEL_SHARED_DIR"
Scheduler = Literal["ray", "slurm"]


def add_scheduler_options(parser: argparse.ArgumentParser) -> None:
    """Where the builds run (Ray or SLURM) and what every node sees (the shared folder)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="builds as Ray jobs: Ray's job API, the head's dashboard address, e.g. "
        f"http://head:8265 (default: ${RAY_ADDRESS_VARIABLE})",
    )
    where.add_argument(
        "--slurm",
        action="store_true",
        help="builds as SLURM batch jobs, on the cluster sbatch reaches from here",
    )
    parser.add_argument(
        "--shared-dir",
        type=Path,
        metavar="DIR",
        help="a folder every node sees at the same path (models, engines, journals, "
        f"cancel files; default: ${SHARED_DIR_VARIABLE})",
    )


def add_resource_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-gpus",
        type=non_negative_float,
        default=0.0,
        metavar="N",
        help="GPUs reserved for each build (default: 0; 1 for a TensorRT build on a GPU; "
        "SLURM: whole GPUs, --gres=gpu:N)",
    )
    parser.add_argument(
        "--num-cpus",
        type=non_negative_float,
        default=1.0,
        metavar="N",
        help="CPUs reserved for each build (default: 1; SLURM: --cpus-per-task)",
    )
    parser.add_argument(
        "--partition", metavar="NAME", help="SLURM's: the partition of each build's job"
    )
    parser.add_argument(
        "--time-limit",
        type=positive_seconds,
        metavar="DURATION",
        help="SLURM's: each build's time limit (--time); SLURM warns the build 120 s before "
        "it, and the build stops then as a timeout, its journal ended (at least 3m)",
    )


# Long: one add_parser per action, each with its arguments, in the order --help shows them.
def add_fleet(commands: argparse._SubParsersAction[Parser]) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="submit, list, follow and cancel builds run as Ray or SLURM jobs",
        description="Builds run as Ray jobs through Ray's Job Submission API (--ray), or as "
        "SLURM batch jobs (--slurm); each job runs `trt-otel build ...`, its files in a "
        "folder every node sees. Status and events come from each build's journal, the "
        "job's state from the scheduler; nothing else is kept, so any trt-otel pointed at "
        "the same scheduler and folder sees the same builds.",
    )
    actions = fleet.add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = actions.add_parser(
        "submit",
        help="submit a build as a job",
        usage="trt-otel fleet submit [options] MODEL [-o ENGINE] [-- BUILD OPTIONS...]",
    )
    submit.add_argument("model", nargs="?", help="the ONNX model, in the shared folder")
    submit.add_argument("-o", "--output", help="the engine (default: in the build's folder)")
    submit.add_argument(
        "--demo", action="store_true", help="a simulated build (trt-otel demo) instead"
    )
    submit.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    add_resource_options(submit)
    # The build's options are what follows ``--`` (split off by parse_command_line): a
    # positional that took the rest would take ``-o ENGINE`` after the model too.
    submit.set_defaults(options=[])
    submit.unrecognized_hint = "the build's options go after --: MODEL -- --fp16"
    actions.add_parser("list", help="every build of the shared folder, with its state")
    status = actions.add_parser("status", help="a build's state, progress, ETA and outcome")
    status.add_argument("id")
    cancel = actions.add_parser(
        "cancel", help="cancel a build at TensorRT's next step, with a reason"
    )
    cancel.add_argument("id")
    cancel.add_argument("--reason", default="", help="why: recorded in its journal and spans")
    cancel.add_argument(
        "--no-wait",
        action="store_true",
        help="return at once (default: follow the build to its end, stopping its job if it "
        "outlives its grace period)",
    )
    wait = actions.add_parser("wait", help="wait for a build's end; exits with its exit code")
    wait.add_argument("id")
    wait.add_argument(
        "--timeout", type=positive_seconds, default=24 * 3600.0, metavar="DURATION",
        help="give up after this long (exit 2; default: 24h)",
    )  # fmt: skip
    for sub in (submit, actions.choices["list"], status, cancel, wait):
        add_scheduler_options(sub)
        sub.add_argument("--json", action="store_true", help="print JSON, for programs")


@dataclass(frozen=True, slots=True)
class FleetCommand:
    """``trt-otel fleet ACTION``."""

    action: str
    shared_dir: Path
    scheduler: Scheduler = "ray"
    address: str | None = None
    """Ray's job API (Ray's builds)."""
    json: bool = False
    build_id: str | None = None
    kind: str = "build"
    model: str | None = None
    output: str | None = None
    options: tuple[str, ...] = ()
    overwrite: bool = False
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    partition: str | None = None
    time_limit_s: float | None = None
    reason: str = ""
    wait: bool = True
    timeout_s: float = 24 * 3600.0


def scheduler_target(
    address: str | None, slurm: bool, shared_dir: Path | None
) -> tuple[Scheduler, str | None, Path]:
    """The scheduler (Ray and its address, or SLURM) and the shared folder, given or from the
    environment, checked."""
    address = None if slurm else address or os.environ.get(RAY_ADDRESS_VARIABLE, "").strip()
    if not slurm and not address:
        raise UsageError(
            f"give Ray's address: --ray http://HEAD:8265 (or ${RAY_ADDRESS_VARIABLE}); or "
            "--slurm, for builds as SLURM jobs"
        )
    if address is not None and not address.startswith(("http://", "https://")):
        raise UsageError(f"--ray {address!r}: Ray's job API is an http:// address (port 8265)")
    folder = shared_dir or Path(os.environ.get(SHARED_DIR_VARIABLE, "").strip() or ".")
    if shared_dir is None and not os.environ.get(SHARED_DIR_VARIABLE, "").strip():
        raise UsageError(f"give the shared folder: --shared-dir DIR (or ${SHARED_DIR_VARIABLE})")
    if not folder.expanduser().is_dir():
        raise UsageError(f"--shared-dir {folder}: not a directory")
    return ("slurm" if slurm else "ray"), address, folder.expanduser().resolve()


def split_build_options(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``trt-otel fleet submit ... -- OPTIONS``: the command line before its first ``--``, and
    the build's options after it (none for another command, whose ``--`` is its own)."""
    words = list(argv)
    if words[:2] != ["fleet", "submit"] or "--" not in words:
        return words, []
    cut = words.index("--")
    return words[:cut], words[cut + 1 :]


def fleet_command_of(args: argparse.Namespace) -> FleetCommand:
    scheduler, address, shared_dir = scheduler_target(args.ray, args.slurm, args.shared_dir)
    common = {"action": args.action, "scheduler": scheduler, "address": address,
              "shared_dir": shared_dir, "json": args.json}  # fmt: skip
    if args.action == "submit":
        options = list(args.options)
        if options[:1] == ["--"]:
            options = options[1:]
        if not args.demo and args.model is None:
            raise UsageError("fleet submit takes the model: trt-otel fleet submit MODEL ...")
        if scheduler != "slurm" and (args.partition is not None or args.time_limit is not None):
            raise UsageError("--partition and --time-limit are SLURM's: give --slurm")
        return FleetCommand(
            **common,
            kind="demo" if args.demo else "build",
            model=args.model,
            output=args.output,
            options=tuple(options),
            overwrite=args.overwrite,
            num_gpus=args.num_gpus,
            num_cpus=args.num_cpus,
            partition=args.partition,
            time_limit_s=args.time_limit,
        )
    if args.action == "list":
        return FleetCommand(**common)
    if args.action == "cancel":
        return FleetCommand(**common, build_id=args.id, reason=args.reason, wait=not args.no_wait)
    if args.action == "wait":
        return FleetCommand(**common, build_id=args.id, timeout_s=args.timeout)
    return FleetCommand(**common, build_id=args.id)
