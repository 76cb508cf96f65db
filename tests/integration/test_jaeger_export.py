"""`GET /v1/tasks/{id}/trace`: the task's trace in the JSON Jaeger's UI uploads, from the event
log; checked against the UI's own types and against the ids the live spans carry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from agent_reach import telemetry
from tests.integration.stack import api_client, components_for, failed, ok, write_tools

# What jaeger-ui reads (packages/jaeger-ui/src/types/trace.tsx: TraceData, SpanData, Process,
# Log, SpanReference, KeyValuePair; microsecond times), wrapped as the query API and the upload
# reader deliver it: {"data": [trace, ...]}.
KEY_VALUE = {
    "type": "object",
    "required": ["key", "value"],
    "properties": {
        "key": {"type": "string"},
        "type": {"enum": ["string", "bool", "int64", "float64", "binary"]},
        "value": {},
    },
}
JAEGER_UPLOAD = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["traceID", "spans", "processes"],
                "properties": {
                    "traceID": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                    "processes": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "required": ["serviceName", "tags"],
                            "properties": {
                                "serviceName": {"type": "string", "minLength": 1},
                                "tags": {"type": "array", "items": KEY_VALUE},
                            },
                        },
                    },
                    "spans": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": [
                                "spanID",
                                "traceID",
                                "processID",
                                "operationName",
                                "startTime",
                                "duration",
                                "logs",
                            ],
                            "properties": {
                                "spanID": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
                                "traceID": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                                "processID": {"type": "string"},
                                "operationName": {"type": "string", "minLength": 1},
                                "startTime": {"type": "integer", "minimum": 1_000_000_000_000_000},
                                "duration": {"type": "integer", "minimum": 0},
                                "tags": {"type": "array", "items": KEY_VALUE},
                                "logs": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["timestamp", "fields"],
                                        "properties": {
                                            "timestamp": {"type": "integer"},
                                            "fields": {"type": "array", "items": KEY_VALUE},
                                        },
                                    },
                                },
                                "references": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["refType", "traceID", "spanID"],
                                        "properties": {
                                            "refType": {"enum": ["CHILD_OF", "FOLLOWS_FROM"]},
                                        },
                                    },
                                },
                                "warnings": {"type": ["array", "null"]},
                            },
                        },
                    },
                },
            },
        }
    },
}
PLAN = {
    "goal": "two steps, one retried",
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}},
        {
            "step_id": "b",
            "tool": "echo.say",
            "args": {"text": "$a.output.text"},
            "depends_on": ["a"],
        },
    ],
}


def tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span["tags"]}


async def test_the_trace_is_built_from_the_event_log_in_jaegers_format(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        task_id = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        (a1,) = await c.leasing.claim(executor_id="exec-1", connectors=["echo"], limit=5)
        await c.reporting.report(
            executor_id="exec-1", results=[failed(a1, "timeout", retryable=True)]
        )
        # The retry's backoff is 10 ms (see the tool's retry policy).
        (a2,) = await c.leasing.poll(executor_id="exec-2", connectors=["echo"], limit=5, wait=5)
        await c.reporting.report(executor_id="exec-2", results=[ok(a2, {"text": "hi"})])
        (b1,) = await c.leasing.claim(executor_id="exec-1", connectors=["echo"], limit=5)
        await c.reporting.report(executor_id="exec-1", results=[ok(b1, {"text": "hi"})])

        answer = await api.get(f"/v1/tasks/{task_id}/trace")
        assert answer.status_code == 200
        document = answer.json()
        other = await api.get(f"/v1/tasks/{task_id}/trace", headers={"Authorization": "Bearer x"})
        assert other.status_code == 401

    errors = sorted(Draft202012Validator(JAEGER_UPLOAD).iter_errors(document), key=str)
    assert not errors, errors[0].message
    (trace,) = document["data"]
    spans = {s["spanID"]: s for s in trace["spans"]}
    assert len(spans) == len(trace["spans"]) == 1 + 2 * 3  # the task, and 3 attempts x 2
    trace_id = trace["traceID"]
    assert {s["traceID"] for s in spans.values()} == {trace_id}
    # Every reference resolves inside the trace; every process is declared.
    for span in spans.values():
        for ref in span.get("references", []):
            assert ref["spanID"] in spans
        assert span["processID"] in trace["processes"]

    root = spans[telemetry.task_span_id(task_id)]
    assert (root["operationName"], root.get("references")) == ("submit_task", [])
    assert tags(root)["agent_reach.status"] == "succeeded"
    assert {f["value"] for log in root["logs"] for f in log["fields"] if f["key"] == "event"} >= {
        "task_created",
        "unblock",
        "retry",
        "succeed",
    }
    for step_id, attempt, executor, outcome in (
        ("a", 1, "exec-1", "retry"),
        ("a", 2, "exec-2", "succeed"),
        ("b", 1, "exec-1", "succeed"),
    ):
        dispatch = spans[telemetry.dispatch_span_id(task_id, step_id, attempt)]
        assert dispatch["operationName"] == "dispatch_step echo.say"
        assert dispatch["references"][0]["spanID"] == root["spanID"]
        execute = spans[telemetry.execute_span_id(task_id, step_id, attempt)]
        assert execute["references"][0]["spanID"] == dispatch["spanID"]
        assert execute["startTime"] == dispatch["startTime"] + dispatch["duration"]
        process = trace["processes"][execute["processID"]]
        assert process["serviceName"] == "agent-reach-executor"
        assert {t["value"] for t in process["tags"]} == {executor}
        expected = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "echo.say",
            "gen_ai.tool.call.id": step_id,
            "agent_reach.attempt": attempt,
            "agent_reach.outcome": outcome,
        }
        assert tags(execute).items() >= expected.items()
        assert tags(execute).get("error") is (True if outcome == "retry" else None)
        assert tags(execute).get("error.type") == ("timeout" if outcome == "retry" else None)
    # The first attempt of b waited for a: its dispatch span starts when a's success unblocked it.
    a_done = spans[telemetry.execute_span_id(task_id, "a", 2)]
    b_dispatch = spans[telemetry.dispatch_span_id(task_id, "b", 1)]
    assert b_dispatch["startTime"] >= a_done["startTime"]


async def test_another_tenants_trace_is_not_found(sqlite_url: str, tmp_path: Path) -> None:
    async with (
        components_for(sqlite_url, write_tools(tmp_path)) as c,
        api_client(c, tenant="acme") as acme,
        api_client(c, tenant="other") as other,
    ):
        task_id = (await acme.post("/v1/tasks", json=PLAN)).json()["task_id"]
        assert (await acme.get(f"/v1/tasks/{task_id}/trace")).status_code == 200
        assert (await other.get(f"/v1/tasks/{task_id}/trace")).status_code == 404
