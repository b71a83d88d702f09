"""What the views and the cancel policies may read of a build, and the one thing they may do to it.

They are given a build, never the monitor: whatever captures the build (the monitor on TensorRT's
threads, the supervisor's replay of a worker, a followed journal) satisfies these protocols, and a
view or a policy neither knows nor depends on which.
"""

from __future__ import annotations

from typing import Protocol

from trt_otel.core.events import CancelSource
from trt_otel.core.log import EventLog
from trt_otel.core.readmodel import ReadModel
from trt_otel.core.state import BuildState


class CancellableBuild(Protocol):
    """A build's log and state, to read under the log's lock, and its cancel (safe from any thread:
    only the first request is recorded as the reason, and True says this one was it)."""

    log: EventLog

    @property
    def state(self) -> BuildState: ...

    @property
    def cancelled(self) -> bool: ...

    def cancel(
        self,
        reason: str,
        *,
        source: str = CancelSource.USER,
        timeout: bool = False,
        policy: str = "",
    ) -> bool: ...


class ObservedBuild(CancellableBuild, Protocol):
    """A cancellable build and what its capture counts of itself, for the health metrics."""

    @property
    def build_id(self) -> str: ...

    @property
    def model(self) -> ReadModel | None:
        """The read model that is the build's fold, if it has one (a follower with no queue)."""
        ...

    @property
    def callbacks_total(self) -> int: ...

    @property
    def callback_ns_total(self) -> int: ...

    @property
    def internal_errors(self) -> int: ...
