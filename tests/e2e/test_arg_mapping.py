"""Argument mapping end to end: the model writes the tool's schema, the executor gets what the
downstream wants, and the event log says what that was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.processes import all_terminal, api, cluster, wait_until

pytestmark = pytest.mark.e2e

ORDER = {
    "name": "order.place",
    "description": "Place an order.",
    "connector": "echo",  # answers with the arguments it was given
    "input_schema": {
        "type": "object",
        "required": ["order_id", "qty"],
        "properties": {
            "order_id": {"type": "string"},
            "qty": {"type": "integer"},
            "ship_to": {"type": "object"},
        },
    },
    "map_args": {
        "case": "camel",
        "rename": {"qty": "quantity"},
        "defaults": {"currency": "EUR"},
        "coerce": {"quantity": "string", "shipTo.postCode": "integer"},
    },
}


def test_the_executor_gets_the_mapped_arguments_and_the_log_shows_them(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(json.dumps({"tools": [ORDER]}))
    ok = {"order_id": "A1", "qty": 2, "ship_to": {"post_code": "430000"}}
    bad = {"order_id": "A2", "qty": 1, "ship_to": {"post_code": "43-000"}}
    with cluster(tmp_path) as c:
        dev = c.dev("dev", tools=tools)
        with api(dev) as client:
            steps = [
                {"step_id": "ok", "tool": "order.place", "args": ok},
                {"step_id": "bad", "tool": "order.place", "args": bad},
            ]
            task_id = client.post("/v1/tasks", json={"steps": steps}).json()["task_id"]
            [task] = wait_until(lambda: all_terminal(client, [task_id]), within=30, what="the task")
            events = client.get(f"/v1/tasks/{task_id}/events").json()["events"]
    by_id = {s["step_id"]: s for s in task["steps"]}
    mapped = {"orderId": "A1", "quantity": "2", "shipTo": {"postCode": 430000}, "currency": "EUR"}
    assert by_id["ok"]["receipt"]["data"]["args"] == mapped  # what the executor was given
    assert by_id["ok"]["resolved_args"] == ok  # the model's, as approvals and replay read them
    [queued] = [e for e in events if e["step_id"] == "ok" and e["kind"] == "unblock"]
    assert queued["data"]["mapped_args"] == mapped
    error = by_id["bad"]["receipt"]["error"]
    assert error == {
        "code": "invalid_arguments",
        "message": "argument shipTo.postCode cannot be given as integer",
        "retryable": False,
    }
