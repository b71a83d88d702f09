"""``trt-otel store ACTION DIR``: look after an engine store (``--engine-store DIR``).

- ``ls``: every entry, the most recently used first: its key, model, backend and version, size,
  what serving it saves, and when it was last used;
- ``why MODEL``: whether a build of that ONNX file with the given builder options would be
  served, and if not, why (what differs from the nearest stored build of it);
- ``verify``: every entry's engine checked against its SHA-256 (exit 4 when one is not);
- ``prune --max SIZE``: the least recently used entries removed until the engines fit.

Every value read from the store is escaped before it is printed; with ``--json``, one JSON
document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trt_otel.app.arguments import add_builder_options, builder_options, size
from trt_otel.app.config import UsageError
from trt_otel.app.engine_store import unknown_gpu
from trt_otel.builder.build import model_attributes, read_model
from trt_otel.builder.options import BuildOptions
from trt_otel.builder.store import EngineStore, Entry, StoreError, miss_reason, store_key
from trt_otel.core.durations import format_duration
from trt_otel.core.sizes import format_bytes
from trt_otel.views.terminal import printable

ACTIONS = ("ls", "why", "verify", "prune")
EXIT_OK, EXIT_USAGE, EXIT_FAILED = 0, 2, 4


@dataclass(frozen=True, slots=True)
class StoreCommand:
    action: str
    directory: Path
    model: Path | None = None
    builder: BuildOptions | None = None
    backend: str | None = None
    max_bytes: int | None = None
    json: bool = False


def add_store(commands: argparse._SubParsersAction[Any]) -> None:
    store = commands.add_parser(
        "store",
        help="list, explain, verify and prune an engine store (--engine-store DIR)",
        description="Look after the folder --engine-store serves engines from.",
    )
    actions = store.add_subparsers(dest="store_action", required=True, metavar="ACTION")
    listing = actions.add_parser("ls", help="every engine, the most recently used first")
    why = actions.add_parser(
        "why", help="would a build of MODEL (with these builder options) be served, and why not"
    )
    why.add_argument("model", type=Path, help="the ONNX model")
    why.add_argument(
        "--backend", help="the backend the build would use (default: the one installed)"
    )
    verify = actions.add_parser("verify", help="check every engine against its SHA-256")
    prune = actions.add_parser("prune", help="remove the least recently used engines")
    prune.add_argument(
        "--max", dest="max_bytes", type=size, required=True, metavar="SIZE", help="e.g. 50GiB"
    )
    for parser in (listing, why, verify, prune):
        parser.add_argument("directory", type=Path, metavar="DIR", help="the engine store")
        parser.add_argument("--json", action="store_true", help="one JSON document")
    add_builder_options(why)


def store_command_of(args: argparse.Namespace) -> StoreCommand:
    action = args.store_action
    return StoreCommand(
        action,
        args.directory,
        model=getattr(args, "model", None),
        builder=builder_options(args) if action == "why" else None,
        backend=getattr(args, "backend", None),
        max_bytes=getattr(args, "max_bytes", None),
        json=args.json,
    )


def run_store(command: StoreCommand) -> int:
    if not command.directory.is_dir():
        raise UsageError(f"{command.directory}: no engine store there (not a folder)")
    try:
        store = EngineStore(command.directory)
    except StoreError as error:
        raise UsageError(str(error)) from None
    if command.action == "ls":
        return _show([_entry(e) for e in store.entries()], command.json, _entry_line)
    if command.action == "verify":
        problems = store.verify()
        answer = {"entries": len(store.entries()), "problems": problems}
        _print(answer, command.json, lambda a: [*map(printable, problems), _verdict(a)])
        return EXIT_FAILED if problems else EXIT_OK
    if command.action == "prune":
        assert command.max_bytes is not None
        removed = store.prune(command.max_bytes)
        answer = {"removed": [_entry(e) for e in removed], "bytes": store.size()}
        lines = [f"removed {printable(e.record.key[:12])}.." for e in removed]
        lines.append(f"{len(removed)} removed; {format_bytes(store.size())} left")
        _print(answer, command.json, lambda _: lines)
        return EXIT_OK
    return _why(store, command)


def _why(store: EngineStore, command: StoreCommand) -> int:
    from trt_otel.builder.build import select_backend
    from trt_otel.capture.backends import record_attributes

    assert command.model is not None and command.builder is not None
    backend, module = select_backend(command.backend)
    attributes = {
        **record_attributes(backend, module),
        **model_attributes(command.model, read_model(command.model)),
        **command.builder.attributes(),
    }
    unknown = unknown_gpu(attributes)
    if unknown is not None:
        raise UsageError(f"store why: {unknown}")
    key = store_key(attributes)
    entry = store.lookup(key, warn=lambda message: None)
    if entry is not None:
        answer = {"served": True, "key": key, "saves_s": entry.record.saves_s}
        line = f"served: {key[:12]}.. (saves {format_duration(entry.record.saves_s)})"
    else:
        reason = miss_reason(store.nearest(attributes), attributes)
        answer = {"served": False, "key": key, "reason": reason}
        line = f"built: {printable(reason)}"
    _print(answer, command.json, lambda _: [line])
    return EXIT_OK


def _entry(entry: Entry) -> dict[str, Any]:
    record = entry.record
    try:
        used = entry.folder.stat().st_mtime
    except OSError:
        used = record.created
    return {
        "key": record.key,
        "model": record.model_name,
        "backend": record.inputs.get("trt.backend", ""),
        "version": record.inputs.get("trt.version", ""),
        "bytes": record.engine_bytes,
        "saves_s": record.saves_s,
        "builds": len(record.build_s),
        "last_used": used,
        "host": record.host,
    }


def _entry_line(entry: dict[str, Any]) -> str:
    ago = format_duration(max(0.0, time.time() - entry["last_used"]))
    return printable(
        f"{entry['key'][:12]}..  {entry['model'] or '?'}  {entry['backend']} {entry['version']}"
        f"  {format_bytes(entry['bytes'])}  saves {format_duration(entry['saves_s'])}"
        f"  used {ago} ago"
    )


def _show(entries: list[dict[str, Any]], as_json: bool, line: Any) -> int:
    _print(
        {"entries": entries}, as_json, lambda _: [*map(line, entries), f"{len(entries)} entries"]
    )
    return EXIT_OK


def _verdict(answer: dict[str, Any]) -> str:
    problems = len(answer["problems"])
    if problems:
        return f"{problems} of {answer['entries']} entries damaged"
    return f"{answer['entries']} entries, all intact"


def _print(answer: dict[str, Any], as_json: bool, lines: Any) -> None:
    if as_json:
        sys.stdout.write(json.dumps(answer, indent=1) + "\n")
        return
    for text in lines(answer):
        sys.stdout.write(text + "\n")
