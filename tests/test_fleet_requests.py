"""A start request is checked alike by the local fleet and by Ray's: one reading of its options
(trt-otel's own parser), the settings the fleet owns left alone, the model given only as the
request's model, every path confined. Nothing is started: each request here is refused before
a process or a Ray job would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from trt_otel.app.fleet import Fleet
from trt_otel.app.fleet_documents import BuildRequest
from trt_otel.app.fleet_requests import FleetError
from trt_otel.app.fleets import BuildFleet
from trt_otel.app.ray_fleet import RayFleet


class NoRay:
    """A Ray job client that fails the test if a request reaches it."""

    def submit_job(self, **_: object) -> str:
        pytest.fail("a refused request reached Ray")


def fleets(tmp_path: Path) -> dict[str, BuildFleet]:
    """The two fleets, each confined to its own folder under ``tmp_path``."""
    local, shared = tmp_path / "local", tmp_path / "shared"
    local.mkdir()
    shared.mkdir()
    return {
        "local": Fleet(local / "state", roots=[local]),
        "ray": RayFleet("http://127.0.0.1:1", shared, client=NoRay()),
    }


@pytest.mark.parametrize("which", ["local", "ray"])
def test_a_model_given_as_an_option_is_refused_by_either_fleet(tmp_path: Path, which: str) -> None:
    """A demo's ``--model`` in the options would be a model from anywhere (it is confined only
    as the request's model): both fleets refuse it."""
    fleet = fleets(tmp_path)[which]
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"not a model")
    with pytest.raises(FleetError, match="leave --model out"):
        fleet.start(BuildRequest(kind="demo", options=("--model", str(outside))))
    with pytest.raises(FleetError, match="leave --model out"):
        fleet.start(BuildRequest(kind="demo", options=(f"--model={outside}",)))


@pytest.mark.parametrize("which", ["local", "ray"])
def test_a_path_option_or_a_rungs_path_outside_the_fleet_is_refused(
    tmp_path: Path, which: str
) -> None:
    fleet = fleets(tmp_path)[which]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for request in (
        BuildRequest(kind="demo", options=("--trace", str(outside / "trace.jsonl"))),
        BuildRequest(kind="demo", options=(f"--history={outside}",)),
        BuildRequest(kind="demo", retries=(f"--timing-cache {outside / 'cache'}",)),
    ):
        with pytest.raises(FleetError, match="outside"):
            fleet.start(request)


@pytest.mark.parametrize(
    ("which", "option", "setter"),
    [
        ("local", "--journal", "the server"),
        ("local", "--http-port", "the server"),
        ("ray", "--journal", "the fleet"),
        ("ray", "--cancel-file", "the fleet"),
    ],
)
def test_what_a_fleet_sets_itself_is_refused_however_it_is_spelt(
    tmp_path: Path, which: str, option: str, setter: str
) -> None:
    fleet = fleets(tmp_path)[which]
    value = "8080" if option == "--http-port" else str(tmp_path / which / "mine")
    for options in ((option, value), (f"{option}={value}",)):
        with pytest.raises(FleetError, match=f"{option} is set by {setter}; leave it out"):
            fleet.start(BuildRequest(kind="demo", options=options))


@pytest.mark.parametrize(("gpus", "cpus"), [(-1.0, 1.0), (65.0, 1.0), (0.0, -1.0), (0.0, 257.0)])
def test_what_ray_reserves_for_a_build_is_bounded(tmp_path: Path, gpus: float, cpus: float) -> None:
    fleet = RayFleet("http://127.0.0.1:1", tmp_path, client=NoRay())
    with pytest.raises(FleetError, match="num_gpus must be 0 to 64 and num_cpus 0 to 256"):
        fleet.start(BuildRequest(kind="demo"), num_gpus=gpus, num_cpus=cpus)
