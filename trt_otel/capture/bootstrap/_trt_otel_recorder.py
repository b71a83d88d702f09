"""Inside a program observed by ``trt-otel run``: record every TensorRT build it makes.

This module runs in someone else's program, so it imports nothing but the standard library (the
program's interpreter may not have trt-otel's dependencies), never raises into the program, and
changes nothing the program can see except that its builds are watched:

- When the program imports ``tensorrt`` or ``tensorrt_rtx``, their ``Builder``'s build methods
  are wrapped. Each call is one build: its network is described (name, layers, inputs with
  shapes, the library and its version), a recorder is set as ``config.progress_monitor`` for the
  call, and the program's own monitor is put back afterwards.
- The recorder does what the worker of ``trt-otel build`` does per callback and no more: a tuple
  appended to a deque. It passes every callback on to the program's own monitor, whose False
  (or exception) still cancels the build, exactly as without trt-otel.
- A thread sends the records to the ``trt-otel`` process in batches (a Unix socket named in the
  environment); that process runs the event log, the projections and the policies. A cancel
  comes back on the same socket and is a flag that the next ``step_complete`` reads.

The same patching serves ``trt_otel.instrument()`` in-process, with a different :class:`Sink`.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

LIBRARIES = {"tensorrt": "tensorrt", "tensorrt_rtx": "tensorrt-rtx"}
"""Module name -> backend name, as ``trt-otel build`` names them."""
BUILD_METHODS = (
    "build_serialized_network",
    "build_serialized_network_to_stream",
    "build_engine_with_config",
    "build_engine",
)
SOCKET_ENV = "TRT_OTEL_RUN_SOCKET"
AUTHKEY_ENV = "TRT_OTEL_RUN_AUTHKEY"
_ORIGINAL = "__trt_otel_original__"

_wall_ns, _mono_ns, _perf_ns = time.time_ns, time.monotonic_ns, time.perf_counter_ns
_PLAIN = (str, int, float, bool, bytes, type(None))
_names = threading.local()


def _thread_name() -> str:
    # Looked up once per thread: current_thread() costs more than a callback can spare.
    try:
        name: str = _names.name
    except AttributeError:
        name = _names.name = threading.current_thread().name
    return name


def _plain(value: object) -> object:
    """A callback argument that should not cross the socket (TensorRT only passes str, int and
    None), as its text."""
    return value if type(value) in _PLAIN else f"<{type(value).__name__}> {value!r}"


def _cancels(answer: object) -> bool:
    """Whether the binding takes ``answer`` from ``step_complete`` as a cancel: it converts it
    to a bool as pybind11 does, so None and what is false cancel, what is true does not, and
    what has no truth of its own (a string) is an error, which cancels."""
    if answer is None:
        return True
    to_bool = getattr(type(answer), "__bool__", None)
    if to_bool is None:
        return True
    try:
        return not to_bool(answer)
    except Exception:
        return True


# -- describing a build ------------------------------------------------------------------------


def describe_network(network: Any) -> dict[str, Any]:
    """What is known of the network being built; each item only if the binding offers it."""
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        info["network.name"] = str(network.name)
    with contextlib.suppress(Exception):
        info["network.layers"] = int(network.num_layers)
    with contextlib.suppress(Exception):
        inputs = []
        for index in range(int(network.num_inputs)):
            tensor = network.get_input(index)
            shape = ",".join(str(int(d)) for d in tensor.shape)
            dtype = str(tensor.dtype).rsplit(".", 1)[-1]
            inputs.append(f"{tensor.name}: {dtype}[{shape}]")
        info["network.inputs"] = inputs
    with contextlib.suppress(Exception):
        info["network.outputs"] = int(network.num_outputs)
    return info


def describe_library(module: ModuleType) -> dict[str, Any]:
    name = module.__name__.split(".")[0]
    return {
        "trt.backend": LIBRARIES.get(name, name),
        "trt.version": str(getattr(module, "__version__", "unknown")),
    }


# -- the sink: where builds go -----------------------------------------------------------------


class Build(Protocol):
    """One build, as the sink sees it."""

    def callbacks(self, library: ModuleType, own: Any) -> Any:
        """The object to set as ``config.progress_monitor`` for this build (it calls ``own``,
        the program's monitor, when there is one)."""
        ...

    def finished(self, returned: bool, error: BaseException | None) -> None:
        """The build call returned (``returned``: an engine or True) or raised ``error``."""
        ...

    @property
    def interrupted(self) -> bool:
        """Ctrl-C came during the build (raise it again when the build returns)."""
        ...

    def interrupt(self) -> None:
        """Ctrl-C during the build: cancel it at the next step."""
        ...


class Sink(Protocol):
    def begin(self, attributes: dict[str, Any]) -> Build | None:
        """A build starts; None leaves it unobserved (the sink is broken or gone)."""
        ...


class _Installed:
    """What :func:`install` set up (module state, one per process)."""

    sink: Sink | None = None
    hook: _ImportHook | None = None


_installed = _Installed()


# -- the recorder: the callbacks inside the program --------------------------------------------


_recorder_classes: dict[int, type] = {}


# Long: the class is made here, since its base (the program's own library's
# IProgressMonitor) is known only at run time; its callbacks are written out in full, with no
# helper calls on the builder's threads.
def recorder_class(library: ModuleType) -> type:
    """A recorder deriving from ``library.IProgressMonitor`` (pybind11 needs the real base)."""
    base = library.IProgressMonitor
    cached = _recorder_classes.get(id(base))
    if cached is not None:
        return cached

    class Recorder(base):  # type: ignore[misc,valid-type]
        """Each callback: a tuple appended to the build's deque, then the program's own monitor.

        Called by TensorRT's builder threads. Our part never raises; the program's monitor is
        called as TensorRT would call it, so what it raises or answers has its usual effect.
        """

        def __init__(self, build: ForwardedBuild, own: Any) -> None:
            base.__init__(self)
            self._build = build
            self._records = build.records
            self._own = own

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            began_ns = _perf_ns()
            try:
                build = self._build
                if (
                    type(phase_name) is str
                    and type(num_steps) is int
                    and (parent_phase is None or type(parent_phase) is str)
                ):
                    self._records.append(
                        (
                            "phase_start",
                            _wall_ns(),
                            _mono_ns(),
                            _thread_name(),
                            phase_name,
                            parent_phase,
                            num_steps,
                        )
                    )
                else:
                    self._records.append(
                        (
                            "phase_start",
                            _wall_ns(),
                            _mono_ns(),
                            _thread_name(),
                            _plain(phase_name),
                            _plain(parent_phase),
                            _plain(num_steps),
                        )
                    )
                build.callbacks_total += 1
                build.callback_ns_total += _perf_ns() - began_ns
            except BaseException as error:
                self._build.caught(error)
            own = self._own
            if own is not None:
                own.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            began_ns = _perf_ns()
            build = self._build
            try:
                if type(phase_name) is str and type(step) is int:
                    self._records.append(
                        ("step", _wall_ns(), _mono_ns(), _thread_name(), phase_name, step)
                    )
                else:
                    self._records.append(
                        (
                            "step",
                            _wall_ns(),
                            _mono_ns(),
                            _thread_name(),
                            _plain(phase_name),
                            _plain(step),
                        )
                    )
                build.callbacks_total += 1
                build.callback_ns_total += _perf_ns() - began_ns
            except BaseException as error:
                build.caught(error)
            own = self._own
            if own is not None:
                try:
                    answer = own.step_complete(phase_name, step)
                except BaseException as error:
                    # TensorRT cancels on it, as it would without us: say so, then let it.
                    build.own_cancel(f"raised {type(error).__name__}: {error}")
                    raise
                if answer is not True and _cancels(answer):
                    build.own_cancel(f"answered {answer!r}")
                # The program's answer as it gave it: the binding reads it as without us.
                return False if build.cancelled else answer
            return not build.cancelled

        def phase_finish(self, phase_name: str) -> None:
            began_ns = _perf_ns()
            try:
                build = self._build
                name = phase_name if type(phase_name) is str else _plain(phase_name)
                self._records.append(("phase_finish", _wall_ns(), _mono_ns(), _thread_name(), name))
                build.callbacks_total += 1
                build.callback_ns_total += _perf_ns() - began_ns
            except BaseException as error:
                self._build.caught(error)
            own = self._own
            if own is not None:
                own.phase_finish(phase_name)

    _recorder_classes[id(base)] = Recorder
    return Recorder


class ForwardedBuild:
    """A build whose records go to the ``trt-otel`` process."""

    def __init__(self, sink: RemoteSink, number: int) -> None:
        self.sink = sink
        self.number = number
        self.records: deque[tuple[Any, ...]] = deque()
        self.cancelled = False
        """Set by the socket's reader thread when ``trt-otel`` cancels this build."""
        self.callbacks_total = 0
        self.callback_ns_total = 0
        self.internal_errors = 0
        self._own_cancelled = False
        self.interrupted = False
        self.done = False

    def callbacks(self, library: ModuleType, own: Any) -> Any:
        return recorder_class(library)(self, own)

    def caught(self, error: BaseException) -> None:
        """Our part of a callback raised (a KeyboardInterrupt from a handler of the program's
        own, most likely): never into TensorRT."""
        if isinstance(error, KeyboardInterrupt):
            self.interrupt()
        else:
            self.internal_errors += 1

    def interrupt(self) -> None:
        if not self.interrupted:
            self.interrupted = self.cancelled = True
            self.records.append(("interrupt", _wall_ns(), _mono_ns(), _thread_name()))

    def own_cancel(self, how: str) -> None:
        if not self._own_cancelled:
            self._own_cancelled = True
            self.records.append(("own_cancel", _wall_ns(), _mono_ns(), _thread_name(), how))

    def finished(self, returned: bool, error: BaseException | None) -> None:
        text = None if error is None else f"{type(error).__name__}: {error}"
        self.records.append(
            (
                "done",
                _wall_ns(),
                _mono_ns(),
                _thread_name(),
                returned,
                text,
                None if error is None else type(error).__name__,
            )
        )
        self.done = True
        # The end goes out now, not at the next tick: the program may exit right after.
        self.sink.flush()


class Channel(Protocol):
    """Where records go and cancels come from: a ``multiprocessing`` connection to
    ``trt-otel run``, or an in-process stand-in for ``trt_otel.instrument()``."""

    def send(self, message: tuple[Any, ...]) -> None: ...

    def recv(self) -> Any: ...

    def close(self) -> None: ...


def socket_channel(address: str, authkey: bytes) -> Callable[[], Channel]:
    def connect() -> Channel:
        from multiprocessing.connection import Client

        connection: Channel = Client(address, family="AF_UNIX", authkey=authkey)
        return connection

    return connect


class RemoteSink:
    """The channel to the process that runs the projections, opened at the first build."""

    def __init__(self, connect: Callable[[], Channel], describe: str) -> None:
        self._connect_channel = connect
        self._describe = describe
        self._connection: Any = None
        self._broken = False
        self._builds: dict[int, ForwardedBuild] = {}
        self._numbers = 0
        self._lock = threading.Lock()
        """Serialises sends (the forwarder thread and a build's end) and the build table."""
        self._wake = threading.Event()

    def begin(self, attributes: dict[str, Any]) -> Build | None:
        with self._lock:
            if not self._connect():
                return None
            self._numbers += 1
            build = ForwardedBuild(self, self._numbers)
            self._builds[build.number] = build
            if not self._send(("begin", build.number, attributes, _wall_ns(), _mono_ns())):
                return None
        return build

    def _connect(self) -> bool:
        if self._connection is not None or self._broken:
            return not self._broken
        try:
            self._connection = self._connect_channel()
            self._connection.send(("hello", os.getpid(), list(sys.argv)))
        except Exception as error:
            self._broken = True
            print(
                f"trt-otel: cannot reach {self._describe} ({error}); builds are not observed",
                file=sys.stderr,
            )
            return False
        for target, name in (
            (self._forward, "trt-otel-forwarder"),
            (self._listen, "trt-otel-cancel"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()
        atexit.register(self.flush)
        return True

    def _send(self, message: tuple[Any, ...]) -> bool:
        """Send under the lock; a broken socket (trt-otel gone) stops the recording, never
        the program."""
        if self._broken or self._connection is None:
            return False
        try:
            self._connection.send(message)
        except Exception:
            self._broken = True
            return False
        return True

    def flush(self) -> None:
        with self._lock:
            for number, build in list(self._builds.items()):
                batch = []
                with contextlib.suppress(IndexError):
                    while True:
                        batch.append(build.records.popleft())
                if batch:
                    self._send(
                        ("records", number, batch, build.callbacks_total, build.callback_ns_total)
                    )
                if build.done and not build.records:
                    del self._builds[number]

    def _forward(self, interval_s: float = 0.05) -> None:
        # Batches, not a message per callback: tuples of ints and strings pickle in C, so this
        # thread competes little with the builder's callbacks for the GIL.
        while not self._broken:
            self._wake.wait(interval_s)
            self.flush()

    def close(self) -> None:
        """Send what is left and stop (``uninstrument()``); builds after this go unobserved."""
        self.flush()
        with self._lock:
            self._broken = True
            self._wake.set()
            connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()

    def _listen(self) -> None:
        connection = self._connection
        while True:
            try:
                message = connection.recv()
            except Exception:
                return
            if message is None:
                return
            if message[0] == "cancel":
                build = self._builds.get(message[1])
                if build is not None:
                    build.cancelled = True


# -- patching the libraries --------------------------------------------------------------------


def _network_and_config(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    network = args[0] if args else kwargs.get("network")
    config = args[1] if len(args) > 1 else kwargs.get("config")
    return network, config


def _wrap(library: ModuleType, method: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def build(builder: Any, *args: Any, **kwargs: Any) -> Any:
        sink = _installed.sink
        network, config = _network_and_config(args, kwargs)
        if sink is None or config is None:
            return original(builder, *args, **kwargs)
        own: Any = None
        observed: Build | None = None
        try:
            own = config.progress_monitor
            attributes = {
                **describe_library(library),
                **describe_network(network),
                "build.method": method,
            }
            observed = sink.begin(attributes)
            if observed is not None:
                config.progress_monitor = observed.callbacks(library, own)
        except Exception:
            observed = None
        if observed is None:
            return original(builder, *args, **kwargs)
        restore = _hold_interrupts(observed)
        try:
            result = original(builder, *args, **kwargs)
        except BaseException as error:
            observed.finished(False, error)
            raise
        finally:
            restore()
            with contextlib.suppress(Exception):
                config.progress_monitor = own
        observed.finished(result is not None and result is not False, None)
        if observed.interrupted:
            raise KeyboardInterrupt
        return result

    build.__name__ = method
    build.__qualname__ = f"Builder.{method}"
    build.__doc__ = original.__doc__
    setattr(build, _ORIGINAL, original)
    return build


def _hold_interrupts(build: Build) -> Callable[[], None]:
    """While the build runs, Ctrl-C cancels it, and the KeyboardInterrupt comes when the build
    returns. Python raises KeyboardInterrupt on the main thread, which is where TensorRT-RTX
    calls the monitor back: raised inside a callback, the binding would print and swallow it
    (or answer a cancel with it), and the program would never see its interrupt. Only
    Python's own handler is replaced; a program's handler of its own is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        previous = signal.getsignal(signal.SIGINT)
        if previous is not signal.default_int_handler:
            return lambda: None
        signal.signal(signal.SIGINT, lambda signum, frame: build.interrupt())
    except Exception:
        return lambda: None

    def restore() -> None:
        with contextlib.suppress(Exception):
            signal.signal(signal.SIGINT, previous)

    return restore


def patch(library: ModuleType) -> None:
    """Wrap the build methods of ``library.Builder`` (once; harmless to repeat)."""
    builder = getattr(library, "Builder", None)
    if builder is None:
        return
    for method in BUILD_METHODS:
        original = builder.__dict__.get(method)
        if original is None or hasattr(original, _ORIGINAL):
            continue
        with contextlib.suppress(Exception):
            setattr(builder, method, _wrap(library, method, original))


def unpatch(library: ModuleType) -> None:
    builder = getattr(library, "Builder", None)
    for method in BUILD_METHODS:
        wrapped = getattr(builder, "__dict__", {}).get(method)
        original = getattr(wrapped, _ORIGINAL, None)
        if original is not None:
            with contextlib.suppress(Exception):
                setattr(builder, method, original)


class _PatchingLoader(importlib.abc.Loader):
    """The library's own loader, then the patch."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._loader  # as if we had never been there
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        with contextlib.suppress(Exception):
            patch(module)


class _ImportHook(importlib.abc.MetaPathFinder):
    """Patches ``tensorrt`` and ``tensorrt_rtx`` when the program imports them."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LIBRARIES or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        except Exception:
            return None
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader)
        return spec


def install(sink: Sink) -> None:
    """Observe every build from now on through ``sink``: the libraries already imported at
    once, the others when they are imported."""
    _installed.sink = sink
    if _installed.hook is None:
        _installed.hook = _ImportHook()
        sys.meta_path.insert(0, _installed.hook)
    for name in LIBRARIES:
        module = sys.modules.get(name)
        if module is not None:
            patch(module)


def uninstall() -> None:
    """Stop observing: the libraries' own methods back, the import hook gone."""
    _installed.sink = None
    if _installed.hook is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_installed.hook)
        _installed.hook = None
    for name in LIBRARIES:
        module = sys.modules.get(name)
        if module is not None:
            unpatch(module)


def install_from_environment() -> bool:
    """Called by the bootstrap ``sitecustomize``: record for ``trt-otel run`` when it started
    this process (its socket is in the environment)."""
    address = os.environ.get(SOCKET_ENV)
    if not address:
        return False
    try:
        authkey = bytes.fromhex(os.environ.get(AUTHKEY_ENV, ""))
    except ValueError:
        authkey = b""
    install(RemoteSink(socket_channel(address, authkey), f"trt-otel run at {address}"))
    return True
