"""``trt-otel mcp`` as an MCP client sees it, through the official MCP SDK: the server over
stdio (a real subprocess), a test's async body run to its end, and a tool's answer or error.
Skips the tests that import it where the SDK is not installed."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio
import pytest

from cli import CLI_MODULE

pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent


def server(
    state_dir: Path,
    *roots: Path,
    cwd: Path | None = None,
    errlog: TextIO | None = None,
    flags: Sequence[str] = (),
) -> Client:
    """The server over stdio, started in ``cwd`` (default: the state directory's parent, so
    that with no ``roots`` the test's files are inside its default roots), with ``flags``."""
    args = [*CLI_MODULE, "mcp", "--state-dir", str(state_dir), *flags]
    for root in roots:
        args += ["--root", str(root)]
    parameters = StdioServerParameters(
        command=sys.executable, args=args, env={**os.environ}, cwd=str(cwd or state_dir.parent)
    )
    if errlog is None:
        return Client(parameters, read_timeout_seconds=120)
    return Client(stdio_client(parameters, errlog=errlog), read_timeout_seconds=120)


async def call_once(
    flags: Sequence[str],
    name: str,
    arguments: dict[str, Any],
    *,
    env: dict[str, str],
    cwd: Path,
    timeout_s: float = 300,
) -> dict[str, Any]:
    """One tool call on a new ``trt-otel mcp FLAGS`` server over stdio, which ends after it:
    the tool's structured answer (a restarted server must find what the last one left)."""
    parameters = StdioServerParameters(
        command=sys.executable, args=[*CLI_MODULE, "mcp", *flags], env=env, cwd=str(cwd)
    )
    async with Client(parameters, read_timeout_seconds=timeout_s) as client:
        result = await client.call_tool(name, arguments)
        assert not result.is_error, result.content
        content: dict[str, Any] | None = result.structured_content
        assert content is not None
        return content


def run_async(test: Callable[[], Awaitable[None]]) -> None:
    """Run a test's async body (its client calls) to its end."""
    anyio.run(test)


def payload(result: CallToolResult) -> dict[str, Any]:
    """A tool's answer: its structured content, which must match its text."""
    assert not result.is_error, tool_text(result)
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


def tool_text(result: CallToolResult) -> str:
    """The text of a tool's answer, its parts joined."""
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


def error_text(result: CallToolResult) -> str:
    """The text of a tool's answer, which must be an error."""
    assert result.is_error, result
    return tool_text(result)
