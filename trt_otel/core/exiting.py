"""A process's end without the interpreter's teardown, for the processes trt-otel owns (the
command, a build's worker): every module and object freed one by one, then the builder
library's own destructors, costs some tens of milliseconds at the end of every build, for a
process that is going away."""

from __future__ import annotations

import atexit
import os
import sys
import threading


def exit_without_teardown(code: int) -> None:
    """Exit with ``code`` at once, having done first what an exit does for others: the
    ``atexit`` functions run (multiprocessing's, logging's, OpenTelemetry's) and the standard
    streams flushed. Returns, changing nothing, where that cannot be done safely (a thread that
    is not a daemon still runs, or a stream cannot be flushed: a reader gone): the caller then
    ends as Python ends, which joins the thread or says what it could not write."""
    main_thread = threading.main_thread()
    if any(t is not main_thread and not t.daemon for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code)
