"""The registry of the views a session attaches, and everything that must agree with it.

Each view is declared once (:mod:`trt_otel.app.view_registry`): the options that ask for it,
whether a configuration wants it, the views it reads and the function that attaches it. The
session attaches what the registry says, in its order; the architecture page's table and the
command line's options are held to it here, and a view registered by a test module of its own
is attached and stopped like the shipped ones: one module and one registration."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from trt_otel.app import view_registry
from trt_otel.app.commands import build_parser
from trt_otel.app.components import attach_views
from trt_otel.app.config import HttpConfig, MetricsConfig, ObservabilityConfig, SpanConfig
from trt_otel.app.view_registry import ViewContext, ViewEntry
from trt_otel.capture.monitor import BuildMonitor
from trt_otel.core.readmodel import ReadModel

ENTRIES = view_registry.views()
ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def table_rows() -> dict[str, tuple[str, str]]:
    """The architecture page's table of views: name -> (asked for by, what it is)."""
    text = ARCHITECTURE.read_text()
    section = text.split("### The views a session attaches", 1)[1].split("\n### ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| `([a-z-]+)` \| (.*?) \| (.*?) \|", line)
        if match:
            rows[match[1]] = (match[2], match[3])
    return rows


def test_the_architecture_page_lists_every_view_in_the_registrys_order() -> None:
    rows = table_rows()
    assert list(rows) == [entry.name for entry in ENTRIES]
    for entry in ENTRIES:
        asked_by, summary = rows[entry.name]
        flags = ", ".join(f"`{flag}`" for flag in entry.options) or "(every session)"
        assert asked_by == flags, entry.name
        assert summary == entry.summary, entry.name


def build_options() -> set[str]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            build = action.choices["build"]
            return {flag for option in build._actions for flag in option.option_strings}
    raise AssertionError("no build command")


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_each_views_options_are_options_of_build(entry: ViewEntry) -> None:
    assert set(entry.options) <= build_options()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_each_view_is_attached_by_a_function_that_exists(entry: ViewEntry) -> None:
    module, _, function = entry.attach.partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def observe_with(**given: object) -> ObservabilityConfig:
    metrics = MetricsConfig(
        port=given.get("prometheus_port"),  # type: ignore[arg-type]
        pushgateway=given.get("pushgateway"),  # type: ignore[arg-type]
        sd_dir=given.get("sd_dir"),  # type: ignore[arg-type]
    )
    return ObservabilityConfig(
        metrics=metrics,
        http=HttpConfig(port=given.get("http_port")),  # type: ignore[arg-type]
        spans=SpanConfig(
            metrics=bool(given.get("otlp_metrics")), live=bool(given.get("otlp_live", True))
        ),
    )


@pytest.mark.parametrize(
    ("given", "wanted"),
    [
        ({}, ["logs", "spans", "final-flush", "otlp-live"]),
        ({"otlp_live": False}, ["logs", "spans", "final-flush"]),
        ({"http_port": 0}, ["logs", "spans", "metrics", "http", "final-flush", "otlp-live"]),
        (
            {"prometheus_port": 0},
            ["logs", "spans", "metrics", "prometheus", "final-flush", "otlp-live"],
        ),
        (
            {"pushgateway": "http://push"},
            ["logs", "spans", "metrics", "final-flush", "otlp-live", "pushgateway"],
        ),
        (
            {"otlp_metrics": True},
            ["logs", "spans", "metrics", "otlp-metrics", "final-flush", "otlp-live"],
        ),
        (
            {"sd_dir": Path("/sd"), "prometheus_port": 0, "otlp_live": False},
            ["logs", "spans", "scrape-target", "metrics", "prometheus", "final-flush", "announce"],
        ),
    ],
)
def test_a_configuration_wants_the_views_its_options_ask_for(
    given: dict[str, object], wanted: list[str]
) -> None:
    assert [e.name for e in view_registry.wanted_by(observe_with(**given))] == wanted


def test_a_registration_that_clashes_or_reads_a_later_view_is_refused() -> None:
    with pytest.raises(ValueError, match="already registered"):
        view_registry.register("spans", options=(), wanted=lambda o: True, attach="m:f", summary="")
    with pytest.raises(ValueError, match="not registered before it"):
        view_registry.register(
            "early", options=(), wanted=lambda o: True, attach="m:f", summary="", reads=("x",)
        )
    with pytest.raises(ValueError, match="module:function"):
        view_registry.register("bare", options=(), wanted=lambda o: True, attach="f", summary="")
    assert view_registry.views() == ENTRIES


# -- a view of a module of its own, one registration -----------------------------------------

attached: list[tuple[str, int]] = []


@contextlib.contextmanager
def attach_recorder(context: ViewContext) -> Iterator[str]:
    """A view of this module: it reads the HTTP view started before it."""
    attached.append(("started", context.view("http").port))
    yield "recorder"
    attached.append(("stopped", context.view("http").port))


@pytest.fixture
def recorder_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(view_registry, "_VIEWS", dict(view_registry._VIEWS))
    view_registry.register(
        "recorder",
        options=("--http-port",),
        wanted=lambda observe: observe.http.port is not None,
        attach=f"{__name__}:attach_recorder",
        summary="a test's view",
        reads=("http",),
    )
    attached.clear()
    yield


def test_a_registered_view_is_attached_in_order_and_stopped_with_the_session(
    recorder_registered: None,
) -> None:
    monitor = BuildMonitor(backend="none")
    observe = observe_with(http_port=0)
    with contextlib.ExitStack() as stack:
        attach_views(stack, monitor, observe, runner=None, model=ReadModel(), attributes={})
        ((started, port),) = attached
        assert started == "started" and port > 0  # the HTTP view listened before it started
    assert attached == [("started", port), ("stopped", port)]
    monitor.close()


def test_a_view_not_wanted_is_not_attached(recorder_registered: None) -> None:
    monitor = BuildMonitor(backend="none")
    with contextlib.ExitStack() as stack:
        attach_views(stack, monitor, observe_with(), runner=None, model=ReadModel(), attributes={})
    assert attached == []
    monitor.close()


def test_a_view_read_by_a_name_not_registered_is_an_error_not_none() -> None:
    """A view not wanted reads as None; a misspelt name is refused, not read as not wanted."""
    context = ViewContext(
        monitor=None, observe=observe_with(), model=ReadModel(), runner=None, attributes={}
    )
    assert context.view("http") is None
    with pytest.raises(KeyError, match="no view named 'htpp' is registered"):
        context.view("htpp")
