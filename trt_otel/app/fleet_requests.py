"""What a caller may ask a fleet for, checked before anything is started (the local fleet's and
Ray's alike).

Every string is bounded (checked before any work, and never echoed whole); a start request's
options are read by ``trt-otel``'s own parser, against the fleet's own command line, so an option
is refused by what the parser makes of it (``-o/x``, ``--output=x``), never by its spelling:
what the fleet sets itself and the request's model are left alone, an option that points the
build at the network needs the fleet's consent, and every path the options name (a retry rung's
too) is confined where the fleet says. A refusal is a :class:`FleetError` whose message is the
caller's answer.

A request gives its options as on the command line (``options``), or typed (``settings``: each
option by its long name, with a boolean, a value or a list), or both. The typed settings are
declared nowhere of their own: they are the command's options as its parser declares them, and
become command-line tokens (``--name=value``, one token each, so no value is read as an
option) that go through the same checks as the rest.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from trt_otel.app.commands import build_parser, command_of
from trt_otel.app.config import UsageError
from trt_otel.app.fleet_documents import BuildRequest
from trt_otel.app.retries import MAX_RUNG_CHARS, MAX_RUNGS, rung_parser, rung_paths
from trt_otel.control.policies import MAX_REASON
from trt_otel.core.durations import DurationError, parse_positive_duration

KINDS = ("build", "demo")
RESERVED_OPTIONS = ("-h", "--help", "--version")
"""Options that would not start a build."""
RESERVED_SETTINGS = {
    "http_port": "--http-port",
    "http_address": "--http-address",
    "http_url_file": "--http-url-file",
    "http_allowed_host": "--http-allowed-host",
    "journal": "--journal",
    "cancel_token": "--cancel-token",
    "output": "--output",
}
"""What the fleet sets itself, by the parser's names for them: an option is refused by what
the parser makes of it (``-o/x``, ``--output=x``), never by its spelling."""
NETWORK_SETTINGS = {
    "otlp_endpoint": "--otlp-endpoint",
    "cancel_url": "--cancel-url",
    "pushgateway": "--pushgateway",
    "prometheus_port": "--prometheus-port",
    "prometheus_address": "--prometheus-address",
}
"""Options that make a build reach the network where the caller says: send its spans or metrics
to a URL, poll one, or listen on a port or an address. A client of the MCP server may not set
them unless the server was started with ``--allow-network-options``: otherwise only the server's
own settings (its ``OTEL_*`` environment) apply. Checked, like the reserved settings, by what
the parser makes of the options."""
ALLOW_NETWORK = "--allow-network-options"
MAX_ID_CHARS = 64
MAX_PATH_CHARS = 4096
MAX_OPTIONS = 64
MAX_OPTION_CHARS = 4096
MAX_REASON_CHARS = MAX_REASON
MAX_EVENTS = 1000
MAX_DURATION_CHARS = 32
"""The bounds on what a caller sends: the length of each string, the number of options, the
events one call returns."""
MAX_SETTING_NAME_CHARS = 64
_SHOWN_CHARS = 40
"""What a message quotes of a caller's string at most."""
OWN_FIELDS = {
    "model": "the request's model",
    "deadline": "the request's deadline",
    "retry": "the request's retries",
}
"""Options a request gives in fields of their own (by the parser's names), not as settings."""
MAX_SETTING_HELP_CHARS = 400
"""What a setting's description in a schema holds of its option's help at most."""


class FleetError(Exception):
    """A request the fleet cannot carry out; the message says why, for the caller."""


def bounded_request(request: BuildRequest) -> list[str]:
    """A start request's bounds and kind (the local fleet's and Ray's), checked before
    anything looks at it; its options with ``--deadline`` and the ``--retry`` rungs added."""
    check_text("kind", request.kind, max(map(len, KINDS)))
    if request.kind not in KINDS:
        raise FleetError(f"kind must be one of {', '.join(KINDS)}, not {request.kind!r}")
    for name, value in (("model", request.model), ("output", request.output)):
        if value is not None:
            check_text(name, value, MAX_PATH_CHARS)
    check_options(request.options)
    typed = settings_options(request.kind, request.settings)
    return [*request.options, *typed, *ladder_options(request.deadline, request.retries)]


def refuse_reserved(options: Sequence[str], setter: str) -> None:
    """Refuse the options the fleet sets itself (:data:`RESERVED_OPTIONS`), however given
    (``--version`` or ``--version=x``); ``setter`` says who sets them."""
    for option in options:
        name = option.split("=", 1)[0]
        if name in RESERVED_OPTIONS:
            raise FleetError(f"{name} is set by {setter}; leave it out")


def ladder_options(deadline: str | None, retries: Sequence[object]) -> list[str]:
    """``--deadline`` and the ``--retry`` rungs of a request (each a string, or typed as a
    request's settings are), bounded and checked here (the command line checks them again with
    the rest)."""
    added: list[str] = []
    if deadline is not None:
        check_text("deadline", deadline, MAX_DURATION_CHARS)
        try:
            parse_positive_duration(deadline)
        except DurationError as error:
            raise FleetError(f"deadline: {error}") from None
        added += ["--deadline", deadline]
    if len(retries) > MAX_RUNGS:
        raise FleetError(f"retries has {len(retries):,} rungs; at most {MAX_RUNGS}")
    for index, given in enumerate(retries):
        label = f"retries[{index}]"
        rung = (
            shlex.join(typed_options(label, rung_settings(), given, "a retry rung"))
            if isinstance(given, Mapping)
            else given
        )
        check_text(label, rung, MAX_RUNG_CHARS)
        added.append(f"--retry={rung}")  # one token: a rung of one flag is no option of ours
    return added


def checked_settings(
    kind: str,
    argv: list[str],
    options: Sequence[str],
    *,
    reserved: Mapping[str, str],
    setter: str,
    allow_network: bool,
    loopback_only: bool = False,
    inside: Callable[[str, Path], Path],
) -> argparse.Namespace:
    """The command line ``argv`` with a request's ``options``, as trt-otel's parser reads it
    (the local fleet's and Ray's), if the options leave alone what ``setter`` sets
    (``reserved``, by the parser's names) and the request's model, point the build at the
    network only where ``allow_network`` (and serve on loopback alone, ``loopback_only``), and
    name paths (a retry rung's too) that ``inside``
    confines."""
    # What the options make of the settings the fleet owns, against the command without them:
    # the parser's reading, whatever the spelling (``-o/x``, ``--output=x``).
    theirs, ours = check_command_line([*argv, *options]), check_command_line(argv)
    for name, option in reserved.items():
        if getattr(theirs, name, None) != getattr(ours, name, None):
            raise FleetError(f"{option} is set by {setter}; leave it out")
    if getattr(theirs, "model", None) != getattr(ours, "model", None):
        raise FleetError("the model is the request's model argument; leave --model out")
    if loopback_only:
        _check_loopback(theirs)
    check_network(theirs, ours, allowed=allow_network)
    # Every other path the options name (a timing cache, a trace, a cancel file, a history):
    # confined too, as the build (in this working directory) will read it.
    for dest, option in path_options(kind):
        value = getattr(theirs, dest, None)
        if dest not in reserved and dest != "model" and value is not None:
            inside(option, Path(value).absolute())
    for rung in getattr(theirs, "retry", None) or ():
        for option, path in checked_rung_paths(rung):
            inside(f"--retry {option}", path.absolute())
    return theirs


def checked_rung_paths(rung: str) -> list[tuple[str, Path]]:
    try:
        return rung_paths(rung)
    except UsageError as error:
        raise FleetError(str(error)) from None


def check_network(theirs: argparse.Namespace, ours: argparse.Namespace, *, allowed: bool) -> None:
    """Refuse, unless ``allowed``, the :data:`NETWORK_SETTINGS` the request's options change
    from the server's own command line (``ours``), by what the parser made of them."""
    if allowed:
        return
    for name, option in NETWORK_SETTINGS.items():
        if getattr(theirs, name, None) != getattr(ours, name, None):
            raise FleetError(
                f"{option} would point the build at an address of the caller's choosing; this "
                f"server refuses it (its own OTEL_* settings apply; trt-otel mcp {ALLOW_NETWORK} "
                "allows it)"
            )


def check_command_line(argv: Sequence[str]) -> argparse.Namespace:
    """Check a ``trt-otel`` command line with the command's own parser and checks: a bad one
    raises :class:`FleetError` with the command's message, and nothing is started. Returns what
    the parser made of it."""
    parser = build_parser()

    def refuse(message: str) -> NoReturn:
        raise FleetError(message)

    # argparse reports errors by printing and exiting; here they are the caller's answer.
    for sub in _subparsers(parser):
        sub.error = refuse  # type: ignore[method-assign]
    parser.error = refuse  # type: ignore[method-assign]
    args: argparse.Namespace = parser.parse_args(list(argv))
    try:
        command_of(args)
    except UsageError as error:
        raise FleetError(str(error)) from None
    return args


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.extend(action.choices.values())
    return found


def check_text(name: str, value: object, limit: int) -> None:
    """A caller's string: a string, at most ``limit`` characters, without a NUL (which no path
    or command line can carry). The refusal says how long it is, never what it holds."""
    if not isinstance(value, str):
        raise FleetError(f"{name} must be a string")
    if len(value) > limit:
        raise FleetError(f"{name} is {len(value):,} characters long; at most {limit:,}")
    if "\0" in value:
        raise FleetError(f"{name} holds a NUL character")


def check_options(options: Sequence[str]) -> None:
    """At most :data:`MAX_OPTIONS` options, each a bounded string."""
    if len(options) > MAX_OPTIONS:
        raise FleetError(f"options has {len(options):,} items; at most {MAX_OPTIONS}")
    for index, option in enumerate(options):
        check_text(f"options[{index}]", option, MAX_OPTION_CHARS)


def shown(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``text`` quoted for a message, cut at ``limit`` characters (and then says how long)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def _check_loopback(options: argparse.Namespace) -> None:
    """The server's builds serve on loopback only: their metrics too (what the build is, its
    model's path and phases), not on an interface a client chose."""
    address = getattr(options, "prometheus_address", None)
    if address is not None and not _loopback(address):
        raise FleetError(
            f"--prometheus-address {shown(address)} is not a loopback address: the "
            "server's builds serve on this machine only (127.0.0.1, ::1 or localhost)"
        )


def _loopback(address: str) -> bool:
    """Whether ``address`` (an IP literal or ``localhost``) is this machine's loopback."""
    if address.strip().lower().removesuffix(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def path_options(kind: str) -> list[tuple[str, str]]:
    """The options of ``trt-otel KIND`` that name a path: (the parser's name, the option)."""
    return [
        (option.dest, max(option.option_strings, key=lambda s: s.startswith("--")))
        for option in _command_parser(kind)._actions
        if option.type is Path and option.option_strings
    ]


# -- typed settings ------------------------------------------------------------------------------

SettingShape = Literal["flag", "value", "values"]
"""A flag (``true`` gives it, ``false`` leaves it out), one value, or a value for each time the
option may be given (a list)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One option of ``trt-otel KIND``, as a request's typed setting."""

    name: str
    """The option's long name without its dashes: ``stall-timeout``."""
    option: str
    dest: str
    """The parser's name for it: ``stall_timeout``."""
    shape: SettingShape
    choices: tuple[Any, ...]
    integer: bool
    """Its value is a whole number."""
    help: str
    shown: bool
    """Listed in ``--help`` (and so in a schema)."""

    def tokens(self, value: object, label: str) -> list[str]:
        """``value`` as command-line tokens; refused (:class:`FleetError`, the value called
        ``label``) when it is not of this setting's shape."""
        if self.shape == "flag":
            if type(value) is not bool:
                raise FleetError(f"{label} is a flag: true or false")
            return [self.option] if value else []
        if type(value) is list and self.shape == "value":
            raise FleetError(f"{label} takes one value, not a list")
        items = value if type(value) is list else [value]
        if len(items) > MAX_OPTIONS:
            raise FleetError(f"{label} has {len(items):,} values; at most {MAX_OPTIONS}")
        tokens = []
        for item in items:
            if type(item) not in (str, int, float):  # not a bool, a list or an object
                many = " or a list of them" if self.shape == "values" else ""
                raise FleetError(f"{label} takes a string or a number{many}")
            text = str(item)
            check_text(label, text, MAX_OPTION_CHARS)
            tokens.append(f"{self.option}={text}")  # one token: never read as an option
        return tokens

    def schema(self) -> dict[str, Any]:
        """Its JSON schema, for a client that lists what it may set."""
        described = {"description": self.help[:MAX_SETTING_HELP_CHARS]}
        if self.shape == "flag":
            return {"type": "boolean", **described}
        one: dict[str, Any] = {"type": "integer" if self.integer else "string"}
        if self.choices:
            one["enum"] = list(self.choices)
        if self.shape == "values":
            return {"type": "array", "items": one, "maxItems": MAX_OPTIONS, **described}
        return {**one, **described}


@functools.cache
def settings_of(kind: str) -> Mapping[str, Setting]:
    """The options of ``trt-otel KIND`` (``build`` or ``demo``) a request may set, by name:
    its parser's, but for those a request gives in fields of its own (:data:`OWN_FIELDS`) and
    those that start no build (``--help``)."""
    return _settings_of_parser(_command_parser(kind))


@functools.cache
def rung_settings() -> Mapping[str, Setting]:
    """The options a retry rung may give, by name (:func:`~trt_otel.app.retries.rung_parser`)."""
    return _settings_of_parser(rung_parser())


def _settings_of_parser(command: argparse.ArgumentParser) -> Mapping[str, Setting]:
    formatter = command._get_formatter()
    found: dict[str, Setting] = {}
    for action in command._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if not long or action.dest in OWN_FIELDS or action.nargs not in (None, 0):
            continue
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        shape: SettingShape = "flag" if action.nargs == 0 else "value"
        if isinstance(action, argparse._AppendAction):
            shape = "values"
        shown = action.help != argparse.SUPPRESS
        found[long[0].removeprefix("--")] = Setting(
            name=long[0].removeprefix("--"),
            option=long[0],
            dest=action.dest,
            shape=shape,
            choices=tuple(action.choices or ()),
            integer=action.type is int,
            help=" ".join(formatter._expand_help(action).split()) if shown and action.help else "",
            shown=shown,
        )
    return found


def settings_options(kind: str, settings: object) -> list[str]:
    """A request's typed ``settings`` as ``trt-otel KIND`` tokens, each name an option of the
    command's (:func:`settings_of`) and each value of its shape; the tokens then go through the
    checks the request's other options do."""
    return typed_options("settings", settings_of(kind), settings, f"trt-otel {kind}")


def typed_options(
    label: str, known: Mapping[str, Setting], settings: object, command: str
) -> list[str]:
    """``settings`` (what a request calls ``label``) as tokens, each name one of ``known``'s
    (the options of ``command``) and each value of its shape."""
    if not isinstance(settings, Mapping):
        raise FleetError(f"{label} must be an object: option names and their values")
    if len(settings) > MAX_OPTIONS:
        raise FleetError(f"{label} has {len(settings):,} options; at most {MAX_OPTIONS}")
    tokens: list[str] = []
    for name, value in settings.items():
        check_text(f"a name in {label}", name, MAX_SETTING_NAME_CHARS)
        setting = known.get(name)
        if setting is None:
            dest = name.replace("-", "_")
            if dest in OWN_FIELDS:
                raise FleetError(f"{label}: give {name} as {OWN_FIELDS[dest]}, not as a setting")
            raise FleetError(
                f"{label}: {shown(name)} is no option of {command} (a setting is named by its "
                "option's long name without the dashes: 'stall-timeout')"
            )
        tokens += setting.tokens(value, f"{label}[{name!r}]")
    if len(tokens) > MAX_OPTIONS:
        raise FleetError(f"{label} make {len(tokens):,} options; at most {MAX_OPTIONS}")
    return tokens


def settings_schema(reserved: Iterable[str], *, allow_network: bool) -> dict[str, Any]:
    """The JSON schema of a request's ``settings`` for a fleet: every option of ``build`` and
    ``demo`` (those of a demo only say so) that are listed in ``--help``, but those the fleet
    sets itself (``reserved``, by the parser's names) and, unless ``allow_network``, those
    that point the build at the network."""
    left_out = {*reserved, *([] if allow_network else NETWORK_SETTINGS)}
    build = settings_of("build")
    properties: dict[str, Any] = {}
    for name, setting in settings_of("demo").items():
        if setting.dest in left_out or not setting.shown:
            continue
        schema = setting.schema()
        if name not in build:
            schema["description"] = f"(demo only) {schema['description']}"
        properties[name] = schema
    return {"properties": properties, "additionalProperties": False, "maxProperties": MAX_OPTIONS}


def rung_schema() -> dict[str, Any]:
    """The JSON schema of a typed retry rung: the options a rung may give."""
    properties = {name: s.schema() for name, s in rung_settings().items() if s.shown}
    return {"type": "object", "properties": properties, "additionalProperties": False}


def _command_parser(kind: str) -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction) and kind in action.choices:
            command: argparse.ArgumentParser = action.choices[kind]
            return command
    raise FleetError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
