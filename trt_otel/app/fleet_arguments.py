"""``trt-otel fleet``'s command line: its parser, and the typed command it becomes.

Kept apart from the command's run (:mod:`trt_otel.app.fleet_command`), which needs Ray's client:
the parser (:mod:`trt_otel.app.commands`) imports this module, and nothing here imports Ray.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from trt_otel.app.arguments import Parser, non_negative_float, positive_seconds
from trt_otel.app.config import UsageError

ACTIONS = ("submit", "list", "status", "cancel", "wait")
RAY_ADDRESS_VARIABLE = "RAY_ADDRESS"
SHARED_DIR_VARIABLE = "TRT_OTEL_SHARED_DIR"


def add_ray_options(parser: argparse.ArgumentParser) -> None:
    """Where the builds run (Ray) and what every node sees (the shared folder)."""
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="Ray's job API: the head's dashboard address, e.g. http://head:8265 "
        f"(default: ${RAY_ADDRESS_VARIABLE})",
    )
    parser.add_argument(
        "--shared-dir",
        type=Path,
        metavar="DIR",
        help="a folder every Ray node sees at the same path (models, engines, journals, "
        f"cancel files; default: ${SHARED_DIR_VARIABLE})",
    )


def add_resource_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-gpus",
        type=non_negative_float,
        default=0.0,
        metavar="N",
        help="GPUs Ray reserves for each build (default: 0; 1 for a TensorRT build on a GPU)",
    )
    parser.add_argument(
        "--num-cpus",
        type=non_negative_float,
        default=1.0,
        metavar="N",
        help="CPUs Ray reserves for each build (default: 1)",
    )


# Long: one add_parser per action, each with its arguments, in the order --help shows them.
def add_fleet(commands: argparse._SubParsersAction[Parser]) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="submit, list, follow and cancel builds run as Ray jobs",
        description="Builds run as Ray jobs through Ray's Job Submission API (the entrypoint "
        "is `trt-otel build ...`), their files in a folder every node sees. Status and "
        "events come from each build's journal, the job's state from Ray; nothing else is "
        "kept, so any trt-otel pointed at the same Ray and folder sees the same builds.",
    )
    actions = fleet.add_subparsers(dest="action", required=True, metavar="ACTION")
    submit = actions.add_parser(
        "submit",
        help="submit a build as a Ray job",
        usage="trt-otel fleet submit [options] MODEL [-o ENGINE] [-- BUILD OPTIONS...]",
    )
    submit.add_argument("model", nargs="?", help="the ONNX model, in the shared folder")
    submit.add_argument("-o", "--output", help="the engine (default: in the build's folder)")
    submit.add_argument(
        "--demo", action="store_true", help="a simulated build (trt-otel demo) instead"
    )
    submit.add_argument("--overwrite", action="store_true", help="replace the output if it exists")
    add_resource_options(submit)
    submit.add_argument("options", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
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
        help="return at once (default: follow the build to its end, stopping its Ray job "
        "if it outlives its grace period)",
    )
    wait = actions.add_parser("wait", help="wait for a build's end; exits with its exit code")
    wait.add_argument("id")
    wait.add_argument(
        "--timeout", type=positive_seconds, default=24 * 3600.0, metavar="DURATION",
        help="give up after this long (exit 2; default: 24h)",
    )  # fmt: skip
    for sub in (submit, actions.choices["list"], status, cancel, wait):
        add_ray_options(sub)
        sub.add_argument("--json", action="store_true", help="print JSON, for programs")


@dataclass(frozen=True, slots=True)
class FleetCommand:
    """``trt-otel fleet ACTION``."""

    action: str
    address: str
    shared_dir: Path
    json: bool = False
    build_id: str | None = None
    kind: str = "build"
    model: str | None = None
    output: str | None = None
    options: tuple[str, ...] = ()
    overwrite: bool = False
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    reason: str = ""
    wait: bool = True
    timeout_s: float = 24 * 3600.0


def ray_target(address: str | None, shared_dir: Path | None) -> tuple[str, Path]:
    """The Ray address and the shared folder, given or from the environment, checked."""
    address = address or os.environ.get(RAY_ADDRESS_VARIABLE, "").strip()
    if not address:
        raise UsageError(f"give Ray's address: --ray http://HEAD:8265 (or ${RAY_ADDRESS_VARIABLE})")
    if not address.startswith(("http://", "https://")):
        raise UsageError(f"--ray {address!r}: Ray's job API is an http:// address (port 8265)")
    folder = shared_dir or Path(os.environ.get(SHARED_DIR_VARIABLE, "").strip() or ".")
    if shared_dir is None and not os.environ.get(SHARED_DIR_VARIABLE, "").strip():
        raise UsageError(f"give the shared folder: --shared-dir DIR (or ${SHARED_DIR_VARIABLE})")
    if not folder.expanduser().is_dir():
        raise UsageError(f"--shared-dir {folder}: not a directory")
    return address, folder.expanduser().resolve()


def fleet_command_of(args: argparse.Namespace) -> FleetCommand:
    address, shared_dir = ray_target(args.ray, args.shared_dir)
    common = {"action": args.action, "address": address, "shared_dir": shared_dir,
              "json": args.json}  # fmt: skip
    if args.action == "submit":
        options = list(args.options)
        if options[:1] == ["--"]:
            options = options[1:]
        if not args.demo and args.model is None:
            raise UsageError("fleet submit takes the model: trt-otel fleet submit MODEL ...")
        return FleetCommand(
            **common,
            kind="demo" if args.demo else "build",
            model=args.model,
            output=args.output,
            options=tuple(options),
            overwrite=args.overwrite,
            num_gpus=args.num_gpus,
            num_cpus=args.num_cpus,
        )
    if args.action == "list":
        return FleetCommand(**common)
    if args.action == "cancel":
        return FleetCommand(**common, build_id=args.id, reason=args.reason, wait=not args.no_wait)
    if args.action == "wait":
        return FleetCommand(**common, build_id=args.id, timeout_s=args.timeout)
    return FleetCommand(**common, build_id=args.id)
