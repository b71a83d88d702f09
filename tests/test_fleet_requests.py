"""A start request is checked alike by the local fleet and by Ray's: one reading of its options
(trt-otel's own parser), the settings the fleet owns left alone, the model given only as the
request's model, every path confined. Nothing is started: each request here is refused before
a process or a Ray job would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from trt_otel.app.fleet import Fleet
from trt_otel.app.fleet_documents import BuildRequest
from trt_otel.app.fleet_requests import (
    MAX_ID_CHARS,
    MAX_OPTIONS,
    MAX_PATH_CHARS,
    FleetError,
    bounded_request,
    check_command_line,
    check_text,
    ladder_options,
    settings_options,
    settings_schema,
)
from trt_otel.app.fleets import BuildFleet
from trt_otel.app.ray_fleet import RayFleet
from trt_otel.app.retries import MAX_RUNGS, retry_rungs


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
        BuildRequest(kind="demo", settings={"history": str(outside)}),
        BuildRequest(kind="demo", retries=({"timing-cache": str(outside / "cache")},)),
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


def test_typed_settings_are_the_options_the_command_line_would_read() -> None:
    """Each setting by its option's long name: a flag by true (false leaves it out), a value,
    a number as written, a list for an option given more than once."""
    tokens = settings_options(
        "demo",
        {
            "fp16": True,
            "verbose": False,
            "no-summary": True,
            "timeout": "30m",
            "builder-optimization-level": 3,
            "speed": 0.5,
            "shapes": ["a:1x2,2x2,4x2", "b:3,3,3"],
            "otlp-protocol": "grpc",
        },
    )
    read = check_command_line(["demo", *tokens])
    assert read.precisions == ["fp16"]
    assert read.verbose is False
    assert read.summary is False
    assert read.timeout == 1800
    assert read.builder_optimization_level == 3
    assert read.speed == 0.5
    assert read.shapes == ["a:1x2,2x2,4x2", "b:3,3,3"]
    assert read.otlp_protocol == "grpc"
    # One token each: a value that looks like an option is the option's value, never another.
    assert settings_options("demo", {"silence": "--in-process"}) == ["--silence=--in-process"]


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"no-such-option": "1"}, "'no-such-option' is no option of trt-otel demo"),
        ({"--timeout": "1m"}, "long name without the dashes"),
        ({"fp16": "yes"}, "settings['fp16'] is a flag: true or false"),
        ({"fp16": 1}, "settings['fp16'] is a flag: true or false"),
        ({"timeout": True}, "settings['timeout'] takes a string or a number"),
        ({"timeout": ["1m", "2m"]}, "settings['timeout'] takes one value, not a list"),
        ({"shapes": [{"a": 1}]}, "settings['shapes'] takes a string or a number or a list"),
        ({"timeout": "x" * 5000}, "settings['timeout'] is 5,000 characters long"),
        ({"timeout": "1m\0"}, "settings['timeout'] holds a NUL character"),
        ({"deadline": "1h"}, "give deadline as the request's deadline"),
        ({"retry": ["--timeout 1h"]}, "give retry as the request's retries"),
        ({"model": "m.onnx"}, "give model as the request's model"),
        ({"timeout": "soon"}, "soon"),
        ({f"o{i}": True for i in range(65)}, "settings has 65 options; at most 64"),
        ({"shapes": [f"a:{i}" for i in range(65)]}, "settings['shapes'] has 65 values"),
        ({"trace": "t.jsonl"}, "'trace' is no option of trt-otel build"),
    ],
)
@pytest.mark.parametrize("which", ["local", "ray"])
def test_a_setting_of_the_wrong_name_or_shape_is_refused_before_anything_starts(
    tmp_path: Path, which: str, settings: dict[str, object], said: str
) -> None:
    fleet = fleets(tmp_path)[which]
    kind = "build" if "trace" in settings else "demo"
    model = fleet.roots[0] / "model.onnx"
    model.write_bytes(b"not looked at: refused first")
    request = BuildRequest(kind=kind, model=str(model), settings=settings)
    with pytest.raises(FleetError) as refused:
        fleet.start(request)
    assert said in str(refused.value)


@pytest.mark.parametrize(
    ("which", "setting", "setter"),
    [("local", "journal", "the server"), ("local", "http-port", "the server"),
     ("ray", "journal", "the fleet"), ("ray", "cancel-file", "the fleet")],
)  # fmt: skip
def test_a_setting_the_fleet_owns_is_refused_as_its_option_is(
    tmp_path: Path, which: str, setting: str, setter: str
) -> None:
    fleet = fleets(tmp_path)[which]
    value = "8080" if setting == "http-port" else str(tmp_path / which / "mine")
    with pytest.raises(FleetError, match=f"--{setting} is set by {setter}; leave it out"):
        fleet.start(BuildRequest(kind="demo", settings={setting: value}))


@pytest.mark.parametrize("which", ["local", "ray"])
def test_a_network_setting_is_refused_without_the_fleets_consent(
    tmp_path: Path, which: str
) -> None:
    fleet = fleets(tmp_path)[which]
    with pytest.raises(FleetError, match="--otlp-endpoint would point the build at an address"):
        fleet.start(BuildRequest(kind="demo", settings={"otlp-endpoint": "http://x:4317"}))


def test_the_settings_schema_lists_what_a_fleet_lets_a_request_set() -> None:
    """What an agent reads: every option of a build or a demo, typed, with its help; not those
    the fleet sets itself, nor, without the server's consent, those that reach the network."""
    schema = settings_schema(Fleet.reserved, allow_network=False)
    properties = schema["properties"]
    assert schema["additionalProperties"] is False
    assert properties["fp16"]["type"] == "boolean"
    assert properties["timeout"] == {"type": "string", "description": "stop after this long"}
    assert properties["builder-optimization-level"]["enum"] == [0, 1, 2, 3, 4, 5]
    assert properties["shapes"]["type"] == "array"
    assert properties["speed"]["description"].startswith("(demo only) ")
    assert "(demo only)" not in properties["stall-timeout"]["description"]
    assert {"cancel-file", "history", "grace"} <= set(properties)
    left_out = {"output", "journal", "http-port", "http-url-file", "cancel-token", "model"}
    left_out |= {"deadline", "retry", "otlp-endpoint", "cancel-url", "pushgateway"}
    assert left_out.isdisjoint(properties)
    shared = settings_schema(RayFleet.reserved, allow_network=True)["properties"]
    assert "cancel-file" not in shared
    assert {"otlp-endpoint", "http-port", "pushgateway"} <= set(shared)


def test_a_typed_retry_rung_is_the_rung_its_text_would_be() -> None:
    typed = {"builder-optimization-level": 0, "workspace": "1G", "timeout": "1h"}
    tokens = ladder_options(None, ["--builder-optimization-level 2", typed])
    read = check_command_line(["demo", *tokens])
    first, second = retry_rungs(read)
    assert first.builder.optimization_level == 2
    assert second.builder.optimization_level == 0
    assert second.builder.memory_pools == {"WORKSPACE": 1 << 30}
    assert second.timeout_s == 3600


@pytest.mark.parametrize(
    ("rung", "said"),
    [
        ({"speed": "2"}, "retries[0]: 'speed' is no option of a retry rung"),
        ({"fp16": "yes"}, "retries[0]['fp16'] is a flag: true or false"),
        ({"timeout": [1, 2]}, "retries[0]['timeout'] takes one value, not a list"),
        ({"workspace": "x" * 995}, "retries[0] is 1,007 characters long; at most 1,000"),
    ],
)
def test_a_typed_rung_of_the_wrong_name_or_shape_is_refused(
    tmp_path: Path, rung: dict[str, object], said: str
) -> None:
    fleet = fleets(tmp_path)["local"]
    with pytest.raises(FleetError) as refused:
        fleet.start(BuildRequest(kind="demo", retries=(rung,)))
    assert said in str(refused.value)


@pytest.mark.parametrize(("name", "limit"), [("build_id", MAX_ID_CHARS), ("model", MAX_PATH_CHARS)])
def test_a_caller_s_text_of_exactly_its_limit_is_taken_and_one_more_is_refused(
    name: str, limit: int
) -> None:
    """A bound is the longest text taken, not the first refused; the refusal says how long
    the text is, never what it holds."""
    check_text(name, "x" * limit, limit)
    with pytest.raises(FleetError) as refused:
        check_text(name, "y" * (limit + 1), limit)
    assert str(refused.value) == f"{name} is {limit + 1:,} characters long; at most {limit:,}"
    assert "y" not in str(refused.value).replace(name, "")


def test_a_request_of_as_many_options_as_allowed_is_taken_and_one_more_is_refused() -> None:
    """:data:`MAX_OPTIONS` is the most a request may carry, not a count it must stay under."""
    options = ("--no-gpu",) * MAX_OPTIONS
    assert bounded_request(BuildRequest(kind="demo", options=options)) == list(options)
    with pytest.raises(FleetError, match=f"options has {MAX_OPTIONS + 1} items; at most"):
        bounded_request(BuildRequest(kind="demo", options=(*options, "--no-gpu")))


def test_a_ladder_of_as_many_rungs_as_allowed_is_taken_and_one_more_is_refused() -> None:
    """:data:`MAX_RUNGS` retry rungs is the longest ladder a request may ask for."""
    rungs = ("--no-gpu",) * MAX_RUNGS
    taken = bounded_request(BuildRequest(kind="demo", retries=rungs))
    assert taken == ["--retry=--no-gpu"] * MAX_RUNGS
    with pytest.raises(FleetError, match=f"retries has {MAX_RUNGS + 1} rungs; at most"):
        bounded_request(BuildRequest(kind="demo", retries=(*rungs, "--no-gpu")))


def test_a_builds_metrics_serve_on_loopback_even_where_network_options_are_allowed(
    tmp_path: Path,
) -> None:
    """A server that lets its clients set network options still serves its builds' metrics on
    this machine alone: a host name that merely begins with ``localhost`` is not loopback."""
    fleet = Fleet(tmp_path / "state", roots=[tmp_path], allow_network=True)
    for address in ("localhost.evil.example", "localhost-gpu-box", "0.0.0.0"):
        options = ("--prometheus-port", "0", "--prometheus-address", address)
        with pytest.raises(FleetError, match="is not a loopback address"):
            fleet.start(BuildRequest(kind="demo", options=options))
    assert fleet.ids() == []


def test_an_output_among_a_fleets_records_is_refused(tmp_path: Path) -> None:
    """An engine written over a build's record or a journal would lose that build: an output
    in either folder of the fleet's is refused, even with ``overwrite``."""
    fleet = fleets(tmp_path)["ray"]
    shared = (tmp_path / "shared").resolve()
    for output in (
        shared / "builds" / "0123456789ab" / "build.json",
        shared / "journals" / "0123456789ab.jsonl",
    ):
        with pytest.raises(FleetError, match="is among the fleet's records"):
            fleet.start(BuildRequest(kind="demo", output=str(output), overwrite=True))


def test_a_path_inside_any_one_of_the_local_fleets_roots_is_taken(tmp_path: Path) -> None:
    """The roots are alternatives: a model in one root and the history in another are both
    inside (``will_it_fit`` reads both, and builds nothing)."""
    models, journals = tmp_path / "models", tmp_path / "journals"
    models.mkdir()
    journals.mkdir()
    model = models / "m.onnx"
    model.write_bytes(b"hashed, never built")
    fleet = Fleet(tmp_path / "state", roots=[models, journals])
    fit = fleet.fit(str(model), "10m", str(journals))
    assert (fit.answer, fit.builds) == ("unknown", 0)
    with pytest.raises(FleetError, match="is outside the server's roots"):
        fleet.fit(str(model), "10m", str(tmp_path))
