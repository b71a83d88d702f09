"""``trt-otel mcp``: a Model Context Protocol server (stdio) to start, follow and cancel builds.

Each tool is a thin layer over :class:`trt_otel.app.fleet.Fleet`: every build is a ``trt-otel``
process of its own with its HTTP view on loopback and its journal in the state directory, so
the server holds nothing they do not, and a restarted server finds them all again. A request the
fleet refuses (a missing model, an option the command line rejects, an unknown id) comes back as
a tool error with the command's own message.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from trt_otel.app.fleet import Fleet, FleetError
from trt_otel.core.version import __version__

T = TypeVar("T")

INSTRUCTIONS = """\
Start, follow and cancel TensorRT engine builds. start_build returns a build's id at once (its
status, with a live page URL to show a person); wait_build blocks until the build progresses or
ends (or a timeout passes); build_status and build_events read it at any time; cancel_build
stops it (TensorRT stops at its next step; a build silent longer than its grace period is stopped
from outside). Builds keep running when this server stops; a new server finds them again.
Exit codes: 0 built, 3 cancelled or timed out, 4 failed."""


def create_server(fleet: Fleet) -> MCPServer:
    server = MCPServer("trt-otel", instructions=INSTRUCTIONS, version=__version__)

    @server.tool()
    def start_build(
        kind: Annotated[
            Literal["build", "demo"],
            Field(description="'build': a real engine from an ONNX model; 'demo': simulated"),
        ],
        model: Annotated[
            str | None,
            Field(description="path of the ONNX model (required for 'build'; a file)"),
        ] = None,
        output: Annotated[
            str | None,
            Field(description="where to write the engine (default: in the build's folder)"),
        ] = None,
        options: Annotated[
            list[str] | None,
            Field(
                description="more trt-otel options, as on its command line, e.g. ['--fp16', "
                "'--timeout', '30m', '--stall-timeout', '10m'] or, for a demo, ['--speed', "
                "'4', '--silence', '20s']"
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Start a build in a process of its own; returns its status (with its id) as soon as
        it is running."""
        return _call(lambda: fleet.start(kind, model=model, output=output, options=options or ()))

    @server.tool()
    def list_builds() -> dict[str, Any]:
        """Every build of the state directory, oldest first, running or finished."""
        return {"builds": _call(fleet.list)}

    @server.tool()
    def build_status(
        id: Annotated[str, Field(description="the build's id, from start_build")],
    ) -> dict[str, Any]:
        """A build's state, progress, time left (with its basis), open phases, cancel and
        outcome (with the exit code)."""
        return _call(lambda: fleet.status(id))

    @server.tool()
    def build_events(
        id: Annotated[str, Field(description="the build's id")],
        since_seq: Annotated[
            int, Field(description="return events after this seq (-1: from the first)")
        ] = -1,
        limit: Annotated[int, Field(description="at most this many", ge=1, le=5000)] = 200,
    ) -> dict[str, Any]:
        """A build's events after a seq, from its journal (as journal records); next_seq
        is the seq to ask from next time."""
        return _call(lambda: fleet.events(id, since_seq, limit))

    @server.tool()
    def wait_build(
        id: Annotated[str, Field(description="the build's id")],
        until: Annotated[
            Literal["progress", "end"],
            Field(description="'progress': any step, phase, cancel or end; 'end': the end"),
        ] = "progress",
        timeout_s: Annotated[
            float, Field(description="give up after this many seconds", ge=0, le=600)
        ] = 30.0,
    ) -> dict[str, Any]:
        """Wait until the build progresses or ends, or the timeout passes; says which
        (reason: progressed, ended, timeout) with the build's status."""
        return _call(lambda: fleet.wait(id, until, timeout_s))

    @server.tool()
    def cancel_build(
        id: Annotated[str, Field(description="the build's id")],
        reason: Annotated[str, Field(description="why, for the journal and the spans")] = "",
    ) -> dict[str, Any]:
        """Cancel a running build, with a reason."""
        return _call(lambda: fleet.cancel(id, reason))

    return server


def _call(action: Callable[[], T]) -> T:
    try:
        return action()
    except FleetError as error:
        raise ToolError(str(error)) from None


def serve(state_dir: Path) -> None:
    """Serve over stdio until the client goes away."""
    create_server(Fleet(state_dir)).run("stdio")
