"""``trt-otel mcp``, driven by the official MCP SDK's own client over stdio.

Every test starts the server as a real subprocess (``python -m trt_otel.app.cli mcp``) with a state
directory of its own, and the builds it starts are real ``trt-otel`` processes: a real
TensorRT-RTX build where the command offers that builder, the simulator otherwise.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from cli import CLI

mcp = pytest.importorskip("mcp")

from mcp.server.mcpserver.exceptions import ToolError  # noqa: E402

from mcp_client import error_text, payload, run_async, server  # noqa: E402
from rtx_builds import (  # noqa: E402
    HELD_BLOCKS,
    SILENT_BLOCKS,
    held_in_silent_step,
    write_conv,
    write_residual,
)
from trt_otel import BuildMonitor, JournalWriter, ManualClock, Outcome, read_journal  # noqa: E402
from trt_otel.app.commands import build_parser  # noqa: E402
from trt_otel.app.fleet import Fleet  # noqa: E402
from trt_otel.app.fleet_documents import BuildRequest, output_schema  # noqa: E402
from trt_otel.app.fleet_requests import FleetError, check_command_line  # noqa: E402
from trt_otel.app.fleet_status import JournalFold  # noqa: E402
from trt_otel.app.mcp_server import (  # noqa: E402
    MAX_LOG_ARG_CHARS,
    MAX_LOG_CHARS,
    OUTPUT_DOCUMENTS,
    bound_log_lines,
    create_server,
)
from trt_otel.builder.onnx_models import CONV_SHAPES, RESIDUAL_SHAPES  # noqa: E402
from trt_otel.core.attempts import ATTEMPT, ATTEMPTS  # noqa: E402
from trt_otel.core.forecast import Forecast  # noqa: E402
from trt_otel.core.state import BuildState  # noqa: E402
from waiting import wait_for_text, wait_until  # noqa: E402

pytestmark = pytest.mark.slow


def _real_builder() -> bool:
    """Whether ``trt-otel build`` can build with TensorRT-RTX here."""
    help_text = build_parser().format_help() + _build_help()
    return "tensorrt-rtx" in help_text and _importable("tensorrt_rtx")


def _build_help() -> str:
    parser = build_parser()
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict) and "build" in choices:
            return str(choices["build"].format_help())
    return ""


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


REAL = _real_builder()


@pytest.fixture
def model(mnist: Path) -> Path:
    """The demo's model (conftest's ``mnist``), in the test's folder."""
    return mnist


def start_arguments(
    model: Path, *options: str, slow: bool = False, blocks: int = SILENT_BLOCKS
) -> dict[str, Any]:
    """A build: real where TensorRT-RTX is (a small conv net, or a deep residual net of
    ``blocks`` that takes a while, silent window included), simulated and paced otherwise
    (``model``)."""
    if REAL:
        if slow:
            path = write_residual(model.with_name("residual.onnx"), blocks)
            shape_ranges = RESIDUAL_SHAPES
        else:
            path = write_conv(model.with_name("conv.onnx"))
            shape_ranges = CONV_SHAPES
        real = ["--shapes", shape_ranges, "--no-gpu", "--grace", "2s"]
        return {"kind": "build", "model": str(path), "options": [*real, *options]}
    pace = ["--speed", "0.5"] if slow else ["--speed", "4"]
    return {"kind": "demo", "model": str(model), "options": [*pace, *options]}


@pytest.mark.e2e
def test_tools_are_listed_with_their_inputs_and_outputs(tmp_path: Path) -> None:
    async def test() -> None:
        async with server(tmp_path / "state") as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {
                "start_build",
                "list_builds",
                "build_status",
                "build_events",
                "wait_build",
                "cancel_build",
                "will_it_fit",
            }
            start = tools["start_build"].input_schema
            assert start["required"] == ["kind"]
            assert {"model", "output", "options", "overwrite"} <= set(start["properties"])
            # The agent reads the rules where it reads the tools: the roots, overwrite, the
            # bounds.
            state, here = (tmp_path / "state").resolve(), tmp_path.resolve()
            roots = f"inside one of the server's roots: {state}, {here}"
            for name in ("model", "output", "options"):
                assert roots in start["properties"][name]["description"], name
            assert "unless overwrite is true" in start["properties"]["output"]["description"]
            assert start["properties"]["model"]["maxLength"] == 4096
            assert start["properties"]["options"]["maxItems"] == 64
            limit = tools["build_events"].input_schema["properties"]["limit"]
            assert (limit["minimum"], limit["maximum"]) == (1, 1000)
            assert "refused (a tool error), not clamped" in limit["description"]
            # Each answer's schema is its typed document's, which the client checks every
            # answer against (payload() reads only answers that passed).
            for name, document in OUTPUT_DOCUMENTS.items():
                assert tools[name].output_schema == output_schema(document), name
            status = tools["build_status"].output_schema
            assert status is not None and "running" in status["properties"]["state"]["enum"]
            assert status["$defs"]["OpenPhase"]["required"] == ["name", "steps", "elapsed_s"]

    run_async(test)


@pytest.mark.e2e
def test_a_build_followed_to_success(tmp_path: Path, model: Path) -> None:
    async def test() -> None:
        async with server(tmp_path / "state") as client:
            started = time.monotonic()
            arguments = {**start_arguments(model), "output": str(tmp_path / "mnist.engine")}
            status = payload(await client.call_tool("start_build", arguments))
            assert time.monotonic() - started < 30
            build_id = status["id"]
            assert status["state"] in ("starting", "running", "finished")
            assert status["url"].startswith("http://127.0.0.1:")
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": build_id, "until": "end", "timeout_s": 300}
                )
            )
            assert ended["reason"] == "ended"
            final = ended["status"]
            assert (final["state"], final["outcome"], final["exit_code"]) == (
                "finished",
                "success",
                0,
            )
            assert final["progress"] == 1.0
            assert final["engine"] == str(tmp_path / "mnist.engine")
            # The build wrote its view's URL for the server to read, and took it back at its end.
            wait_until_gone(tmp_path / "state" / build_id / "http.url")
            # From the journal once it ended: the builder's last sample and its peak memory.
            assert final["builder"]["peak_rss_bytes"] >= final["builder"]["rss_bytes"] > 0
            assert (tmp_path / "mnist.engine").stat().st_size > 0
            events = payload(await client.call_tool("build_events", {"id": build_id, "limit": 5}))
            assert [e["seq"] for e in events["events"]] == [0, 1, 2, 3, 4]
            assert events["events"][0]["type"] == "build_start"
            backend = events["events"][0]["attributes"]["trt.backend"]
            assert backend == ("tensorrt-rtx" if REAL else "simulator")
            assert events["more"] is True
            later = payload(
                await client.call_tool(
                    "build_events",
                    {"id": build_id, "since_seq": events["next_seq"], "limit": 1000},
                )
            )
            assert later["events"][0]["seq"] == events["next_seq"] + 1
            assert later["events"][-1]["type"] == "build_end"
            assert later["more"] is False, "the rest of the journal fitted in the page"
            listed = payload(await client.call_tool("list_builds", {}))["builds"]
            assert [(b["id"], b["state"], b["outcome"]) for b in listed] == [
                (build_id, "finished", "success")
            ]

    run_async(test)


@pytest.mark.e2e
def test_a_build_cancelled_with_a_reason(tmp_path: Path, model: Path) -> None:
    state = tmp_path / "state"

    async def test() -> None:
        # A real build is held in its silent step while it is cancelled (left to its own
        # work, it once ended before the cancel reached it on a loaded machine), and let go
        # once the cancel is in its journal: its next step is refused. The hold is taken
        # while the client waits for progress (taken after it, on a loaded machine, it once
        # came after the build's end).
        async with server(state) as client, contextlib.AsyncExitStack() as hold:
            arguments = start_arguments(model, slow=True, blocks=HELD_BLOCKS)
            status = payload(await client.call_tool("start_build", arguments))
            build_id = status["id"]
            journal = state / build_id / "journal.jsonl"
            async with anyio.create_task_group() as holding:
                if REAL:
                    held = held_in_silent_step(journal)
                    holding.start_soon(anyio.to_thread.run_sync, hold.enter_context, held)
                progressed = payload(
                    await client.call_tool("wait_build", {"id": build_id, "timeout_s": 60})
                )
                assert progressed["reason"] == "progressed"
            cancelled = payload(
                await client.call_tool(
                    "cancel_build", {"id": build_id, "reason": "the GPU is needed elsewhere"}
                )
            )
            assert cancelled["accepted"] and cancelled["first"]
            if REAL:
                await anyio.to_thread.run_sync(wait_for_text, journal, b'"type":"cancel"')
                await hold.aclose()
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": build_id, "until": "end", "timeout_s": 120}
                )
            )
            final = ended["status"]
            assert (final["outcome"], final["exit_code"]) == ("cancellation", 3)
            assert final["cancel"] == {"reason": "the GPU is needed elsewhere", "source": "http"}
            again = await client.call_tool("cancel_build", {"id": build_id})
            assert "not running (finished)" in error_text(again)

    run_async(test)


@pytest.mark.e2e
def test_typed_settings_reach_the_build_as_its_options(tmp_path: Path, model: Path) -> None:
    """An agent gives options typed, by name: the build runs with them (here a timeout that
    stops a paced demo, which would otherwise run for tens of seconds)."""

    async def test() -> None:
        async with server(tmp_path / "state") as client:
            settings = {"speed": "0.5", "timeout": "2s", "no-gpu": True, "verbose": False}
            status = payload(
                await client.call_tool(
                    "start_build", {"kind": "demo", "model": str(model), "settings": settings}
                )
            )
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": status["id"], "until": "end", "timeout_s": 120}
                )
            )
            final = ended["status"]
            assert (final["outcome"], final["exit_code"]) == ("timeout", 3), final
            assert final["cancel"]["source"] == "timeout", final["cancel"]
            refused = await client.call_tool(
                "start_build", {"kind": "demo", "settings": {"journal": "mine.jsonl"}}
            )
            assert "--journal is set by the server; leave it out" in error_text(refused)

    run_async(test)


@pytest.mark.e2e
def test_arguments_of_another_type_are_refused_not_coerced(tmp_path: Path) -> None:
    """JSON's types are the schema's: "yes" is no boolean, "5", 5.5 and true are no count, a
    number is no id. Coerced, "yes" would have replaced an existing engine."""

    async def test() -> None:
        async with server(tmp_path / "state") as client:
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("start_build", {"kind": "demo", "overwrite": "yes"}, "overwrite"),
                ("start_build", {"kind": "demo", "overwrite": 1}, "overwrite"),
                ("start_build", {"kind": "demo", "options": "--fp16"}, "options"),
                ("build_events", {"id": "0123456789ab", "limit": "5"}, "limit"),
                ("build_events", {"id": "0123456789ab", "limit": True}, "limit"),
                ("build_events", {"id": "0123456789ab", "since_seq": 5.5}, "since_seq"),
                ("build_status", {"id": 123456789012}, "id"),
                ("wait_build", {"id": "0123456789ab", "timeout_s": "1"}, "timeout_s"),
            ]
            for tool, arguments, name in cases:
                said = error_text(await client.call_tool(tool, arguments))
                assert name in said and "valid" in said, (tool, arguments, said)
            assert payload(await client.call_tool("list_builds", {}))["builds"] == []

    run_async(test)


@pytest.mark.e2e
def test_bad_requests_are_tool_errors(tmp_path: Path, model: Path) -> None:
    async def test() -> None:
        async with server(tmp_path / "state") as client:

            async def refused(arguments: dict[str, Any]) -> str:
                return error_text(await client.call_tool("start_build", arguments))

            missing = tmp_path / "missing.onnx"
            assert f"model not found: {missing}" in await refused(
                {"kind": "build", "model": str(missing)}
            )
            assert "not a regular file" in await refused({"kind": "build", "model": str(tmp_path)})
            assert "needs a model" in await refused({"kind": "build"})
            # The command line's own checks, with its own words.
            assert "'-5s' must be" in await refused(
                {"kind": "demo", "options": ["--timeout", "-5s"]}
            )
            assert "unrecognized arguments: --no-such-option" in await refused(
                {"kind": "demo", "options": ["--no-such-option"]}
            )
            assert "--http-port is set by the server" in await refused(
                {"kind": "demo", "options": ["--http-port", "80"]}
            )
            # Whatever the spelling: what the parser makes of the options decides.
            for options, owned in [
                (["-o/any/path"], "--output"),
                (["--output=/any/path"], "--output"),
                (["--http-address", "0.0.0.0"], "--http-address"),
                (["--journal=/tmp/elsewhere.jsonl"], "--journal"),
                (["--http-url-file", "/tmp/url"], "--http-url-file"),
                (["--cancel-token=X"], "--cancel-token"),
            ]:
                assert f"{owned} is set by the server" in await refused(
                    {"kind": "demo", "options": options}
                ), options
            # Options that would make the command print and exit rather than build.
            for option in ("--help", "-h", "--version", "--version=x"):
                assert f"{option.split('=')[0]} is set by the server" in await refused(
                    {"kind": "demo", "options": [option]}
                ), option
            # No abbreviations: --http-addr is not --http-address, nor --cancel-tok a token.
            for abbreviated in (["--http-addr", "0.0.0.0"], ["--cancel-tok", "X"], ["--out", "x"]):
                assert "unrecognized arguments" in await refused(
                    {"kind": "demo", "options": abbreviated}
                ), abbreviated
            assert "kind" in error_text(await client.call_tool("start_build", {"kind": "bake"}))
            assert "no build 'nope'" in error_text(
                await client.call_tool("build_status", {"id": "nope"})
            )
            unknown = "0123456789ab"
            assert f"no build '{unknown}'" in error_text(
                await client.call_tool("wait_build", {"id": unknown})
            )
            # Nothing was started, and the server still answers.
            assert payload(await client.call_tool("list_builds", {}))["builds"] == []
            assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
            blocked = tmp_path / "blocked"
            blocked.write_text("a file where the state directory would be")
            async with server(blocked) as other:
                said = error_text(await other.call_tool("start_build", {"kind": "demo"}))
                assert f"cannot start a build in {blocked}/" in said
            # A check the command makes only once it runs: the build stops before it starts,
            # the answer says why, and the attempt is on record.
            not_a_trace = tmp_path / "not-a-trace.jsonl"
            not_a_trace.write_text("this is not JSON\n")
            said = await refused({"kind": "demo", "options": ["--trace", str(not_a_trace)]})
            assert "the build did not start: trt-otel: error: " in said, said
            assert "not a trace callback" in said
            listed = payload(await client.call_tool("list_builds", {}))["builds"]
            assert [b["state"] for b in listed] == ["failed_to_start"]

    run_async(test)


@pytest.mark.e2e
def test_a_sample_interval_the_stall_timeout_cannot_hold_is_refused_from_an_agent(
    tmp_path: Path,
) -> None:
    """The command line's refusal holds for an agent's request, given in options or in a
    retry's rung, and nothing is started; the fleet's check (the local fleet's and Ray's) says
    the same."""

    async def test() -> None:
        async with server(tmp_path / "state") as client:

            async def refused(arguments: dict[str, Any]) -> str:
                return error_text(await client.call_tool("start_build", arguments))

            said = await refused(
                {"kind": "demo", "options": ["--sample-interval", "1m", "--stall-timeout", "5s"]}
            )
            assert "--sample-interval 1m00s is too long for --stall-timeout 5.0s" in said, said
            said = await refused(
                {"kind": "demo", "options": ["--sample-interval", "10s"],
                 "retries": ["--stall-timeout 5s"]}
            )  # fmt: skip
            assert "--sample-interval 10.0s is too long for --stall-timeout 5.0s" in said, said
            assert payload(await client.call_tool("list_builds", {}))["builds"] == []

    run_async(test)
    with pytest.raises(FleetError, match="is too long for --stall-timeout"):
        check_command_line(["demo", "--sample-interval", "1m", "--stall-timeout", "5s"])


@pytest.mark.e2e
def test_a_restarted_server_finds_its_builds_again(tmp_path: Path, model: Path) -> None:
    state = tmp_path / "state"

    # A real build is held in its silent step until the restarted server has seen it running
    # (a build left to run its course outlasted a restart only just on a loaded machine).
    hold = contextlib.ExitStack()

    async def first() -> str:
        async with server(state) as client:
            arguments = start_arguments(model, slow=True, blocks=HELD_BLOCKS)
            status = payload(await client.call_tool("start_build", arguments))
            if REAL:
                held = held_in_silent_step(state / status["id"] / "journal.jsonl")
                await anyio.to_thread.run_sync(hold.enter_context, held)
            else:
                await client.call_tool("wait_build", {"id": status["id"], "timeout_s": 60})
            running = payload(await client.call_tool("build_status", {"id": status["id"]}))
            assert running["state"] == "running", running
            return str(status["id"])

    try:
        build_id = anyio.run(first)
    except BaseException:
        hold.close()  # held until the second server has seen it: let go if there is none
        raise
    record = json.loads((state / build_id / "build.json").read_text())
    os.kill(record["pid"], 0)  # the build outlived the server that started it

    async def second() -> None:
        async with server(state) as client:
            listed = payload(await client.call_tool("list_builds", {}))["builds"]
            assert [(b["id"], b["state"]) for b in listed] == [(build_id, "running")]
            status = payload(await client.call_tool("build_status", {"id": build_id}))
            assert status["state"] == "running" and status["open_phases"]
            # The builder's process, live from the build's view: a verdict with its evidence.
            stopped = status["builder"]["state"] == "stopped"
            assert stopped if REAL else status["builder"]["state"] in ("working", "idle")
            assert status["builder"]["rss_bytes"] > 0
            hold.close()
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": build_id, "until": "end", "timeout_s": 300}
                )
            )
            assert (ended["status"]["outcome"], ended["status"]["exit_code"]) == ("success", 0)

    try:
        anyio.run(second)
    finally:
        hold.close()
        # A build left running by a failure: stopped, if its pid still names it.
        with contextlib.suppress(OSError):
            if build_id.encode() in Path(f"/proc/{record['pid']}/cmdline").read_bytes():
                os.kill(record["pid"], signal.SIGKILL)


@pytest.mark.e2e
def test_paths_are_confined_to_the_roots(tmp_path: Path, model: Path) -> None:
    root, outside = tmp_path / "work", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    mine = root / "mine.onnx"
    mine.write_bytes(model.read_bytes())
    secret = outside / "secret.onnx"
    secret.write_bytes(model.read_bytes())
    (root / "link.onnx").symlink_to(secret)  # inside by its name, outside by what it is
    (root / "out-link.engine").symlink_to(outside / "x.engine")  # dangling, to outside
    precious = root / "precious.engine"
    precious.write_text("not an engine: keep me")

    async def test() -> None:
        async with server(tmp_path / "state", root) as client:

            async def refused(arguments: dict[str, Any]) -> str:
                return error_text(await client.call_tool("start_build", arguments))

            named = f"outside the server's roots ({root.resolve()})"
            cases: list[dict[str, Any]] = [
                {"kind": "build", "model": str(secret)},
                {"kind": "demo", "model": str(root / "link.onnx")},
                {"kind": "demo", "model": str(root / ".." / "outside" / "secret.onnx")},
                {"kind": "demo", "output": str(outside / "x.engine")},
                {"kind": "demo", "output": str(root / "out-link.engine")},
                {"kind": "demo", "options": ["--timing-cache", str(outside / "cache")]},
                {"kind": "demo", "options": ["--trace", str(secret)]},
                {"kind": "demo", "options": [f"--history={outside}"]},
                {"kind": "demo", "options": ["--cancel-file", str(outside / "stop")]},
            ]
            for arguments in cases:
                assert named in await refused(arguments), arguments
            # The model is start_build's model argument, never an option (it is checked).
            assert "leave --model out" in await refused(
                {"kind": "demo", "options": ["--model", str(mine)]}
            )
            # An output that exists is kept, unless the call says to replace it.
            demo = {"kind": "demo", "model": str(mine), "options": ["--speed", "0"]}
            said = await refused({**demo, "output": str(precious)})
            assert f"output {precious.resolve()} exists" in said and "overwrite: true" in said
            assert precious.read_text() == "not an engine: keep me"
            status = payload(
                await client.call_tool(
                    "start_build", {**demo, "output": str(precious), "overwrite": True}
                )
            )
            assert status["engine"] == str(precious.resolve())
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": status["id"], "until": "end", "timeout_s": 120}
                )
            )
            assert ended["status"]["outcome"] == "success"
            assert precious.read_bytes() != b"not an engine: keep me"
        assert sorted(p.name for p in outside.iterdir()) == ["secret.onnx"]

    run_async(test)


@pytest.fixture
def cancel_flag() -> Iterator[tuple[str, threading.Event]]:
    """A real cancel URL answering ``true``; the event is set once a build has polled it."""
    polled = threading.Event()

    class Flag(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            polled.set()
            body = b'{"cancel": true, "reason": "the flag said so"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    flag = ThreadingHTTPServer(("127.0.0.1", 0), Flag)
    thread = threading.Thread(
        target=flag.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{flag.server_address[1]}/flag", polled
    finally:
        flag.shutdown()
        flag.server_close()


@pytest.mark.e2e
def test_options_that_point_a_build_at_the_network_need_the_servers_consent(
    tmp_path: Path, model: Path, cancel_flag: tuple[str, threading.Event]
) -> None:
    """A client may not make the server's builds send data to, poll, or listen on an address
    of its choosing, whatever the spelling, unless the server was started allowing it."""
    url, polled = cancel_flag
    network = [
        (["--otlp-endpoint", "http://collector.example:4318"], "--otlp-endpoint"),
        (["--otlp-endpoint=http://127.0.0.1:4318"], "--otlp-endpoint"),
        (["--cancel-url", url], "--cancel-url"),
        (["--pushgateway", "http://pushgateway.example:9091"], "--pushgateway"),
        (["--prometheus-port", "0"], "--prometheus-port"),
        (["--prometheus-address=localhost"], "--prometheus-address"),
    ]

    async def refused_by_default() -> None:
        async with server(tmp_path / "state") as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            start = tools["start_build"]
            said = start.input_schema["properties"]["options"]["description"]
            assert "--otlp-endpoint, --cancel-url, --pushgateway" in said
            assert "are refused" in said and "--allow-network-options" in said
            assert "--allow-network-options" in (start.description or "")
            for options, option in network:
                said = error_text(
                    await client.call_tool(
                        "start_build", {"kind": "demo", "model": str(model), "options": options}
                    )
                )
                assert f"{option} would point the build at an address" in said, options
                assert "trt-otel mcp --allow-network-options allows it" in said
            assert payload(await client.call_tool("list_builds", {}))["builds"] == []
        assert not polled.is_set()

    async def allowed() -> None:
        async with server(tmp_path / "state", flags=["--allow-network-options"]) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            said = tools["start_build"].input_schema["properties"]["options"]["description"]
            assert "are allowed here" in said
            slow = start_arguments(model, "--cancel-url", url, slow=True)
            status = payload(await client.call_tool("start_build", slow))
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": status["id"], "until": "end", "timeout_s": 120}
                )
            )
            assert ended["status"]["outcome"] == "cancellation", ended
            assert polled.is_set()

    run_async(refused_by_default)
    run_async(allowed)


@pytest.mark.e2e
def test_the_default_roots_are_the_state_and_working_directories(
    tmp_path: Path, model: Path
) -> None:
    state, cwd = tmp_path / "state", tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "mine.onnx").write_bytes(model.read_bytes())

    async def test() -> None:
        async with server(state, cwd=cwd) as client:

            async def refused(arguments: dict[str, Any]) -> str:
                return error_text(await client.call_tool("start_build", arguments))

            said = await refused({"kind": "demo", "model": str(model)})  # in tmp_path: outside
            assert f"outside the server's roots ({state.resolve()}, {cwd.resolve()})" in said
            # Relative paths are the working directory's, as the build reads them.
            slow = {"kind": "demo", "model": "mine.onnx", "options": ["--speed", "0.05"]}
            first = payload(await client.call_tool("start_build", {**slow, "output": "a.engine"}))
            assert first["engine"] == str((cwd / "a.engine").resolve())
            # Not the engine of a build still running, even with overwrite; not a build's
            # records.
            said = await refused({**slow, "output": "a.engine", "overwrite": True})
            assert f"is the engine of build {first['id']}, still running" in said
            journal = state / first["id"] / "journal.jsonl"
            said = await refused({**slow, "output": str(journal), "overwrite": True})
            assert f"in the folder of build {first['id']}" in said
            payload(await client.call_tool("cancel_build", {"id": first["id"]}))
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": first["id"], "until": "end", "timeout_s": 120}
                )
            )
            assert ended["status"]["outcome"] == "cancellation"

    run_async(test)


@pytest.mark.e2e
def test_a_root_that_is_not_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "mcp", "--root", str(tmp_path / "nowhere")],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"trt-otel: error: --root {tmp_path / 'nowhere'}: not a directory"


@pytest.mark.e2e
def test_inputs_are_bounded_before_any_work(tmp_path: Path) -> None:
    huge = "a" * 20_000_000
    too_long_id = "id is 20,000,000 characters long; at most 64"
    calls: list[tuple[str, dict[str, Any], str]] = [
        ("build_status", {"id": huge}, too_long_id),
        ("build_events", {"id": huge}, too_long_id),
        ("wait_build", {"id": huge}, too_long_id),
        ("cancel_build", {"id": huge}, too_long_id),
        ("cancel_build", {"id": "0123456789ab", "reason": "r" * 100_000},
         "reason is 100,000 characters long; at most 200"),
        ("start_build", {"kind": "demo", "model": huge},
         "model is 20,000,000 characters long; at most 4,096"),
        ("start_build", {"kind": "build", "output": huge},
         "output is 20,000,000 characters long; at most 4,096"),
        ("start_build", {"kind": "demo", "options": ["--fp16"] * 100_000},
         "options has 100,000 items; at most 64"),
        ("start_build", {"kind": "demo", "options": ["--speed", "1" * 100_000]},
         "options[1] is 100,000 characters long; at most 4,096"),
        ("start_build", {"kind": "demo", "model": "model\0.onnx"}, "model holds a NUL"),
        ("build_events", {"id": "0123456789ab", "limit": 1001}, "limit must be 1 to 1000"),
        ("build_events", {"id": "0123456789ab", "limit": 0}, "limit must be 1 to 1000"),
        ("build_events", {"id": "0123456789ab", "limit": -5}, "limit must be 1 to 1000"),
        ("build_status", {"id": "../x"}, "no build '../x' (ids are 12 hex digits)"),
        (huge[:1_000_000], {}, "the tool name is 1,000,000 characters long; at most 64"),
        # One past each bound is past it.
        (huge[:65], {}, "the tool name is 65 characters long; at most 64"),
        ("start_build", {"kind": "demo", "model": huge[:4097]},
         "model is 4,097 characters long; at most 4,096"),
    ]  # fmt: skip

    async def test() -> None:
        with open(tmp_path / "server.err", "w") as errlog:
            async with server(tmp_path / "state", errlog=errlog) as client:
                for tool, arguments, expected in calls:
                    started = time.monotonic()
                    said = error_text(await client.call_tool(tool, arguments))
                    assert expected in said, (tool[:20], said)
                    assert len(said) < 200, (tool[:20], said[:500])
                    assert time.monotonic() - started < 10, tool[:20]
                # The limit is checked, not the id, and a limit in range reaches the id.
                said = error_text(
                    await client.call_tool("build_events", {"id": "0123456789ab", "limit": 1000})
                )
                assert "no build '0123456789ab'" in said
                # Within the bounds, the command line's own message quotes what it refuses: cut.
                unknown = ["--no-such-option-" + "x" * 4000] * 64
                said = error_text(
                    await client.call_tool("start_build", {"kind": "demo", "options": unknown})
                )
                assert "unrecognized arguments: --no-such-option-xxx" in said
                assert len(said) < 1100 and said.endswith("characters)"), said[-100:]
                assert payload(await client.call_tool("list_builds", {}))["builds"] == []
        # The server's log says what was refused, in a few lines, never the input whole.
        logged = (tmp_path / "server.err").read_text()
        assert "characters long" in logged
        assert len(logged) < 1000 * len(calls), logged[:2000]

    run_async(test)


@contextlib.contextmanager
def bounded_root_log() -> Iterator[io.StringIO]:
    """What the root logger writes while the server's bound on log lines is set."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        bound_log_lines()
        yield stream
    finally:
        root.removeHandler(handler)


def test_log_lines_hold_no_input_whole() -> None:
    """The server's log lines (the SDK's too, which log what a refused call asked) are cut."""
    with bounded_root_log() as stream:
        sdk = logging.getLogger("mcp.server.mcpserver.server")
        sdk.warning("Tool %r failed: %r", "x" * 1_000_000, "y" * 1_000_000)
        logging.getLogger("trt_otel.test").warning("z" * 1_000_000)
        logging.getLogger("trt_otel.test").warning("w" * (MAX_LOG_CHARS + 1))  # just over
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("Tool 'xxx") and "(1,000,000 characters)" in lines[0]
    assert lines[1].startswith("zzz") and "(1,000,000 characters)" in lines[1]
    assert lines[2].startswith("www") and f"({MAX_LOG_CHARS + 1:,} characters)" in lines[2]
    assert all(len(line) < MAX_LOG_CHARS + 100 for line in lines), [len(x) for x in lines]


def test_log_lines_within_their_bounds_are_kept_whole() -> None:
    """An argument or a message exactly at its bound is not cut, nor said to be."""
    with bounded_root_log() as stream:
        logging.getLogger("trt_otel.test").warning("%s", "a" * MAX_LOG_ARG_CHARS)
        logging.getLogger("trt_otel.test").warning("b" * MAX_LOG_CHARS)
    assert stream.getvalue().splitlines() == ["a" * MAX_LOG_ARG_CHARS, "b" * MAX_LOG_CHARS]


def test_an_id_never_leaves_the_state_directory(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    record = {
        "kind": "demo",
        "argv": ["demo"],
        "pid": os.getpid(),
        "started_wall_s": 0.0,
        "model": None,
        "engine": None,
    }
    # A build's record outside the state directory, and one in a folder of it whose name is
    # an id and a newline: neither is a build of this state directory.
    elsewhere = tmp_path / "x"
    elsewhere.mkdir()
    (elsewhere / "build.json").write_text(json.dumps({**record, "id": "x"}))
    newline = state / "0123456789ab\n"
    newline.mkdir()
    (newline / "build.json").write_text(json.dumps({**record, "id": "0123456789ab\n"}))
    fleet = Fleet(state, roots=[tmp_path])
    bad_ids = [
        "../x",
        "0123456789ab/../../x",
        str(elsewhere),
        "/etc",
        "0123456789ab\0",
        "0123456789ab\n",
        "",
        ".",
        "0123456789AB",
    ]
    calls: list[Callable[[str], object]] = [
        fleet.folder,
        fleet.status,
        fleet.events,
        lambda i: fleet.wait(i, timeout_s=0),
        fleet.cancel,
    ]
    for build_id in bad_ids:
        for call in calls:
            with pytest.raises(FleetError, match=r"ids are 12 hex digits|holds a NUL|at most 64"):
                call(build_id)
    assert fleet.ids() == []
    assert fleet.list() == []


def wait_until_gone(path: Path, timeout_s: float = 30) -> None:
    """Until ``path`` no longer exists (a build's process removes it as it exits)."""
    wait_until(lambda: not path.exists(), f"{path} is still there", timeout_s)


def test_a_builds_journal_is_folded_as_it_grows(tmp_path: Path) -> None:
    """The fleet's status reads only what a journal gained since it last looked, and starts
    again on a journal that was replaced."""
    path = tmp_path / "journal.jsonl"
    fold = JournalFold(path)
    assert fold.update().build_id is None, "no journal yet"
    monitor = BuildMonitor()
    journal = JournalWriter(path)
    monitor.log.follow(journal)
    monitor.start()
    monitor.phase_start("Building engine", None, 3)
    monitor.step_complete("Building engine", 0)
    monitor.log.flush()
    seen = fold.update()
    assert seen.build_id == monitor.build_id and seen.steps_completed_total == 1
    read = path.stat().st_size
    monitor.step_complete("Building engine", 1)
    monitor.phase_finish("Building engine")
    monitor.end()
    monitor.close()
    assert fold.update().steps_completed_total == 2
    assert fold.update().outcome is Outcome.SUCCESS
    assert fold._offset == path.stat().st_size > read, "each byte read once"
    whole = BuildState()
    for event in read_journal(path).events:
        whole.apply(event)
    assert fold.state.progress_ratio() == whole.progress_ratio()
    # Replaced (a new build in the same place): read again from its start.
    replacement = tmp_path / "new.jsonl"
    other = BuildMonitor()
    other.log.follow(JournalWriter(replacement))
    other.start()
    other.close()
    replacement.replace(path)
    assert fold.update().build_id == other.build_id
    assert fold.state.outcome is None and fold.state.steps_completed_total == 0


def test_a_build_s_metrics_are_not_served_beyond_loopback(tmp_path: Path) -> None:
    """--prometheus-address is not the server's to set, but a client may not open the build's
    metrics (its model's path, its phases) on every interface either, however it is spelt."""
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    for options in (
        ["--prometheus-port", "0", "--prometheus-address", "0.0.0.0"],
        ["--prometheus-port", "0", "--prometheus-address=::"],
        ["--prometheus-port=0", "--prometheus-address", "192.0.2.7"],
        ["--prometheus-address", "gpu-box.example"],
    ):
        with pytest.raises(FleetError, match="is not a loopback address"):
            fleet.start(BuildRequest(kind="demo", options=tuple(options)))
    assert fleet.ids() == []


def test_only_a_loopback_url_file_whole_is_a_builds_view(tmp_path: Path) -> None:
    """A build's ``http.url`` is followed only when it is a loopback URL and nothing more: one
    that goes on (``@evil.example``, a path) would send its status reads and its cancel, with
    the token, elsewhere."""
    state = tmp_path / "state"
    folder = state / "0123456789ab"
    folder.mkdir(parents=True)
    record = {
        "id": "0123456789ab",
        "kind": "demo",
        "argv": ["demo"],
        "pid": os.getpid(),
        "started_wall_s": 0.0,
        "model": None,
        "engine": None,
    }
    (folder / "build.json").write_text(json.dumps(record))
    fleet = Fleet(state, roots=[tmp_path])
    for written, followed in [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080@evil.example", None),
        ("http://localhost:8080.evil.example", None),
        ("http://[::1]:8080/x", None),
    ]:
        (folder / "http.url").write_text(written + "\n")
        status = fleet.status("0123456789ab", live=False)
        assert status.url == followed, written


def test_an_output_that_is_a_dangling_link_is_not_written_through(tmp_path: Path) -> None:
    """A symlink as the output, to where nothing is yet: it exists, so it is refused like any
    output that exists (the engine would be written through the link)."""
    state = tmp_path / "state"
    link = tmp_path / "engine.link"
    link.symlink_to(tmp_path / "elsewhere.engine")
    not_a_trace = tmp_path / "not-a-trace.jsonl"  # were it started, it would stop at once
    not_a_trace.write_text("this is not JSON\n")
    fleet = Fleet(state, roots=[tmp_path])
    with pytest.raises(FleetError, match="exists; it is replaced only when the call says so"):
        fleet.start(
            BuildRequest(kind="demo", output=str(link), options=("--trace", str(not_a_trace)))
        )
    assert not (tmp_path / "elsewhere.engine").exists()


def crafted_build(state: Path, build_id: str, pid: int) -> Path:
    """A build's folder as the fleet writes it, for a process of the test's own: its journal's
    path."""
    folder = state / build_id
    folder.mkdir(parents=True)
    record = {"id": build_id, "kind": "demo", "argv": ["demo"], "pid": pid,
              "started_wall_s": time.time(), "model": None, "engine": None}  # fmt: skip
    (folder / "build.json").write_text(json.dumps(record))
    return folder / "journal.jsonl"


@contextlib.contextmanager
def stand_in(build_id: str) -> Iterator[subprocess.Popen[bytes]]:
    """A live process whose command line names ``build_id``, as a build's does."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", build_id])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_builds_status_carries_its_forecast_and_once_it_succeeded_its_error(
    tmp_path: Path,
) -> None:
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    clock = ManualClock()
    ahead = Forecast(10.0, 12.0, 3, "history", 1 << 30)

    def status_of(build_id: str, outcome: Outcome, forecast: Forecast | None) -> Any:
        journal = crafted_build(fleet.state_dir, build_id, pid=2**22 + 1)
        attributes = forecast.attributes() if forecast is not None else {}
        monitor = BuildMonitor(attributes=attributes, clock=clock)
        monitor.log.follow(JournalWriter(journal))
        monitor.start()
        clock.advance(12.5)
        monitor.end(outcome)
        monitor.close()
        said = fleet.status(build_id).forecast
        return msgspec.to_builtins(said) if said is not None else None

    assert status_of("0123456789aa", Outcome.SUCCESS, ahead) == {
        "expected_s": 10.0,
        "p90_s": 12.0,
        "peak_rss_bytes": 1 << 30,
        "builds": 3,
        "basis": "history",
        "said": "expected 10.0s (p90 12.0s), peak 1.0 GiB, from 3 builds",
        "error": 0.25,
    }
    failed = status_of("0123456789bb", Outcome.FAILURE, ahead)
    assert failed["error"] is None, "a failed build's time says nothing of the forecast"
    assert status_of("0123456789cc", Outcome.SUCCESS, None) is None


def test_build_events_page_on_from_the_last_event_given(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    journal = crafted_build(fleet.state_dir, "0123456789ab", pid=2**22 + 1)
    monitor = BuildMonitor()
    monitor.log.follow(JournalWriter(journal))
    monitor.phase_start("Building engine", None, 5)
    for step in range(5):
        monitor.step_complete("Building engine", step)
    monitor.end()
    monitor.close()
    first = fleet.events("0123456789ab", limit=3)
    assert [e["seq"] for e in first.events] == [0, 1, 2]
    assert (first.next_seq, first.more) == (2, True)
    second = fleet.events("0123456789ab", first.next_seq, limit=3)
    assert [e["seq"] for e in second.events] == [3, 4, 5]


@pytest.mark.e2e
def test_a_live_builds_state_follows_its_journal(tmp_path: Path) -> None:
    """Starting until its journal begins, running without its URL file yet, and, in a retry
    ladder, retrying after an attempt that is not the last, finished after the last one."""
    fleet = Fleet(tmp_path / "state", roots=[tmp_path])
    build_id = "00112233aabb"
    with stand_in(build_id) as process:
        journal = crafted_build(fleet.state_dir, build_id, process.pid)
        assert fleet.status(build_id).state == "starting"
        monitor = BuildMonitor(attributes={ATTEMPT: 1, ATTEMPTS: 2})
        monitor.log.follow(JournalWriter(journal))
        monitor.phase_start("Building engine", None, 3)  # a phase boundary: flushed
        assert monitor.log.flush(10.0)
        assert fleet.status(build_id).state == "running", "no URL file yet, but building"
        monitor.end(Outcome.TIMEOUT)
        monitor.close()
        assert fleet.status(build_id).state == "retrying"
        last = BuildMonitor(attributes={ATTEMPT: 2, ATTEMPTS: 2})
        last.log.follow(JournalWriter(journal, append=True))
        last.start()
        last.end(Outcome.TIMEOUT)
        last.close()
        assert fleet.status(build_id).state == "finished", "the last attempt ended"


@pytest.mark.e2e
def test_an_agent_asking_for_an_engine_the_store_holds_gets_it_without_a_build(
    tmp_path: Path, model: Path
) -> None:
    store = tmp_path / "store"

    async def test() -> None:
        async with server(tmp_path / "state") as client:
            hits = []
            for name in ("first", "second"):
                arguments = start_arguments(model, "--engine-store", str(store))
                arguments["output"] = str(tmp_path / f"{name}.engine")
                build_id = payload(await client.call_tool("start_build", arguments))["id"]
                waited = {"id": build_id, "until": "end", "timeout_s": 300}
                ended = payload(await client.call_tool("wait_build", waited))["status"]
                assert (ended["outcome"], ended["exit_code"]) == ("success", 0)
                events = payload(await client.call_tool("build_events", {"id": build_id}))
                start = events["events"][0]
                assert start["type"] == "build_start"
                hits.append(start["attributes"]["trt.store.hit"])
                phases = [e for e in events["events"] if e["type"] == "phase_start"]
                assert bool(phases) is (name == "first"), "the second is served, not built"
            assert hits == [False, True]
            first, second = (tmp_path / f"{n}.engine" for n in ("first", "second"))
            assert second.read_bytes() == first.read_bytes()

    run_async(test)


def test_the_start_tool_lists_the_settings_its_server_lets_a_request_set(tmp_path: Path) -> None:
    """The agent reads which options it may set, typed, where it reads the tool: not those the
    server sets, and the network's only with the server's consent."""

    def start_schema(allow_network: bool) -> dict[str, Any]:
        fleet = Fleet(tmp_path / "state", roots=[tmp_path], allow_network=allow_network)
        tools = anyio.run(create_server(fleet).list_tools)
        (start,) = [tool for tool in tools if tool.name == "start_build"]
        schema: dict[str, Any] = start.input_schema["properties"]
        return schema

    refusing, consenting = (start_schema(allowed)["settings"] for allowed in (False, True))
    assert refusing["additionalProperties"] is False
    assert refusing["properties"]["stall-timeout"]["type"] == "string"
    assert refusing["properties"]["fp16"]["type"] == "boolean"
    assert {"journal", "http-port", "output", "otlp-endpoint"}.isdisjoint(refusing["properties"])
    assert "otlp-endpoint" in consenting["properties"]
    assert "journal" not in consenting["properties"]
    # A rung of the ladder typed the same way: of the options a rung may give.
    rung = start_schema(False)["retries"]["items"]["anyOf"][1]
    assert {"timeout", "stall-timeout", "builder-optimization-level"} <= set(rung["properties"])
    assert "speed" not in rung["properties"]


def test_a_typed_setting_or_rung_of_the_wrong_shape_is_a_tool_error_before_anything_starts(
    tmp_path: Path,
) -> None:
    server = create_server(Fleet(tmp_path / "state", roots=[tmp_path]))

    async def refused(arguments: dict[str, Any]) -> str:
        with pytest.raises(ToolError) as error:
            await server.call_tool("start_build", {"kind": "demo", **arguments})
        return str(error.value)

    async def test() -> None:
        said = await refused({"settings": {"fp16": "yes"}})
        assert "settings['fp16'] is a flag: true or false" in said
        said = await refused({"retries": [{"speed": "2"}]})
        assert "retries[0]: 'speed' is no option of a retry rung" in said

    anyio.run(test)
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
