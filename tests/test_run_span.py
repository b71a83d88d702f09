"""The span of ``trt-otel run``'s program, and the trace context the program is handed: its
``TRACEPARENT`` names the run's span, and the job's ``TRACESTATE`` goes with it only where it
belongs to the trace the run joined."""

from __future__ import annotations

from trt_otel.app.run_span import RunSpan

JOB_TRACE, JOB_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def test_the_program_joins_the_jobs_trace_with_its_trace_state() -> None:
    environ = {"TRACEPARENT": f"00-{JOB_TRACE}-{JOB_SPAN}-01", "TRACESTATE": "ci=github"}
    span = RunSpan.start(["/usr/bin/python3", "build.py"], environ)

    handed = span.environment({**environ, "PATH": "/usr/bin"})
    assert handed["TRACEPARENT"] == f"00-{JOB_TRACE}-{span.span_id:016x}-01"
    assert handed["TRACESTATE"] == "ci=github"
    assert handed["PATH"] == "/usr/bin", "the rest of the environment is the program's"


def test_a_trace_state_without_a_valid_parent_is_not_handed_on() -> None:
    """A ``TRACESTATE`` whose ``TRACEPARENT`` is not a valid one belongs to no trace the run
    joins: the run starts a trace of its own, and the program must not carry the stale state
    into it."""
    environ = {"TRACEPARENT": "junk", "TRACESTATE": "ci=github", "PATH": "/usr/bin"}
    span = RunSpan.start(["build.py"], environ)

    handed = span.environment(environ)
    assert span.parent is None
    assert handed["TRACEPARENT"] == span.traceparent
    assert "TRACESTATE" not in handed


def test_an_unsampled_jobs_choice_is_kept_by_the_run_and_its_program() -> None:
    environ = {"TRACEPARENT": f"00-{JOB_TRACE}-{JOB_SPAN}-00"}
    span = RunSpan.start(["build.py"], environ)

    assert not span.sampled
    assert span.environment({})["TRACEPARENT"].endswith("-00")
    record = span.record("run-1", exit_code=3)
    assert not record.sampled and record.parent_is_remote
    assert record.parent_span_id == int(JOB_SPAN, 16)
    assert record.attributes["cicd.pipeline.result"] == "failure"


def test_a_run_outside_any_trace_starts_a_sampled_trace_of_its_own() -> None:
    span = RunSpan.start(["build.py"], {"PATH": "/usr/bin"})

    assert span.parent is None and span.sampled
    assert span.environment({})["TRACEPARENT"] == f"00-{span.trace_id:032x}-{span.span_id:016x}-01"
    record = span.record("run-1", exit_code=0)
    assert record.sampled and not record.parent_is_remote
    assert record.parent_span_id is None
