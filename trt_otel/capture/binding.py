"""What makes a monitor an ``IProgressMonitor`` of the builder library a build uses.

TensorRT takes ``config.progress_monitor`` only from an instance of its own pybind11 class, whose
``__init__`` must be called. A class derived from :class:`ProgressMonitorBase` is bound to a
library when its first instance is made: ``Monitor(backend=tensorrt_rtx)`` (the module),
``backend="tensorrt-rtx"`` (its name), else the library the program has already imported, else
the first installed (see :mod:`trt_otel.capture.backends`); with neither, or ``backend="none"``,
it stays a plain class (the simulator's builder takes any object).

Two monitors derive from it: :class:`~trt_otel.capture.monitor.BuildMonitor` (each callback an
event in a log) and the build worker's :class:`~trt_otel.capture.supervisor.RecordingMonitor`
(each callback a record, no more). What they share is this binding and how a build's result
becomes its outcome; nothing else.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Self

from trt_otel.capture import backends
from trt_otel.core.events import Outcome

_logger = logging.getLogger(__name__)

BackendChoice = object
"""A backend's name (``tensorrt``, ``tensorrt-rtx``, or ``none`` for a plain monitor) or its
module (``tensorrt_rtx``)."""
PLAIN = "none"


def _native_base_for(backend: BackendChoice | None) -> tuple[type | None, str | None]:
    """The ``IProgressMonitor`` class of the chosen library, and the library's backend name;
    ``(None, None)`` for a plain monitor."""
    if backend == PLAIN:
        return None, None
    if backend is None:
        chosen = backends.default_backend()
        if chosen is None:
            return None, None
        try:
            module: Any = backends.import_module(chosen)
        except Exception:  # a broken install must not stop the simulator path
            _logger.warning("%s is installed but does not import; a plain monitor", chosen.title)
            return None, None
    elif isinstance(backend, str):
        module = backends.import_module(backends.backend_named(backend))
    else:
        module = backend
    base = getattr(module, "IProgressMonitor", None)
    if not isinstance(base, type):
        return None, None  # the simulator, or anything else that takes any object
    known = backends.backend_of_module(module)
    return base, (known.name if known is not None else getattr(module, "__name__", None))


class ProgressMonitorBase:
    """A class that becomes a subclass of a builder library's ``IProgressMonitor`` when its
    first instance is made (see the module's doc). Subclasses call :meth:`_init_native` first
    in their ``__init__``, and define :meth:`end` and :attr:`cancelled`."""

    _bound_subclasses: ClassVar[dict[tuple[type, type], type]] = {}
    _native_base: ClassVar[type | None] = None
    _backend_name: ClassVar[str | None] = None

    def __new__(cls, *args: Any, backend: BackendChoice | None = None, **kwargs: Any) -> Self:
        target: type = cls
        if cls._native_base is None or backend is not None:  # a class from bound_to is bound
            target = cls.bound_to(backend)
        # super(ProgressMonitorBase, target) reaches the library's pybind11 __new__ (bound class).
        instance: Self = super(ProgressMonitorBase, target).__new__(target)  # type: ignore[misc]
        return instance

    @classmethod
    def bound_to(cls, backend: BackendChoice | None = None) -> type[Self]:
        """This class, bound to the ``IProgressMonitor`` of ``backend`` (a module or a name;
        None: the default library); the class itself when there is no such base."""
        base, name = _native_base_for(backend)
        if base is None:
            return cls  # a plain monitor
        if cls._native_base is not None:
            if issubclass(cls, base):
                return cls
            # Two pybind11 bases cannot share one instance.
            raise TypeError(
                f"{cls.__qualname__} is an IProgressMonitor of {cls._backend_name}; it cannot "
                f"be one of {name} too (bind the class you derived it from instead)"
            )
        key = (cls, base)
        bound = ProgressMonitorBase._bound_subclasses.get(key)
        if bound is None:
            bound = type(
                cls.__name__,
                (cls,) if issubclass(cls, base) else (cls, base),
                {
                    "__module__": cls.__module__,
                    "__qualname__": cls.__qualname__,
                    "_native_base": base,
                    "_backend_name": name,
                },
            )
            ProgressMonitorBase._bound_subclasses[key] = bound
        return bound

    @property
    def backend(self) -> str | None:
        """The library this monitor is an ``IProgressMonitor`` of (``tensorrt``,
        ``tensorrt-rtx``), or None for a plain monitor."""
        return type(self)._backend_name

    def _init_native(self) -> None:
        """Initialise the library's base: pybind11 requires it when ``__init__`` is overridden."""
        native_base = type(self)._native_base
        if native_base is not None:
            native_base.__init__(self)  # type: ignore[misc]

    # What a build is given (see :func:`~trt_otel.builder.build.run_build`): TensorRT's three
    # callbacks, the builder's log messages, and the build's end.

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        raise NotImplementedError

    def step_complete(self, phase_name: str, step: int) -> bool:
        raise NotImplementedError

    def phase_finish(self, phase_name: str) -> None:
        raise NotImplementedError

    def log_message(self, severity: str, message: str) -> None:
        raise NotImplementedError

    @property
    def cancelled(self) -> bool:
        raise NotImplementedError

    @property
    def outcome_detail(self) -> str:
        """What the recorded end says of the outcome ("" before the end)."""
        raise NotImplementedError

    def record_output(self, attributes: dict[str, Any]) -> None:
        """What a successful build produced (``engine.sha256``, ...), recorded before its end."""
        raise NotImplementedError

    def end(
        self, outcome: Outcome | None = None, detail: str = "", error_type: str | None = None
    ) -> Outcome:
        raise NotImplementedError

    def end_with_result(self, engine: object | None, failure_detail: str = "") -> Outcome:
        """Record the end from what ``build_serialized_network`` returned: ``None`` is a cancel
        when one was requested and a failure otherwise."""
        if engine is not None:
            return self.end(Outcome.SUCCESS)
        if self.cancelled:
            return self.end()
        return self.end(
            Outcome.FAILURE,
            failure_detail or "TensorRT returned no engine",
            error_type="BuildFailed",
        )
