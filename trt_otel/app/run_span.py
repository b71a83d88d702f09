"""The span of ``trt-otel run``'s program, and the trace context handed to it.

The run is a CI/CD pipeline run of its own (``RUN <program>``, kind SERVER, action ``RUN``): its
span is the parent of every build the program makes (each build's record carries the run span's
``traceparent``, so each build span, live or replayed, is its child), and the program gets
``TRACEPARENT`` (and ``TRACESTATE``) naming it, so the program's own instrumentation joins the
same trace. A ``TRACEPARENT`` in trt-otel's environment (a traced CI job) is the run span's
parent, and its sampling decision is kept.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trt_otel.views.conventions import (
    CICD_PIPELINE_ACTION_NAME,
    CICD_PIPELINE_NAME,
    CICD_PIPELINE_RESULT,
    CICD_PIPELINE_RUN_ID,
    ERROR_TYPE,
    RUN_ACTION,
)
from trt_otel.views.spans import SpanRecord
from trt_otel.views.trace_ids import RemoteParent, parse_traceparent

EXIT_CODE_ATTRIBUTE = "process.exit.code"


@dataclass
class RunSpan:
    """The run's span context, chosen when the run starts; :meth:`record` is its span once the
    program has ended."""

    program: str
    parent: RemoteParent | None
    tracestate: str = ""
    trace_id: int = field(default_factory=lambda: secrets.randbits(128) or 1)
    span_id: int = field(default_factory=lambda: secrets.randbits(64) or 1)
    start_ns: int = field(default_factory=time.time_ns)
    exit_code: int = 0
    """The program's, once it has ended."""

    @classmethod
    def start(cls, command: Sequence[str], environ: Mapping[str, str] | None = None) -> RunSpan:
        """The span of a run of ``command``, in the trace of the environment's ``TRACEPARENT``
        when it is a valid one."""
        env = os.environ if environ is None else environ
        parent = parse_traceparent(env.get("TRACEPARENT", "").strip())
        program = os.path.basename(command[0]) if command else "program"
        span = cls(program, parent, env.get("TRACESTATE", "").strip() if parent else "")
        if parent is not None:
            span.trace_id = parent.trace_id
        return span

    @property
    def sampled(self) -> bool:
        return self.parent.sampled if self.parent is not None else True

    @property
    def traceparent(self) -> str:
        """The W3C ``traceparent`` naming this span."""
        flags = "01" if self.sampled else "00"
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{flags}"

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the trace context the program is to join."""
        env = {k: v for k, v in base.items() if k not in ("TRACEPARENT", "TRACESTATE")}
        env["TRACEPARENT"] = self.traceparent
        if self.tracestate:
            env["TRACESTATE"] = self.tracestate
        return env

    def record(self, run_id: str, exit_code: int, end_ns: int | None = None) -> SpanRecord:
        """The run's span, ended now (or at ``end_ns``) with the program's exit code."""
        result = "success" if exit_code == 0 else "failure"
        attributes: dict[str, Any] = {
            CICD_PIPELINE_ACTION_NAME: RUN_ACTION,
            CICD_PIPELINE_NAME: self.program,
            CICD_PIPELINE_RUN_ID: run_id,
            CICD_PIPELINE_RESULT: result,
            EXIT_CODE_ATTRIBUTE: exit_code,
        }
        if exit_code != 0:
            attributes[ERROR_TYPE] = str(exit_code)
        return SpanRecord(
            name=f"{RUN_ACTION} {self.program}",
            trace_id=self.trace_id,
            span_id=self.span_id,
            parent_span_id=self.parent.span_id if self.parent is not None else None,
            parent_is_remote=self.parent is not None,
            start_ns=self.start_ns,
            end_ns=end_ns if end_ns is not None else time.time_ns(),
            attributes=attributes,
            sampled=self.sampled,
            error=None if exit_code == 0 else f"the program exited with {exit_code}",
            server=True,
        )
