"""One task, one trace: a real OTLP receiver gets the whole tree from the submit request down to
the downstream HTTP call, across a retry that runs later on another executor, and the downstream
saw the header."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from agent_reach import telemetry
from agent_reach.ids import new_span_id, new_trace_id, parse_traceparent
from tests.e2e.processes import REACH, all_terminal, api, cluster, wait_until
from tests.e2e.test_cluster import plan, sink_tools
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.sink import Response, Sink

pytestmark = pytest.mark.e2e
TOOL = "ledger.post"


def test_a_task_is_one_trace_from_the_request_to_the_downstream_call(
    postgres_url: str, tmp_path: Path
) -> None:
    caller_trace, caller_span = new_trace_id(), new_span_id()
    with OtlpReceiver() as otlp, Sink() as sink:
        # The first attempt meets a 503 and runs on one executor, which then stops; the retry
        # runs seconds later on another one: two attempts, two processes, one trace.
        sink.script("/ledger", [Response(status=503, retry_after=2), Response(json={"ok": 1})])
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        with cluster(tmp_path, env=env) as c:
            ctl = c.controller(
                "controller",
                database_url=postgres_url,
                tools=sink_tools(tmp_path, sink.url),
                extra=["--migrate"],
            )
            first = c.executor("first", controller=ctl, slots=2)
            with api(ctl) as client:
                answer = client.post(
                    "/v1/tasks",
                    json=plan(1, 0),
                    headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"},
                )
                assert answer.status_code == 202, answer.text
                task_id = answer.json()["task_id"]
                assert answer.json()["trace_id"] == caller_trace  # the caller's trace goes on
                wait_until(lambda: sink.requests("/ledger"), within=30, what="the first attempt")
                assert first.terminate() == 0  # drains: its report and spans go out first
                c.executor("second", controller=ctl, slots=2)
                (task,) = wait_until(
                    lambda: all_terminal(client, [task_id]), within=30, what="the task"
                )
            assert task["status"] == "succeeded"
            exported = subprocess.run(
                [*REACH, "trace", "export", task_id, "--url", f"http://{ctl.info['http']}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
                env=c.env,
            )

            def whole_tree() -> list[ReceivedSpan] | None:
                spans = [s for s in otlp.spans() if s.trace_id == caller_trace]
                names = Counter(s.name for s in spans)
                wanted = {f"execute_tool {TOOL}": 2, "POST": 2, f"dispatch_step {TOOL}": 2}
                return spans if all(names[n] >= k for n, k in wanted.items()) else None

            spans = wait_until(whole_tree, within=30, what="every span at the receiver")
        deliveries = sink.requests("/ledger")

    by_id = {s.span_id: s for s in spans}
    assert len(by_id) == len(spans), "span ids are unique"
    (request,) = [s for s in spans if s.parent_span_id == caller_span]
    assert (request.name, request.kind) == ("POST /v1/tasks", "server")
    assert request.service == "agent-reach-controller"
    root = by_id[telemetry.task_span_id(task_id)]
    assert root.name == "submit_task"
    assert root.parent_span_id == request.span_id  # FastAPI's server span, nothing between
    assert not [s.name for s in spans if s.name.startswith("fastapi.")]  # no operation spans
    assert root.attributes[telemetry.TASK_ID] == task_id
    assert root.attributes[telemetry.ENVIRONMENT] == "dev"  # the controller's default
    for name in ("validate_plan", "store_task"):
        (child,) = [s for s in spans if s.name == name]
        assert child.parent_span_id == root.span_id

    # Two attempts ran: the first (503) and the retry. A retry may be dispatched more than once
    # before one runs: a poll whose answer reached its executor too late (past the call's
    # deadline) has its lease released by the next heartbeat, never run, and queued again.
    ran = sorted(s.attributes[telemetry.ATTEMPT] for s in spans if s.name == f"execute_tool {TOOL}")
    assert len(ran) == 2, ran
    assert ran[0] == 1, ran
    assert len(deliveries) == 2
    for never_ran in range(2, ran[1]):
        assert telemetry.dispatch_span_id(task_id, "e0", never_ran) in by_id
    instances = set()
    for ordinal, attempt in enumerate(ran):
        first_try = ordinal == 0
        dispatch = by_id[telemetry.dispatch_span_id(task_id, "e0", attempt)]
        assert (dispatch.name, dispatch.kind) == (f"dispatch_step {TOOL}", "producer")
        assert dispatch.parent_span_id == root.span_id
        assert dispatch.attributes[telemetry.ATTEMPT] == attempt
        assert dispatch.attributes[telemetry.ENVIRONMENT] == "dev"
        execute = by_id[telemetry.execute_span_id(task_id, "e0", attempt)]
        assert execute.parent_span_id == dispatch.span_id
        assert execute.service == "agent-reach-executor"
        instances.add(execute.instance)
        assert execute.attributes | {telemetry.TASK_ID: None} == {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": TOOL,
            "gen_ai.tool.call.id": "e0",
            "gen_ai.tool.type": "function",
            telemetry.TASK_ID: None,
            telemetry.ATTEMPT: attempt,
            telemetry.ENVIRONMENT: "dev",  # the assignment says (the proto's `environment`)
            telemetry.OUTCOME: "failed" if first_try else "succeeded",
            **({"error.type": "downstream_unavailable"} if first_try else {}),
        }
        assert execute.status_code == (2 if first_try else 0)
        (call,) = [s for s in spans if s.name == "POST" and s.parent_span_id == execute.span_id]
        assert call.kind == "client"
        assert call.attributes["http.response.status_code"] == (503 if first_try else 200)
        assert call.attributes["server.address"] == "127.0.0.1"
        # The downstream saw this very span as its parent.
        delivery = deliveries[ordinal]
        assert parse_traceparent(delivery.traceparent) == (caller_trace, call.span_id)
    assert len(instances) == 2, "each attempt ran in its own executor process"
    # Every span of the task is in one tree under the request (nothing dangling).
    for s in spans:
        if s.span_id != request.span_id:
            assert s.parent_span_id in by_id, f"{s.name} has no parent in the trace"
    assert {s.service for s in spans} == {"agent-reach-controller", "agent-reach-executor"}

    # The file rebuilt from the event log names the same spans with the same ids.
    (jaeger,) = json.loads(exported.stdout)["data"]
    assert jaeger["traceID"] == caller_trace
    assert {s["spanID"] for s in jaeger["spans"]} <= set(by_id)
    # The live dispatch span and the rebuilt one both start when the attempt was queued.
    first = telemetry.dispatch_span_id(task_id, "e0", 1)
    (rebuilt,) = [s for s in jaeger["spans"] if s["spanID"] == first]
    assert abs(by_id[first].start_ns // 1000 - rebuilt["startTime"]) <= 1000  # within 1 ms
