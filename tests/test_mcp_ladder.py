"""MCP for deadlines and retries: ``start_build`` takes ``deadline`` and ``retries`` (checked as
strictly as its options: they come from a client), ``build_status`` shows the attempts, and
``will_it_fit`` answers from history without building. A real server over stdio, real builds
(the simulator)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from journals import write_journal
from mcp_client import error_text, payload, run_async, server
from trt_otel.builder.onnx_models import demo_model_bytes
from trt_otel.builder.simulator import generate_plan
from trt_otel.testing import virtual_build

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def write_model(folder: Path) -> Path:
    path = folder / "mnist.onnx"
    path.write_bytes(demo_model_bytes())
    return path


def write_history(folder: Path, model: Path, paces: tuple[float, ...]) -> list[float]:
    """Earlier builds of ``model`` as journals in ``folder``; their durations."""
    folder.mkdir()
    attributes = {
        "model.path": model.name,
        "model.sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
    }
    took = []
    for index, pace in enumerate(paces):
        events = virtual_build(generate_plan(13), pace=pace, seed=index, attributes=attributes)
        write_journal(folder / f"b{index}.jsonl", events)
        took.append((events[-1].mono_ns - events[0].mono_ns) / 1e9)
    return took


def test_a_ladder_started_by_an_agent_shows_its_attempts(tmp_path: Path) -> None:
    model = write_model(tmp_path)

    async def test() -> None:
        async with server(tmp_path / "state") as client:
            arguments: dict[str, Any] = {
                "kind": "demo",
                "model": str(model),
                "options": ["--speed", "4", "--builder-optimization-level", "5", "--timeout", "5s"],
                "retries": ["--builder-optimization-level 0 --timeout 2m"],
            }
            build_id = payload(await client.call_tool("start_build", arguments))["id"]
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": build_id, "until": "end", "timeout_s": 300}
                )
            )
            final = ended["status"]
            assert (final["outcome"], final["exit_code"]) == ("success", 0), final
            first, second = final["attempts"]
            assert (first["number"], first["of"], first["outcome"]) == (1, 2, "timeout")
            assert first["cancel"]["source"] == "timeout"
            assert (second["number"], second["outcome"], second["exit_code"]) == (2, "success", 0)
            assert second["previous_build_id"] == first["build_id"]
            assert second["retry_reason"].startswith("timeout (timeout)")
            assert second["options"] == "--builder-optimization-level 0 --timeout 2m"
            assert final["build_id"] == second["build_id"]

    run_async(test)


def test_a_deadline_its_history_cannot_meet_is_refused_at_once(tmp_path: Path) -> None:
    model = write_model(tmp_path)
    write_history(tmp_path / "history", model, (3.0, 3.2, 3.5))

    async def test() -> None:
        async with server(tmp_path / "state") as client:
            arguments = {
                "kind": "demo",
                "model": str(model),
                "options": ["--speed", "4", "--history", str(tmp_path / "history")],
                "deadline": "10s",
            }
            build_id = payload(await client.call_tool("start_build", arguments))["id"]
            ended = payload(
                await client.call_tool(
                    "wait_build", {"id": build_id, "until": "end", "timeout_s": 120}
                )
            )
            final = ended["status"]
            assert (final["outcome"], final["exit_code"]) == ("timeout", 3)
            assert final["cancel"]["source"] == "deadline"
            assert "(3 earlier builds: " in final["cancel"]["reason"]
            assert final["cancel"]["reason"].endswith("deadline; not started")
            assert final["steps_completed"] == 0 and final["attempts"] == []

    run_async(test)


def test_deadline_and_retries_are_checked_before_anything_starts(tmp_path: Path) -> None:
    model = write_model(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-outside" / "cache.bin"

    async def test() -> None:
        async with server(tmp_path / "state", tmp_path) as client:
            base = {"kind": "demo", "model": str(model), "options": ["--speed", "0"]}
            cases: list[tuple[dict[str, Any], str]] = [
                ({"deadline": "soon"}, "deadline"),
                ({"deadline": "0s"}, "deadline"),
                ({"deadline": "1" * 40}, "deadline is 40 characters long"),
                ({"retries": ["--fp16"] * 9}, "at most 8"),
                ({"retries": ["x" * 2000]}, "retries[0] is 2,000 characters long"),
                ({"retries": ["--journal /tmp/x.jsonl"]}, "unrecognized arguments: --journal"),
                (
                    {"retries": ["--builder-optimization-level high"]},
                    "--builder-optimization-level",
                ),
                ({"retries": [f"--timing-cache {outside}"]}, "--retry --timing-cache"),
            ]
            for extra, said in cases:
                result = await client.call_tool("start_build", {**base, **extra})
                assert said in error_text(result), (extra, error_text(result))
            assert not (tmp_path / "state").exists() or not any(
                p.is_dir() for p in (tmp_path / "state").iterdir()
            )

    run_async(test)


def test_will_it_fit_answers_from_history_without_building(tmp_path: Path) -> None:
    model = write_model(tmp_path)
    took = sorted(write_history(tmp_path / "history", model, (0.9, 1.0, 1.1)))
    (tmp_path / "empty").mkdir()

    async def test() -> None:
        async with server(tmp_path / "state") as client:

            async def ask(deadline_s: float, history: str = "history") -> dict[str, Any]:
                arguments = {
                    "model": str(model),
                    "deadline": f"{deadline_s:.3f}s",
                    "history": str(tmp_path / history),
                }
                return payload(await client.call_tool("will_it_fit", arguments))

            no = await ask(took[0] / 1.5)
            assert no["answer"] == "no" and "would refuse it" in no["reason"]
            assert no["builds"] == 3 and no["within"] == 0
            assert no["projection"]["basis"] == "history"
            yes = await ask(took[-1] + 1)
            assert (yes["answer"], yes["within"]) == ("yes", 3)
            maybe = await ask((took[0] + took[1]) / 2)
            assert (maybe["answer"], maybe["within"]) == ("maybe", 1)
            assert (await ask(60, "empty"))["answer"] == "unknown"
            refused = await client.call_tool(
                "will_it_fit", {"model": str(model), "deadline": "1m", "history": "/"}
            )
            assert "history / is outside the server's roots" in error_text(refused)
            assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())

    run_async(test)
