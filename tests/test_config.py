"""Typed configuration and the session's lifecycle: options become frozen dataclasses that any
command can assemble from the same groups, and a session that fails to start stops what it had
started."""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from pathlib import Path

import pytest

from prometheus_server import free_port
from trt_otel.app.arguments import (
    add_builder_options,
    add_observability_options,
    add_policy_options,
    add_session_options,
    add_span_options,
    add_store_options,
    builder_options,
    observability_config,
    policy_config,
    session_config,
    stop_budget,
    store_config,
)
from trt_otel.app.cli import main
from trt_otel.app.commands import DemoCommand, build_parser, command_of
from trt_otel.app.config import (
    ConsoleConfig,
    GpuConfig,
    HttpConfig,
    MetricsConfig,
    ObservabilityConfig,
    PolicyConfig,
    SessionConfig,
    SpanConfig,
    StoreConfig,
    UsageError,
    signal_grace_s,
)
from trt_otel.control.policies import AnyOf, Stall, Timeout
from trt_otel.control.probes import CancelFile


def test_every_option_lands_in_its_group() -> None:
    args = build_parser().parse_args(
        [
            "demo",
            "--timeout", "90s", "--stall-timeout", "2m", "--stall-on", "callbacks",
            "--max-memory", "6GiB", "--min-available", "512M", "--cancel-file", "stop",
            "--cancel-url", "http://flag.example/stop", "--cancel-url-interval", "3s",
            "--cancel-url-fail-closed", "--grace", "7s", "--in-process",
            "--otlp-endpoint", "http://collector:4318", "--otlp-protocol", "http/protobuf",
            "--span-budget", "50", "--span-fold-under", "250ms", "--otlp-flush-timeout", "9s",
            "--journal", "j.jsonl", "--http-port", "0", "--http-address", "::1",
            "--cancel-token", "secret", "--gpu", "1", "--gpu-interval", "2s",
            "--prometheus-port", "0", "--prometheus-address", "0.0.0.0",
            "--prometheus-linger", "4s", "--pushgateway", "http://gw:9091",
            "--metrics-build-id", "--no-progress", "--fp16", "--max-threads", "3",
        ]
    )  # fmt: skip
    command = command_of(args)
    assert isinstance(command, DemoCommand)
    assert command.session == SessionConfig(
        observe=ObservabilityConfig(
            journal=Path("j.jsonl"),
            spans=SpanConfig("http://collector:4318", "http/protobuf", 50, 0.25, 9.0),
            http=HttpConfig(port=0, address="::1", cancel_token="secret"),
            metrics=MetricsConfig(0, "0.0.0.0", 4.0, "http://gw:9091", build_id_label=True),
            sample_interval_s=2.0,
            gpu=GpuConfig(enabled=True, device="1", interval_s=2.0),
            console=ConsoleConfig(live=False),
        ),
        policy=PolicyConfig(
            timeout_s=90.0,
            stall_timeout_s=120.0,
            stall_on="callbacks",
            max_memory_bytes=6 << 30,
            min_available_bytes=512 << 20,
            cancel_file=Path("stop"),
            cancel_url="http://flag.example/stop",
            cancel_url_interval_s=3.0,
            cancel_url_fail_closed=True,
            grace_s=7.0,
        ),
        in_process=True,
    )
    assert command.builder.precisions == ("fp16",)
    assert command.builder.max_threads == 3


def test_defaults_of_the_command_line_are_the_library_defaults() -> None:
    args = build_parser().parse_args(["build", "model.onnx", "-o", "model.engine"])
    assert session_config(args) == SessionConfig()


def test_live_snapshots_are_on_unless_switched_off() -> None:
    def live(*options: str) -> bool:
        args = build_parser().parse_args(["build", "model.onnx", "-o", "m.engine", *options])
        return session_config(args).observe.spans.live

    assert live() is True
    assert live("--otlp-live", "off") is False


def test_a_new_command_reuses_the_groups_by_type() -> None:
    # What a `run -- COMMAND` subcommand does: the same groups, without builder options or
    # --in-process, and the same typed values out.
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    add_span_options(parser)
    add_observability_options(parser)
    parser.add_argument("program", nargs="+")
    args = parser.parse_args(["--timeout", "1h", "--journal", "x.jsonl", "--", "python", "x.py"])
    config = SessionConfig(observe=observability_config(args), policy=policy_config(args))
    assert config.policy.timeout_s == 3600.0
    assert config.observe.journal == Path("x.jsonl")
    assert not config.in_process
    with pytest.raises(SystemExit):
        parser.parse_args(["--in-process", "--", "python"])  # not offered to that command


def test_configuration_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SessionConfig().in_process = True  # type: ignore[misc]


def test_the_policy_config_makes_the_policy() -> None:
    assert PolicyConfig().policy() is None
    single = PolicyConfig(timeout_s=5.0).policy()
    assert isinstance(single, Timeout)
    combined = PolicyConfig(stall_timeout_s=3.0, cancel_file=Path("f")).policy()
    assert isinstance(combined, AnyOf)
    assert [type(p) for p in combined.leaves()] == [Stall, CancelFile]


def test_a_signal_s_grace_is_what_the_stop_budget_leaves_after_the_flush() -> None:
    def grace(budget_s: float, flush_s: float = 3.0, grace_s: float = 30.0) -> float:
        return signal_grace_s(
            SessionConfig(
                observe=ObservabilityConfig(spans=SpanConfig(flush_timeout_s=flush_s)),
                policy=PolicyConfig(grace_s=grace_s, stop_budget_s=budget_s),
            )
        )

    assert grace(7.5) == 3.5  # the defaults: 7.5 s less a 3 s flush and 1 s to end the journal
    assert grace(30.0, flush_s=5.0) == 24.0
    assert grace(600.0, grace_s=30.0) == 30.0  # never longer than --grace
    assert grace(2.0) == 0.5  # at least a moment for TensorRT's next step


def test_the_stop_budget_is_the_option_else_the_environment_else_the_default() -> None:
    assert stop_budget(4.0, {"TRT_OTEL_STOP_BUDGET": "9s"}) == 4.0
    assert stop_budget(None, {"TRT_OTEL_STOP_BUDGET": "25s"}) == 25.0
    assert stop_budget(None, {"TRT_OTEL_STOP_BUDGET": " "}) == 7.5
    assert stop_budget(None, {}) == 7.5
    with pytest.raises(UsageError, match=r"\$TRT_OTEL_STOP_BUDGET='soon'"):
        stop_budget(None, {"TRT_OTEL_STOP_BUDGET": "soon"})
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    assert policy_config(parser.parse_args(["--stop-budget", "1m"])).stop_budget_s == 60.0


@pytest.mark.parametrize("text", ["0", "0s", "-0"])
def test_a_stop_budget_of_nothing_is_refused_from_the_environment_as_from_the_option(
    text: str,
) -> None:
    """A stop with no time to end its journal is no budget: ``--stop-budget 0`` is argparse's
    usage error, and ``$TRT_OTEL_STOP_BUDGET=0`` the same refusal, naming the variable."""
    parser = argparse.ArgumentParser()
    add_policy_options(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--stop-budget", text])
    with pytest.raises(UsageError, match=r"\$TRT_OTEL_STOP_BUDGET=.*must be longer than 0s"):
        stop_budget(None, {"TRT_OTEL_STOP_BUDGET": text})


def test_the_engine_store_is_the_option_else_the_environment() -> None:
    """``--engine-store DIR`` given wins over ``$TRT_OTEL_ENGINE_STORE`` (a CI job's shared
    store), which serves where no option names one; ``--engine-store-max`` needs one of them."""
    parser = argparse.ArgumentParser()
    add_store_options(parser)
    environ = {"TRT_OTEL_ENGINE_STORE": " /shared/engines "}
    assert store_config(parser.parse_args(["--engine-store", "mine"]), environ) == StoreConfig(
        Path("mine")
    )
    assert store_config(parser.parse_args([]), environ) == StoreConfig(Path("/shared/engines"))
    assert store_config(parser.parse_args([]), {"TRT_OTEL_ENGINE_STORE": " "}) == StoreConfig()
    bounded = parser.parse_args(["--engine-store-max", "50GiB"])
    assert store_config(bounded, environ) == StoreConfig(Path("/shared/engines"), 50 << 30)
    with pytest.raises(UsageError, match="--engine-store-max needs --engine-store DIR"):
        store_config(bounded, {})


def test_builder_options_are_checked_together() -> None:
    parser = argparse.ArgumentParser()
    add_builder_options(parser)
    with pytest.raises(UsageError, match="strongly-typed"):
        builder_options(parser.parse_args(["--strongly-typed", "--fp16"]))
    with pytest.raises(UsageError, match="at least 1"):
        builder_options(parser.parse_args(["--max-threads", "0"]))


def test_history_must_be_a_directory(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_session_options(parser)
    with pytest.raises(UsageError, match="not a directory"):
        session_config(parser.parse_args(["--history", str(tmp_path / "absent")]))


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9091/x?y", "http://127.0.0.1:9091/#z", "http://127.0.0.1:9091/a/../b"],
)
def test_a_pushgateway_url_that_would_turn_the_push_elsewhere_is_a_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The push appends its own path: a query, a fragment or a ``..`` would send it elsewhere."""
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, before anything starts
        main(["demo", "--speed", "0", "--no-progress", "--pushgateway", url])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Pushgateway URL has no" in err and len(err.strip().splitlines()) <= 3, err


def test_a_session_that_cannot_start_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The HTTP port is taken: exit 2 before any build, and the parts that had started (the
    Prometheus endpoint, the generated cancel token) are stopped and removed again."""
    metrics_port = free_port()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # where the token is generated
    monkeypatch.delenv("TRT_OTEL_CANCEL_TOKEN", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        http_port = taken.getsockname()[1]
        code = main(
            [
                "demo", "--speed", "0", "--no-progress", "--no-gpu",
                "--journal", str(tmp_path / "j.jsonl"),
                "--prometheus-port", str(metrics_port), "--http-port", str(http_port),
            ]
        )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot serve HTTP on 127.0.0.1:{http_port}" in err
    assert "build started" not in err
    tokens = tmp_path / f"trt-otel-{os.getuid()}"
    assert tokens.is_dir(), "a token was generated"
    assert not list(tokens.iterdir()), "the generated token went with the session"
    with socket.socket() as again:  # the metrics endpoint let its port go
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", metrics_port))
    assert not (tmp_path / "j.jsonl").exists(), "no journal for a build that never started"
