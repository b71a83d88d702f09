"""BuildMonitor is a tensorrt.IProgressMonitor wherever tensorrt imports, and importing
trt_otel never imports tensorrt."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator

import pytest

import trt_otel
from trt_otel import BuildMonitor


class StrictIProgressMonitor:
    """Behaves like the pybind11 base: a subclass that skips its __init__ is unusable."""

    def __init__(self) -> None:
        self.base_initialised = True

    def __getattribute__(self, name: str) -> object:
        if name in ("phase_start", "step_complete", "phase_finish"):
            try:
                object.__getattribute__(self, "base_initialised")
            except AttributeError:
                raise TypeError(
                    "tensorrt.IProgressMonitor.__init__() must be called when overriding __init__"
                ) from None
        return object.__getattribute__(self, name)

    def step_complete(self, phase_name: str, step: int) -> bool:
        raise RuntimeError("pure virtual function called")


@pytest.fixture
def fake_tensorrt(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in for the tensorrt module (which cannot be installed here)."""
    module = types.ModuleType("tensorrt")
    module.IProgressMonitor = StrictIProgressMonitor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", module)
    yield module


def test_a_monitor_is_an_iprogressmonitor_where_tensorrt_imports(
    fake_tensorrt: types.ModuleType,
) -> None:
    monitor = BuildMonitor()
    assert isinstance(monitor, StrictIProgressMonitor)
    assert isinstance(monitor, BuildMonitor)
    monitor.phase_start("A", None, 1)
    assert monitor.step_complete("A", 0) is True  # ours, not the base's pure virtual
    monitor.phase_finish("A")
    assert monitor.state.steps_completed_total == 1


def test_subclasses_of_buildmonitor_are_bound_too(fake_tensorrt: types.ModuleType) -> None:
    class Mine(BuildMonitor):
        pass

    monitor = Mine()
    assert isinstance(monitor, Mine) and isinstance(monitor, StrictIProgressMonitor)
    assert type(monitor).__name__ == "Mine"
    assert monitor.step_complete("nothing open", 0) is True


def test_without_either_library_a_monitor_is_a_plain_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("tensorrt", "tensorrt_rtx"):
        monkeypatch.setitem(sys.modules, name, None)  # what an uninstalled module looks like
    monitor = BuildMonitor()
    assert type(monitor) is BuildMonitor
    assert monitor.backend is None


@pytest.mark.e2e
def test_importing_trt_otel_imports_neither_library() -> None:
    code = (
        "import sys, trt_otel, trt_otel.app.cli, trt_otel.builder.build; "
        "import trt_otel.capture.backends; "
        "print('tensorrt' in sys.modules, 'tensorrt_rtx' in sys.modules)"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "False False"


def test_the_public_api_is_exactly_all() -> None:
    # dir(), not vars(): instrument() is imported when first asked for.
    public = {name for name in dir(trt_otel) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(trt_otel, name), types.ModuleType)}
    assert public - modules == set(trt_otel.__all__) - {"__version__"}
    for name in trt_otel.__all__:
        assert hasattr(trt_otel, name)
