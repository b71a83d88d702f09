"""Shared fixtures: where the recorded TensorRT traces are, a reference reading of them, the
demo's model, TensorRT-RTX's module, a real OTLP receiver and a Ray cluster; and the guard that
keeps ``make check``'s selection true: a test without the ``e2e`` mark that starts a process or
a real TensorRT-RTX build fails, saying so."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from otlp_receiver import OtlpReceiver, otlp_receiver
from ray_cluster import RayCluster
from ray_cluster import ray_cluster as start_ray_cluster
from rtx_builds import import_rtx
from slurm_cluster import SlurmCluster, slurm_cluster
from trt_otel.builder.onnx_models import demo_model_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]
TRACES_DIR = Path(os.environ.get("TRT_OTEL_TRACES_DIR", REPO_ROOT.parent / "shared" / "traces"))


def trace_files() -> list[Path]:
    return sorted(TRACES_DIR.glob("*.jsonl")) if TRACES_DIR.is_dir() else []


def trace_params() -> list[object]:
    files = trace_files()
    if files:
        return [pytest.param(path, id=path.name) for path in files]
    reason = f"no recorded traces at {TRACES_DIR} (a clone outside the project's home)"
    return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-traces")]


@dataclass
class ReferencePhase:
    """A phase instance as read straight from a trace file, independently of trt_otel."""

    name: str
    parent: str | None
    num_steps: int
    steps: list[int] = field(default_factory=list)
    children: list[ReferencePhase] = field(default_factory=list)

    def shape(self) -> tuple[object, ...]:
        return (
            self.name,
            self.num_steps,
            tuple(self.steps),
            tuple(child.shape() for child in self.children),
        )


def reference_tree(path: Path) -> list[ReferencePhase]:
    """The phase forest of a recorded trace: open phases by name, children by parent name."""
    roots: list[ReferencePhase] = []
    open_phases: dict[str, ReferencePhase] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            record = json.loads(line)
            name = record["phase_name"]
            if record["cb"] == "phase_start":
                phase = ReferencePhase(name, record["parent_phase"], record["num_steps"])
                parent = record["parent_phase"]
                (open_phases[parent].children if parent is not None else roots).append(phase)
                open_phases[name] = phase
            elif record["cb"] == "step_complete":
                open_phases[name].steps.append(record["step"])
            else:
                del open_phases[name]
    return roots


@pytest.fixture
def mnist(tmp_path: Path) -> Path:
    """The demo's small MNIST-like model, as an ONNX file."""
    path = tmp_path / "mnist.onnx"
    path.write_bytes(demo_model_bytes())
    return path


@pytest.fixture(scope="module")
def rtx() -> Any:
    """TensorRT-RTX's module (``tensorrt_rtx``), imported once per module, or a skip that says
    why it is missing."""
    return import_rtx()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """A real OTLP receiver (gRPC and HTTP) for the test's spans."""
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """One real Ray cluster (a head and a second node) for every Ray test of the session
    (they share an xdist group, so one worker runs them all: a second worker that would start
    a cluster of its own fails instead)."""
    try:
        import ray.job_submission  # noqa: F401
    except ImportError as error:
        pytest.skip(f"Ray does not install here ({error}); the dev extra installs trt-otel[ray]")
    if (worker := os.environ.get("PYTEST_XDIST_WORKER")) is not None:
        claim = tmp_path_factory.getbasetemp().parent / "ray-cluster-worker"  # the run's, shared
        try:
            with open(claim, "x", encoding="utf-8") as handle:
                handle.write(worker)
        except FileExistsError:
            pytest.fail(
                f"the Ray tests run on {claim.read_text(encoding='utf-8')} and {worker}: "
                "--dist loadgroup did not keep their xdist_group on one worker"
            )
    with start_ray_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def one_node_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A real one-node SLURM cluster for the module's tests (tests/slurm_cluster.py; they
    share the xdist group ``slurm``), its jobs cancelled and its daemons stopped after them.
    Skips, saying why, where SLURM is not installed or the tests are not root."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


# -- make check: what a test without the e2e mark may not do ---------------------------------------

_RUNNING_UNMARKED: list[str] = []
"""The node id of the test now running (its setup, call and teardown), when it has no ``e2e``
mark; empty otherwise. Read from any thread: a process started by a test's thread counts too."""


def _refuse(what: str) -> None:
    if _RUNNING_UNMARKED:
        pytest.fail(
            f"{_RUNNING_UNMARKED[0]} {what} but has no e2e mark: mark it @pytest.mark.e2e "
            "(make check leaves it out), or call the function that the process would run",
            pytrace=True,
        )


def _guarded(original: Callable[..., Any], what: str) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _refuse(what)
        return original(*args, **kwargs)

    return guarded


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _guarded(  # type: ignore[method-assign]
        subprocess.Popen.__init__, "starts a process"
    )
    multiprocessing.process.BaseProcess.start = _guarded(  # type: ignore[method-assign]
        multiprocessing.process.BaseProcess.start, "starts a process (multiprocessing)"
    )
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        import tensorrt_rtx

        for name in ("build_serialized_network", "build_serialized_network_to_stream"):
            if (method := getattr(tensorrt_rtx.Builder, name, None)) is not None:
                setattr(
                    tensorrt_rtx.Builder,
                    name,
                    _guarded(method, "makes a real TensorRT-RTX build"),
                )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if item.get_closest_marker("e2e") is None:
        _RUNNING_UNMARKED[:] = [item.nodeid]
    try:
        return (yield)
    finally:
        _RUNNING_UNMARKED.clear()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests and the groups (whose tests run one after another on one worker) first:
    xdist hands out work in this order, and a long test handed out last is the run's tail."""
    items.sort(
        key=lambda item: (
            item.get_closest_marker("xdist_group") is None
            and item.get_closest_marker("slow") is None
        )
    )
