"""``trt-otel mcp``: a Model Context Protocol server (stdio) to start, follow and cancel builds.

Each tool is a thin layer over a fleet (:class:`trt_otel.app.fleets.BuildFleet`): every build
is a ``trt-otel`` process of its own with its HTTP view on loopback and its journal in the state
directory (or a Ray job's, in its shared folder), so the server holds nothing they do not, and
a restarted server finds them all again. A request the fleet refuses (a missing model, an option
the command line rejects, an unknown id) comes back as a tool error with the command's own
message.

Nothing a client sends reaches further than the user allowed: the paths it names (model, output,
path options) must resolve inside the server's roots (``--root``), an existing output is replaced
only with ``overwrite: true``, options that point a build at the network (an OTLP endpoint, a
cancel URL, a Pushgateway, a metrics port or address) are refused unless the server was started
with ``--allow-network-options``, every string is bounded before any work, and the server's log
lines hold at most a few hundred characters of any of it.
"""

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from trt_otel.app.fleet import Fleet
from trt_otel.app.fleet_documents import (
    BuildList,
    BuildRequest,
    BuildStatus,
    CancelAnswer,
    EventsPage,
    FitAnswer,
    WaitAnswer,
    output_schema,
)
from trt_otel.app.fleet_requests import (
    ALLOW_NETWORK,
    MAX_DURATION_CHARS,
    MAX_EVENTS,
    MAX_ID_CHARS,
    MAX_OPTION_CHARS,
    MAX_OPTIONS,
    MAX_PATH_CHARS,
    MAX_REASON_CHARS,
    NETWORK_SETTINGS,
    FleetError,
    rung_schema,
    settings_schema,
)
from trt_otel.app.fleets import BuildFleet
from trt_otel.app.retries import MAX_RUNG_CHARS, MAX_RUNGS
from trt_otel.core.version import __version__

T = TypeVar("T")
TypedOptions = dict[str, str | int | float | bool | list[str | int | float]]
"""A request's typed options (``settings``, a typed retry rung), as MCP's JSON carries them."""

INSTRUCTIONS = """\
Start, follow and cancel TensorRT engine builds. start_build returns a build's id at once (its
status, with a live page URL to show a person); wait_build blocks until the build progresses or
ends (or a timeout passes); build_status and build_events read it at any time; cancel_build
stops it (TensorRT stops at its next step; a build silent longer than its grace period is stopped
from outside). Builds keep running when this server stops; a new server finds them again.
Exit codes: 0 built, 3 cancelled or timed out, 4 failed. A build's options may be given as on
the command line (options) or typed (settings: start_build's schema lists them). Every path given
(model, output, a path in options or settings) must resolve, symlinks followed, inside one of the
server's roots: {roots}; an output
that exists is replaced only with overwrite: true. {network}. Strings are bounded (paths and
options {paths:,} characters, at most {options} options, an id {ids}, a reason {reasons}): a
longer one is refused."""
MAX_TOOL_NAME_CHARS = 64
MAX_ERROR_CHARS = 1000
"""A tool error's message at most (what the command line says of an option quotes it)."""
MAX_LOG_ARG_CHARS = 200
MAX_LOG_CHARS = 1000
"""What one log line of the server holds at most of one argument, and in all."""


# Long: the tools are declared where the server is made, each a short function over the
# fleet; their descriptions (what an agent reads) are most of the lines.
def create_server(fleet: BuildFleet) -> MCPServer:
    roots = ", ".join(map(str, fleet.roots))
    network = _network_rule(fleet.allow_network)
    instructions = INSTRUCTIONS.format(
        roots=roots,
        network=network[:1].upper() + network[1:],
        paths=MAX_PATH_CHARS,
        options=MAX_OPTIONS,
        ids=MAX_ID_CHARS,
        reasons=MAX_REASON_CHARS,
    )
    server = MCPServer(
        "trt-otel",
        instructions=instructions,
        version=__version__,
        middleware=[_bounded_tool_name],
    )
    inside = f"must resolve (symlinks followed) inside one of the server's roots: {roots}"
    id_field = Field(
        strict=True,
        description=f"the build's id, from start_build (12 hex digits; at most {MAX_ID_CHARS} "
        "characters)",
        json_schema_extra={"maxLength": MAX_ID_CHARS},
    )

    # The tool's parameters are its JSON schema; MCP passes them by name. Strict: a value of
    # another type is refused, not coerced ("yes" is no boolean, "5" and true no number).
    @server.tool()
    def start_build(  # noqa: PLR0917
        kind: Annotated[
            Literal["build", "demo"],
            Field(
                description="'build': a real engine from an ONNX model; 'demo': simulated",
            ),
        ],
        model: Annotated[
            str | None,
            Field(
                strict=True,
                description="path of the ONNX model (required for 'build'; a regular file); "
                f"it {inside}; at most {MAX_PATH_CHARS:,} characters",
                json_schema_extra={"maxLength": MAX_PATH_CHARS},
            ),
        ] = None,
        output: Annotated[
            str | None,
            Field(
                strict=True,
                description="where to write the engine (default: in the build's folder of the "
                "state directory); a file that exists is refused unless overwrite is true; "
                f"at most {MAX_PATH_CHARS:,} characters; it lies outside the builds' folders "
                f"and {inside}",
                json_schema_extra={"maxLength": MAX_PATH_CHARS},
            ),
        ] = None,
        options: Annotated[
            list[
                Annotated[
                    str, Field(strict=True, json_schema_extra={"maxLength": MAX_OPTION_CHARS})
                ]
            ]
            | None,
            Field(
                strict=True,
                description="more trt-otel options, as on its command line, e.g. ['--fp16', "
                "'--timeout', '30m', '--stall-timeout', '10m'] or, for a demo, ['--speed', "
                f"'4', '--silence', '20s']; at most {MAX_OPTIONS} of them, each at most "
                f"{MAX_OPTION_CHARS:,} characters; a path among them (--timing-cache, --trace, "
                f"--cancel-file, --history) {inside}; {network}",
                json_schema_extra={"maxItems": MAX_OPTIONS},
            ),
        ] = None,
        settings: Annotated[
            TypedOptions | None,
            Field(
                strict=True,
                description="more trt-otel options, typed (beside or instead of options): "
                "each by its long name without the dashes, true for a flag, a value, or a "
                "list for an option given more than once, e.g. {'fp16': true, 'timeout': "
                "'30m', 'stall-timeout': '10m', 'shapes': ['input:1x3x224x224,8x3x224x224,"
                "32x3x224x224']}; the options this server sets itself are not among them; a "
                f"path {inside}",
                json_schema_extra=settings_schema(
                    fleet.reserved, allow_network=fleet.allow_network
                ),
            ),
        ] = None,
        overwrite: Annotated[
            bool,
            Field(strict=True, description="replace the output if it exists (default: refuse to)"),
        ] = False,
        deadline: Annotated[
            str | None,
            Field(
                strict=True,
                description="the build must end within this ('20m', '1h30m'): stopped as soon "
                "as its projection (its history, --history in options; its progress) says it "
                "cannot, refused before it starts when its history says so (exit 3); over "
                "every retry",
                json_schema_extra={"maxLength": MAX_DURATION_CHARS},
            ),
        ] = None,
        retries: Annotated[
            list[
                Annotated[str, Field(strict=True, json_schema_extra={"maxLength": MAX_RUNG_CHARS})]
                | TypedOptions
            ]
            | None,
            Field(
                strict=True,
                description="a retry ladder: after a timeout, deadline, stall, memory limit or "
                "dead worker, build again with each rung's options laid over the original's, "
                "in order, each as on the command line or typed as settings are, e.g. "
                "['--builder-optimization-level 2', {'builder-optimization-level': 0, "
                "'workspace': '1G', 'timeout': '1h'}]; builder options, --timeout, "
                f"--stall-timeout; at most {MAX_RUNGS} rungs of {MAX_RUNG_CHARS} characters; "
                f"a path {inside}",
                json_schema_extra={
                    "maxItems": MAX_RUNGS,
                    "items": {
                        "anyOf": [{"type": "string", "maxLength": MAX_RUNG_CHARS}, rung_schema()]
                    },
                },
            ),
        ] = None,
    ) -> dict[str, Any]:
        """Start a build in a process of its own; returns its status (with its id) as soon as
        it is running. Paths are confined to the server's roots, an existing output is
        replaced only with overwrite: true, and options that point the build at the network
        (--otlp-endpoint, --cancel-url, --pushgateway, --prometheus-port, --prometheus-address)
        are refused unless the server was started with --allow-network-options."""
        request = BuildRequest(
            kind=kind,
            model=model,
            output=output,
            options=tuple(options or ()),
            settings=dict(settings or {}),
            overwrite=overwrite,
            deadline=deadline,
            retries=tuple(retries or ()),
        )
        return _answer(lambda: fleet.start(request))

    @server.tool()
    def will_it_fit(
        model: Annotated[
            str,
            Field(
                strict=True,
                description=f"path of the ONNX model; it {inside}",
                json_schema_extra={"maxLength": MAX_PATH_CHARS},
            ),
        ],
        deadline: Annotated[
            str,
            Field(
                strict=True,
                description="the time the build must end within: '20m', '1h30m'",
                json_schema_extra={"maxLength": MAX_DURATION_CHARS},
            ),
        ],
        history: Annotated[
            str,
            Field(
                strict=True,
                description="a directory of journals of earlier builds (of any model: those of "
                f"this one are used); it {inside}",
                json_schema_extra={"maxLength": MAX_PATH_CHARS},
            ),
        ],
    ) -> dict[str, Any]:
        """Would a build of this model end within the deadline? Answers from the earlier
        builds' journals without building: 'yes' (all of them did), 'no' (start_build with
        this deadline would refuse it), 'maybe' (some did), 'unknown' (none of this model),
        with the projection and the reason."""
        return _answer(lambda: fleet.fit(model, deadline, history))

    @server.tool()
    def list_builds() -> dict[str, Any]:
        """Every build of the state directory, oldest first, running or finished; with
        ``engines``, what the engine store did for them in one line (``engines: 3 served, 1
        rebuilt (options: +optimization_level 1)``), or null where none used one."""
        return _answer(lambda: BuildList.of(fleet.list()))

    @server.tool()
    def build_status(id: Annotated[str, id_field]) -> dict[str, Any]:
        """A build's state, progress, time left (with its basis), open phases, cancel and
        outcome (with the exit code); while it runs, the projection a deadline decides by
        (expected_s, earliest_s, basis, evidence); the forecast made before it started, from
        earlier builds (expected_s, p90_s, peak_rss_bytes, builds, basis, said, and its error
        once it succeeded), or null; in a retry ladder, every attempt so far (number,
        build_id, options, retry_reason, outcome, cancel)."""
        return _answer(lambda: fleet.status(id))

    @server.tool()
    def build_events(
        id: Annotated[str, id_field],
        since_seq: Annotated[
            int, Field(strict=True, description="return events after this seq (-1: from the first)")
        ] = -1,
        limit: Annotated[
            int,
            Field(
                strict=True,
                description=f"at most this many events: 1 to {MAX_EVENTS}; any other limit is "
                "refused (a tool error), not clamped",
                json_schema_extra={"minimum": 1, "maximum": MAX_EVENTS},
            ),
        ] = 200,
    ) -> dict[str, Any]:
        """A build's events after a seq, from its journal (as journal records), at most
        limit of them (1 to 1000); next_seq is the seq to ask from next time, and more says
        whether there are more."""
        return _answer(lambda: fleet.events(id, since_seq, limit))

    @server.tool()
    def wait_build(
        id: Annotated[str, id_field],
        until: Annotated[
            Literal["progress", "end"],
            Field(
                description="'progress': any step, phase, cancel or end; 'end': the end",
            ),
        ] = "progress",
        timeout_s: Annotated[
            float, Field(strict=True, description="give up after this many seconds", ge=0, le=600)
        ] = 30.0,
    ) -> dict[str, Any]:
        """Wait until the build progresses or ends, or the timeout passes; says which
        (reason: progressed, ended, timeout) with the build's status."""
        return _answer(lambda: fleet.wait(id, until, timeout_s))

    @server.tool()
    def cancel_build(
        id: Annotated[str, id_field],
        reason: Annotated[
            str,
            Field(
                strict=True,
                description=f"why, for the journal and the spans (at most {MAX_REASON_CHARS} "
                "characters)",
                json_schema_extra={"maxLength": MAX_REASON_CHARS},
            ),
        ] = "",
    ) -> dict[str, Any]:
        """Cancel a running build, with a reason."""
        return _answer(lambda: fleet.cancel(id, reason))

    publish_output_schemas(server)
    return server


OUTPUT_DOCUMENTS: dict[str, type[msgspec.Struct]] = {
    "start_build": BuildStatus,
    "will_it_fit": FitAnswer,
    "list_builds": BuildList,
    "build_status": BuildStatus,
    "build_events": EventsPage,
    "wait_build": WaitAnswer,
    "cancel_build": CancelAnswer,
}
"""What each tool answers: its output schema is the document's."""


def publish_output_schemas(server: MCPServer) -> None:
    """Each tool's output schema, derived from the document it answers with (the SDK would
    publish a bare object for a tool that returns a dict): a client checks every answer
    against it. The SDK reads a tool's schema from its metadata when it lists the tools."""
    for name, document in OUTPUT_DOCUMENTS.items():
        tool = server._tool_manager.get_tool(name)
        if tool is None:
            raise LookupError(f"no tool {name} to publish the output schema of")
        tool.fn_metadata.output_schema = output_schema(document)
        tool.__dict__.pop("output_schema", None)  # its cached copy, were it read already


def _answer(action: Callable[[], msgspec.Struct]) -> dict[str, Any]:
    """A tool's answer: the fleet's document as JSON's types, or the fleet's refusal as a
    tool error."""
    try:
        document = action()
    except FleetError as error:
        # The command line's own message may quote what was sent (every unrecognized option):
        # bounded like the rest.
        raise ToolError(str(_cut(str(error), MAX_ERROR_CHARS))) from None
    answer: dict[str, Any] = msgspec.to_builtins(document)
    return answer


async def _bounded_tool_name(
    ctx: ServerRequestContext[Any, Any], call_next: CallNext
) -> HandlerResult:
    """A call's tool name is bounded too: a long one is refused before anything looks it up
    (or echoes it back)."""
    params = ctx.params if isinstance(ctx.params, dict) else {}
    name = params.get("name")
    if ctx.method == "tools/call" and isinstance(name, str) and len(name) > MAX_TOOL_NAME_CHARS:
        said = f"the tool name is {len(name):,} characters long; at most {MAX_TOOL_NAME_CHARS}"
        return CallToolResult(content=[TextContent(type="text", text=said)], is_error=True)
    return await call_next(ctx)


class _BoundedLines(logging.Filter):
    """The server's log lines, the SDK's included (it logs a refused call with what was asked,
    an unknown tool's name say), hold at most :data:`MAX_LOG_ARG_CHARS` of each argument and
    :data:`MAX_LOG_CHARS` in all: a client's input is not echoed whole."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "trt_otel_bounded", False):
            return True  # cut once, by the first handler that saw it
        record.trt_otel_bounded = True
        if isinstance(record.args, tuple):
            record.args = tuple(_cut(arg, MAX_LOG_ARG_CHARS) for arg in record.args)
        message = record.getMessage()
        if len(message) > MAX_LOG_CHARS:
            record.msg, record.args = _cut(message, MAX_LOG_CHARS), None
        return True


def _network_rule(allowed: bool) -> str:
    """What the tools say of the options that point a build at the network."""
    names = ", ".join(NETWORK_SETTINGS.values())
    if allowed:
        return f"the options that point a build at the network ({names}) are allowed here"
    return (
        f"the options that point a build at the network ({names}) are refused: the server's "
        f"own OTEL_* settings apply (trt-otel mcp {ALLOW_NETWORK} allows them)"
    )


def _cut(value: object, limit: int) -> object:
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... ({len(value):,} characters)"
    return value


def bound_log_lines() -> None:
    """Every handler of the root logger (where the SDK's lines go) bounds its lines."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _BoundedLines) for f in handler.filters):
            handler.addFilter(_BoundedLines())


def serve(
    state_dir: Path, roots: Sequence[Path] | None = None, *, allow_network: bool = False
) -> None:
    """Serve over stdio until the client goes away. Paths are confined to ``roots`` (default:
    the state directory and the working directory); the options that point a build at the
    network are refused unless ``allow_network``."""
    server = create_server(Fleet(state_dir, roots=roots, allow_network=allow_network))
    bound_log_lines()  # after the server, which sets up the logging
    server.run("stdio")


def serve_fleet(fleet: BuildFleet) -> None:
    """Serve over stdio, each build a job of a scheduler's fleet (``--ray``, ``--slurm``);
    paths confined to its shared folder."""
    server = create_server(fleet)
    bound_log_lines()
    server.run("stdio")
