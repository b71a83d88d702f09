"""The registry of cancel policies, and everything that must agree with it.

Each policy is declared once (:mod:`trt_otel.control.registry`): its options, settings, factory,
cancel source, whether a retry ladder retries it, and the samplers it reads. These tests fail when
something that lists the policies drifts from it: the docs' tables and option lists, the metrics'
reasons, the ladder, the command line's settings, the cheap start of a build with no policy.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trt_otel.app.arguments import add_policy_options, policy_config
from trt_otel.app.config import PolicyConfig
from trt_otel.app.ladder import retry_reason
from trt_otel.app.session import Ended
from trt_otel.control import registry
from trt_otel.control.policies import Policy
from trt_otel.control.registry import Option, PolicyContext, PolicyEntry
from trt_otel.core.events import CancelSource, Outcome
from trt_otel.views.prometheus import CANCEL_REASONS

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ENTRIES = registry.policies()
SWITCHES = [(entry, option) for entry in ENTRIES for option in entry.options if option.switch]

EXAMPLES = {
    "duration": ["90s"],
    "size": ["6GiB"],
    "share": ["20%"],
    "path": ["stop-file"],
    "url": ["http://127.0.0.1:9/flag"],
    "flag": [],
}
"""A value of each kind of option, as a command line gives it."""


def _option_args(entry: PolicyEntry) -> list[str]:
    args = []
    for option in entry.options:
        values = [option.choices[-1]] if option.kind == "choice" else EXAMPLES[option.kind]
        args += [option.flag, *values]
    return args


def _parse(args: list[str]) -> PolicyConfig:
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    return policy_config(parser.parse_args(args))


def _table_rows(page: Path) -> dict[str, list[str]]:
    """The rows of ``page``'s tables whose first cell is an option: its flag to its cells."""
    rows = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `--"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`").split()[0]] = cells
    return rows


def test_the_registry_holds_the_policies_in_the_order_they_decide() -> None:
    assert [e.name for e in ENTRIES][:4] == ["timeout", "deadline", "stall", "memory"]
    assert [e.name for e in ENTRIES][-2:] == ["file", "url"]


@pytest.mark.parametrize(("entry", "option"), SWITCHES, ids=[o.flag for _, o in SWITCHES])
def test_every_policy_option_has_its_row_in_the_stopping_table(
    entry: PolicyEntry, option: Option
) -> None:
    rows = _table_rows(DOCS / "stopping.md")
    assert option.flag in rows, f"docs/stopping.md's table has no row for {option.flag}"
    assert rows[option.flag][-2] == f"`{entry.source.value}`", (
        f"docs/stopping.md gives {option.flag} the source {rows[option.flag][-2]}, "
        f"the registry {entry.source.value}"
    )


def test_every_row_of_the_stopping_table_is_a_registered_policy() -> None:
    flags = {option.flag for _, option in SWITCHES}
    assert sorted(set(_table_rows(DOCS / "stopping.md")) - flags) == []


def test_every_policy_option_is_in_the_commands_reference() -> None:
    text = (DOCS / "commands.md").read_text(encoding="utf-8")
    block = text[text.index("\npolicy options") :]
    block = block[: block.index("\n\n")]
    named = set(re.findall(r"--[a-z][a-z-]*[a-z]", block))
    assert [o.flag for e in ENTRIES for o in e.options if o.flag not in named] == []


def test_the_metrics_page_names_every_cancel_source() -> None:
    rows = (DOCS / "metrics.md").read_text(encoding="utf-8").splitlines()
    (row,) = [line for line in rows if line.startswith("| `trt_build_cancellations_total{")]
    assert [s for s in CancelSource if f"`{s.value}`" not in row] == []


def test_every_policys_source_is_a_metric_reason_from_the_start() -> None:
    assert {entry.source.value for entry in ENTRIES} <= set(CANCEL_REASONS)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_the_ladder_retries_what_the_registry_says(entry: PolicyEntry) -> None:
    for outcome in (Outcome.CANCELLATION, Outcome.TIMEOUT):
        ended = Ended(3, "b", outcome, entry.source, None, "stopped")
        retried = retry_reason(ended) is not None
        # A source shared by policies is retried when any of them says so.
        sharing = [e for e in ENTRIES if e.source is entry.source]
        assert retried == any(e.retried_by_ladder for e in sharing), entry.name


@pytest.mark.parametrize(
    "source", [CancelSource.FILE, CancelSource.HTTP, CancelSource.SIGNAL, CancelSource.USER]
)
def test_what_the_user_stopped_is_not_retried(source: CancelSource) -> None:
    assert retry_reason(Ended(3, "b", Outcome.CANCELLATION, source, None, "stopped")) is None


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_each_policys_options_make_its_policy_with_its_source(entry: PolicyEntry) -> None:
    config = _parse(_option_args(entry))
    chosen = config.settings()
    assert [e.name for e, _ in chosen] == [entry.name]
    policy = config.policy()
    assert isinstance(policy, Policy)
    assert [leaf.source for leaf in policy.leaves()] == [entry.source]
    assert not any(entry.given(s) == [] for _, s in chosen)


@pytest.mark.parametrize(("entry", "option"), SWITCHES, ids=[o.flag for _, o in SWITCHES])
def test_each_switch_of_a_policy_turns_it_on_alone(entry: PolicyEntry, option: Option) -> None:
    """``--min-available`` alone makes a memory guard, as ``--max-memory`` alone does."""
    config = _parse([option.flag, *EXAMPLES[option.kind]])
    ((chosen, settings),) = config.settings()
    assert chosen.name == entry.name
    assert chosen.given(settings) == [option.flag]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_a_policys_settings_are_all_fields_of_the_policy_config_or_none(
    entry: PolicyEntry,
) -> None:
    own = {field.name: field for field in dataclasses.fields(PolicyConfig)}
    here = [name for name in entry.fields if name in own]
    assert here in ([], list(entry.fields)), entry.name
    for name, default in entry.defaults().items():
        if name in own:  # declared twice: the same default
            assert own[name].default == default, (entry.name, name)


def test_no_policy_option_gives_the_settings_the_library_gets() -> None:
    assert _parse([]) == PolicyConfig()
    assert PolicyConfig().settings() == [] and PolicyConfig().policy() is None


def test_the_policy_config_refuses_settings_no_policy_registered() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unknown:
        limit: int = 1

    with pytest.raises(TypeError, match="not the settings of a registered policy"):
        PolicyConfig(more=(Unknown(),))


def test_a_registration_that_clashes_is_refused() -> None:
    timeout = ENTRIES[0]
    kwargs: dict[str, Any] = {
        "config": timeout.config,
        "factory": timeout.factory,
        "source": timeout.source,
        "options": timeout.options,
        "retried_by_ladder": True,
    }
    with pytest.raises(ValueError, match="registered already"):
        registry.register("timeout", **kwargs)
    with pytest.raises(ValueError, match="belongs to another policy"):
        registry.register("another-timeout", **kwargs)
    with pytest.raises(ValueError, match="retries both or neither"):
        other = (Option("--other-timeout", "timeout_s", "duration", "stop"),)
        registry.register("sharing", **{**kwargs, "options": other, "retried_by_ladder": False})
    with pytest.raises(TypeError, match="must be a CancelSource"):
        registry.register("named", **{**kwargs, "source": "timeout"})
    assert registry.policies() == ENTRIES


@pytest.mark.e2e
def test_a_build_with_no_policy_imports_no_policy_module() -> None:
    """The import budget, read from the registry: the command line and its settings of a
    build with no policy import none of the modules the registry names."""
    modules = sorted({entry.module for entry in ENTRIES})
    code = (
        "import sys\n"
        "from trt_otel.app.commands import build_parser, command_of\n"
        "command = command_of(build_parser().parse_args(['build', 'm.onnx', '-o', 'm.engine']))\n"
        "assert command.session.policy.policy() is None\n"
        f"print(sorted(m for m in {modules!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_a_policy_is_made_with_what_the_build_knows() -> None:
    deadline = next(e for e in ENTRIES if e.name == "deadline")
    made = deadline.make(deadline.config(deadline_s=60.0), PolicyContext(project=lambda _: None))
    assert made.describe() == "deadline(1m00s, margin 10%)"
