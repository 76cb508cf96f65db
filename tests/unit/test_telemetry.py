"""Span ids the event log can recompute, and log lines that carry the current span."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from agent_reach import telemetry
from agent_reach.ids import new_trace_id
from agent_reach.logs import JsonFormatter
from tests.support.otlp import OtlpReceiver


def test_derived_span_ids_are_stable_distinct_and_valid() -> None:
    ids = {
        telemetry.task_span_id("t1"),
        telemetry.dispatch_span_id("t1", "s", 1),
        telemetry.dispatch_span_id("t1", "s", 2),
        telemetry.execute_span_id("t1", "s", 1),
        telemetry.execute_span_id("t2", "s", 1),
    }
    assert len(ids) == 5
    assert all(len(i) == 16 and int(i, 16) != 0 for i in ids)
    assert telemetry.execute_span_id("t1", "s", 1) == telemetry.execute_span_id("t1", "s", 1)


def test_without_an_sdk_a_span_still_carries_its_ids_into_logs() -> None:
    trace_id = new_trace_id()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with telemetry.span("work", trace_id=trace_id, span_id="00000000000000aa") as current:
        assert not current.is_recording()
        assert telemetry.traceparent_of(current) == f"00-{trace_id}-00000000000000aa-01"
        inside = json.loads(JsonFormatter().format(record))
    outside = json.loads(JsonFormatter().format(record))
    assert (inside["trace_id"], inside["span_id"]) == (trace_id, "00000000000000aa")
    assert "trace_id" not in outside


def test_an_invalid_trace_id_makes_no_span_and_no_error() -> None:
    with telemetry.span("work", trace_id="not-a-trace") as current:
        assert not current.get_span_context().is_valid


def test_tracing_stays_off_without_an_endpoint() -> None:
    assert telemetry.configure_tracing("x", env={}) is False
    assert telemetry.configure_tracing("x", env={"OTEL_SDK_DISABLED": "true"}) is False
    assert not telemetry.tracing_enabled()


# A process that traces TRACES tasks: each a root span and, as a later process would, a span
# continuing a stored parent (the task's derived span id).
SAMPLED_PROCESS = """
import sys
from agent_reach import telemetry
from agent_reach.ids import new_trace_id
assert telemetry.configure_tracing("sampling-test")
for _ in range(int(sys.argv[1])):
    trace_id = new_trace_id()
    root = telemetry.task_span_id(trace_id)
    with telemetry.span("submit_task", trace_id=trace_id, span_id=root) as current:
        # A dropped trace's span is its ids alone, flagged not sampled (what goes downstream).
        kept = telemetry.sampled_trace(int(trace_id, 16))
        context = current.get_span_context()
        assert current.is_recording() is kept
        assert context.trace_flags.sampled is kept
        assert (context.trace_id, context.span_id) == (int(trace_id, 16), int(root, 16))
    with telemetry.span("dispatch_step", trace_id=trace_id, parent_span_id=root):
        pass
telemetry.flush_tracing()
"""


def test_a_ratio_sampler_keeps_or_drops_a_tasks_spans_together(tmp_path: Path) -> None:
    traces = 200
    with OtlpReceiver() as otlp:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.5",
        }
        subprocess.run(
            [sys.executable, "-c", SAMPLED_PROCESS, str(traces)],
            env=env,
            check=True,
            timeout=60,
            cwd=tmp_path,
        )
        spans = otlp.spans()
    names: dict[str, set[str]] = {}
    for s in spans:
        names.setdefault(s.trace_id, set()).add(s.name)
    assert 0 < len(names) < traces, len(names)  # the sampler did drop some, and kept some
    assert all(kept == {"submit_task", "dispatch_step"} for kept in names.values()), names


FAILING_PROCESS = """
from agent_reach import telemetry
from agent_reach.ids import new_trace_id
assert telemetry.configure_tracing("errors-test")
for kind in ("unexpected", "marked"):
    try:
        with telemetry.span(kind, trace_id=new_trace_id()) as current:
            if kind == "marked":
                telemetry.mark_error(current, "downstream_unavailable")
            raise ValueError("token=canary-0451 in https://canary-0451.example/x")
    except ValueError:
        pass
telemetry.flush_tracing()
"""


def test_a_failed_span_says_the_error_type_never_the_message(tmp_path: Path) -> None:
    with OtlpReceiver() as otlp:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url}
        subprocess.run(
            [sys.executable, "-c", FAILING_PROCESS], env=env, check=True, timeout=60, cwd=tmp_path
        )
        spans = {s.name: s for s in otlp.spans()}
    assert set(spans) == {"unexpected", "marked"}
    assert (spans["unexpected"].status_code, spans["unexpected"].status_message) == (
        2,
        "ValueError",
    )
    assert spans["unexpected"].attributes["error.type"] == "ValueError"
    assert spans["marked"].attributes["error.type"] == "downstream_unavailable"  # kept
    assert "canary-0451" not in repr(list(spans.values()))
