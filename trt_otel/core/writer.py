"""A journal's writer's signs of life: who it is (in the header) and a touch of the file while it
is open, however long the build is silent. :mod:`trt_otel.capture.liveness` reads them back."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

TOUCH_INTERVAL_S = 10.0


def writer_fields() -> dict[str, Any]:
    """What a journal's header says about its writer."""
    return {
        "writer_pid": os.getpid(),
        "writer_host": socket.gethostname(),
        "touch_interval_s": TOUCH_INTERVAL_S,
    }


class Toucher:
    """Touches ``path`` every ``interval_s`` on a daemon thread, until :meth:`stop`."""

    def __init__(self, path: Path, interval_s: float = TOUCH_INTERVAL_S) -> None:
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="trt-otel-journal-touch", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError):  # a sign of life, never a reason to fail
                os.utime(self.path)

    def stop(self) -> None:
        self._stop.set()
