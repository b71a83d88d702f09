"""``trt-otel mcp``, driven by the official MCP SDK's own client over stdio.

Every test starts the server as a real subprocess (``python -m trt_otel.app.cli mcp``) with a state
directory of its own, and the builds it starts are real ``trt-otel`` processes: a real
TensorRT-RTX build where the command offers that builder, the simulator otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

mcp = pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.types import CallToolResult, TextContent  # noqa: E402

from rtx_builds import (  # noqa: E402
    CONV_SHAPES,
    RESIDUAL_SHAPES,
    write_conv,
    write_residual,
)
from trt_otel.app.commands import build_parser  # noqa: E402
from trt_otel.builder.onnx_models import demo_model_bytes  # noqa: E402

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


def server(state_dir: Path) -> Client:
    return Client(
        StdioServerParameters(
            command=sys.executable,
            args=["-m", "trt_otel.app.cli", "mcp", "--state-dir", str(state_dir)],
            env={**os.environ},
        ),
        read_timeout_seconds=120,
    )


def run(test: Callable[[], Awaitable[None]]) -> None:
    anyio.run(test)


def payload(result: CallToolResult) -> dict[str, Any]:
    """A tool's answer: its structured content, which must match its text."""
    assert not result.is_error, _text(result)
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


def _text(result: CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result
    return _text(result)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "mnist.onnx"
    path.write_bytes(demo_model_bytes())
    return path


def start_arguments(model: Path, *options: str, slow: bool = False) -> dict[str, Any]:
    """A build: real where TensorRT-RTX is (a small conv net, or a deep residual net that
    takes a while, silent window included), simulated and paced otherwise (``model``)."""
    if REAL:
        if slow:
            path = write_residual(model.with_name("residual.onnx"))
            shape_ranges = RESIDUAL_SHAPES
        else:
            path = write_conv(model.with_name("conv.onnx"))
            shape_ranges = CONV_SHAPES
        real = ["--shapes", shape_ranges, "--no-gpu", "--grace", "2s"]
        return {"kind": "build", "model": str(path), "options": [*real, *options]}
    pace = ["--speed", "0.5"] if slow else ["--speed", "4"]
    return {"kind": "demo", "model": str(model), "options": [*pace, *options]}


def test_tools_are_listed_with_their_inputs(tmp_path: Path) -> None:
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
            }
            start = tools["start_build"].input_schema
            assert start["required"] == ["kind"]
            assert {"model", "output", "options"} <= set(start["properties"])

    run(test)


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
                    {"id": build_id, "since_seq": events["next_seq"], "limit": 5000},
                )
            )
            assert later["events"][0]["seq"] == events["next_seq"] + 1
            assert later["events"][-1]["type"] == "build_end"
            listed = payload(await client.call_tool("list_builds", {}))["builds"]
            assert [(b["id"], b["state"], b["outcome"]) for b in listed] == [
                (build_id, "finished", "success")
            ]

    run(test)


def test_a_build_cancelled_with_a_reason(tmp_path: Path, model: Path) -> None:
    async def test() -> None:
        async with server(tmp_path / "state") as client:
            status = payload(
                await client.call_tool("start_build", start_arguments(model, slow=True))
            )
            build_id = status["id"]
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

    run(test)


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

    run(test)


def test_a_restarted_server_finds_its_builds_again(tmp_path: Path, model: Path) -> None:
    state = tmp_path / "state"

    async def first() -> str:
        async with server(state) as client:
            status = payload(
                await client.call_tool("start_build", start_arguments(model, slow=True))
            )
            payload(await client.call_tool("wait_build", {"id": status["id"], "timeout_s": 60}))
            return str(status["id"])

    build_id = anyio.run(first)
    record = json.loads((state / build_id / "build.json").read_text())
    os.kill(record["pid"], 0)  # the build outlived the server that started it

    async def second() -> None:
        async with server(state) as client:
            listed = payload(await client.call_tool("list_builds", {}))["builds"]
            assert [(b["id"], b["state"]) for b in listed] == [(build_id, "running")]
            status = payload(await client.call_tool("build_status", {"id": build_id}))
            assert status["state"] == "running" and status["open_phases"]
            # The builder's process, live from the build's view: a verdict with its evidence.
            assert status["builder"]["state"] in ("working", "idle")
            assert status["builder"]["rss_bytes"] > 0
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": build_id, "until": "end", "timeout_s": 300}
                )
            )
            assert (ended["status"]["outcome"], ended["status"]["exit_code"]) == ("success", 0)

    try:
        anyio.run(second)
    finally:
        # A build left running by a failure: stopped, if its pid still names it.
        with contextlib.suppress(OSError):
            if build_id.encode() in Path(f"/proc/{record['pid']}/cmdline").read_bytes():
                os.kill(record["pid"], signal.SIGKILL)


def wait_until_gone(path: Path, timeout_s: float = 30) -> None:
    """Until ``path`` no longer exists (a build's process removes it as it exits)."""
    deadline = time.monotonic() + timeout_s
    while path.exists():
        assert time.monotonic() < deadline, f"{path} is still there"
        time.sleep(0.05)
