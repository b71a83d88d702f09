"""What the MCP server asks of a fleet of builds, local (:class:`~trt_otel.app.fleet.Fleet`,
``trt-otel`` processes found again through a state directory) or on Ray
(:class:`~trt_otel.app.ray_fleet.RayFleet`, Ray jobs found again through a shared folder): one
protocol, with the same signatures and the same typed answers
(:mod:`~trt_otel.app.fleet_documents`), so a tool is one call whichever fleet serves it.

Each method checks its request as the command line would (bounded, paths inside :attr:`roots`,
network options refused unless :attr:`allow_network`) and raises
:class:`~trt_otel.app.fleet.FleetError` with a message for the caller. A fleet may take more
keyword arguments than these (Ray's resources, a cancel that waits), each with a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from trt_otel.app.fleet_documents import (
    BuildRequest,
    BuildStatus,
    BuildSummary,
    CancelAnswer,
    EventsPage,
    FitAnswer,
    WaitAnswer,
)


class BuildFleet(Protocol):
    """Builds started, followed and cancelled on someone's behalf."""

    @property
    def roots(self) -> tuple[Path, ...]:
        """The folders every path of a request must resolve inside."""
        ...

    @property
    def allow_network(self) -> bool:
        """Whether a request may point a build at the network (an OTLP endpoint, a URL)."""
        ...

    @property
    def reserved(self) -> Mapping[str, str]:
        """What the fleet sets itself (by the parser's names, with their options): a request
        that sets one is refused, and a schema of the request's settings leaves them out."""
        ...

    def start(self, request: BuildRequest) -> BuildStatus:
        """Start a build (``build`` or ``demo``); its status, with its id."""
        ...

    def fit(self, model: str, deadline: str, history: str) -> FitAnswer:
        """Whether a build of ``model`` would end within ``deadline``, from ``history``."""
        ...

    def list(self) -> list[BuildSummary]:
        """Every build, oldest first."""
        ...

    def status(self, build_id: str) -> BuildStatus:
        """A build's state, progress, cancel and outcome."""
        ...

    def events(self, build_id: str, since_seq: int = -1, limit: int = 200) -> EventsPage:
        """A build's events after ``since_seq``, at most ``limit``."""
        ...

    def wait(self, build_id: str, until: str = "progress", timeout_s: float = 30.0) -> WaitAnswer:
        """Until the build progresses (or ends, ``until="end"``), or ``timeout_s`` passes."""
        ...

    def cancel(self, build_id: str, reason: str = "") -> CancelAnswer:
        """Cancel a running build, with a reason."""
        ...
