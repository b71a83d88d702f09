"""Drives a progress monitor exactly the way TensorRT's builder does.

What TensorRT (through its Python bindings) does, and this driver reproduces:

* callbacks in plan order, from one builder thread or, with ``threads > 1``, from several;
* a ``step_complete`` that raises or returns anything but a ``bool`` prints
  ``[ERROR] Exception caught in step_complete()`` and counts as ``False``;
* an exception in ``phase_start`` or ``phase_finish`` is printed and swallowed;
* on ``False`` it issues no more steps, calls ``phase_finish`` for every open phase, innermost
  first, and the build returns ``None``;
* a cancel cannot take effect while the builder is silent: the driver only looks at the answer
  of the next ``step_complete``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from trt_otel.builder.simulator.callbacks import Callback
from trt_otel.builder.simulator.plan import TimeModel


class ProgressMonitorLike(Protocol):
    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None: ...

    def step_complete(self, phase_name: str, step: int) -> bool: ...

    def phase_finish(self, phase_name: str) -> None: ...


class NoOpMonitor:
    """A monitor that watches nothing and never cancels (a build without a monitor)."""

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        pass

    def step_complete(self, phase_name: str, step: int) -> bool:
        return True

    def phase_finish(self, phase_name: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class DriveResult:
    """What a simulated build did: ``cancelled_at`` is the index of the refused step."""

    completed: bool
    callbacks_made: int
    cancelled_at: int | None = None


class Driver:
    """Replays a plan of callbacks into a monitor with a time model.

    ``speed`` divides the modelled delays (0: no delays at all); ``silence_s`` inserts one
    silent window before callback ``silence_at`` (default: where tactic timing begins, where real
    builds go quiet longest). ``sleep`` is injectable so tests need not wait.
    """

    def __init__(
        self,
        *,
        speed: float = 1.0,
        time_model: TimeModel | None = None,
        silence_s: float = 0.0,
        silence_at: int | None = None,
        threads: int = 1,
        sleep: Callable[[float], None] = time.sleep,
        stderr: TextIO | None = None,
    ) -> None:
        if speed < 0:
            raise ValueError("speed must be 0 (as fast as possible) or positive")
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.speed = speed
        self.time_model = time_model or TimeModel()
        self.silence_s = silence_s
        self.silence_at = silence_at
        self.threads = threads
        self.sleep = sleep
        self.stderr = stderr

    def run(self, monitor: ProgressMonitorLike, plan: Sequence[Callback]) -> DriveResult:
        silence_at = self._silence_index(plan)
        open_phases: list[str] = []
        # One single-thread pool per builder thread; each phase instance is handled by one of
        # them in turn, so sibling phases call back from different threads, as with max_threads.
        pools = [ThreadPoolExecutor(1, f"trt-builder-{i}") for i in range(self.threads)]
        pool_of_phase: dict[str, ThreadPoolExecutor] = {}
        phases_started = 0

        def pool_for(name: str) -> ThreadPoolExecutor | None:
            return pool_of_phase.get(name) if self.threads > 1 else None

        try:
            for index, callback in enumerate(plan):
                self._wait(callback, index == silence_at)
                name = callback.name
                if callback.kind == "phase_start":
                    pool_of_phase[name] = pools[phases_started % self.threads]
                    phases_started += 1
                    self._call(pool_for(name), self._phase_start, monitor, callback)
                    open_phases.append(name)
                elif callback.kind == "phase_finish":
                    self._call(pool_for(name), self._phase_finish, monitor, name)
                    if name in open_phases:
                        del open_phases[len(open_phases) - 1 - open_phases[::-1].index(name)]
                elif not self._call(pool_for(name), self._step_complete, monitor, callback):
                    for open_name in reversed(open_phases):
                        self._call(pool_for(open_name), self._phase_finish, monitor, open_name)
                    return DriveResult(False, index + 1 + len(open_phases), cancelled_at=index)
            return DriveResult(True, len(plan))
        finally:
            for pool in pools:
                pool.shutdown(wait=True)

    def _silence_index(self, plan: Sequence[Callback]) -> int | None:
        if self.silence_s <= 0:
            return None
        if self.silence_at is not None:
            return self.silence_at
        for index, callback in enumerate(plan):
            if callback.kind == "phase_start" and callback.name == "Timing tactics":
                return index
        return len(plan) // 2

    def _wait(self, callback: Callback, silent_window: bool) -> None:
        delay = self.time_model.delay_s(callback) / self.speed if self.speed else 0.0
        if silent_window:
            delay += self.silence_s
        if delay > 0:
            self.sleep(delay)

    @staticmethod
    def _call(pool: ThreadPoolExecutor | None, function: Callable[..., Any], *args: Any) -> Any:
        if pool is None:
            return function(*args)
        return pool.submit(function, *args).result()

    def _phase_start(self, monitor: ProgressMonitorLike, callback: Callback) -> None:
        try:
            monitor.phase_start(callback.name, callback.parent, callback.num_steps)
        except Exception:
            self._print("[ERROR] Exception caught in phase_start()")

    def _phase_finish(self, monitor: ProgressMonitorLike, name: str) -> None:
        try:
            monitor.phase_finish(name)
        except Exception:
            self._print("[ERROR] Exception caught in phase_finish()")

    def _step_complete(self, monitor: ProgressMonitorLike, callback: Callback) -> bool:
        try:
            answer = monitor.step_complete(callback.name, callback.step)
        except Exception:
            answer = None
        # pybind11 converts the answer as TensorRT's binding does: a bool, or a number by its
        # truth (TensorRT-RTX 1.7.1 builds on with 1 or 2.5); anything else (None, a string, an
        # exception) is an error, and the build is cancelled.
        if type(answer) is not bool and not isinstance(answer, int | float):
            self._print("[ERROR] Exception caught in step_complete()")
            return False
        return bool(answer)

    def _print(self, message: str) -> None:
        print(message, file=self.stderr or sys.stderr)
