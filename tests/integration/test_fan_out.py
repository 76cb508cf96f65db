"""Fan-out steps: one child step per target, each with its own attempts and key, and one record of
them all on the step, whatever became of each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.stack import (
    TOOLS,
    api_client,
    claim,
    components_for,
    failed,
    ok,
    start_task,
    steps_shown,
    write_tools,
)

TARGET = {
    "type": "object",
    "properties": {"channel": {"enum": ["webhook", "email"]}, "to": {"type": "string"}},
    "required": ["channel", "to"],
    "additionalProperties": False,
}
NOTIFY = {
    "name": "notify.send",
    "description": "Sends one message to several targets.",
    "connector": "echo",
    "input_schema": {
        "type": "object",
        "properties": {
            "message": {"type": "string"},
            "targets": {"type": "array", "items": TARGET},
        },
        "required": ["message", "targets"],
        "additionalProperties": False,
    },
    "fan_out": {"over": "targets", "as": "target", "max": 3},
    "effects": {"message": 1},
    "redact": ["secret"],
}
TOOLS_WITH_NOTIFY = [*TOOLS, NOTIFY]
EMAIL = {"channel": "email", "to": "ada@example.org"}
HOOK = {"channel": "webhook", "to": "https://hooks.example.org/in"}


def notify(step_id: str = "tell", **extra: Any) -> dict[str, Any]:
    args = {"message": "take an umbrella", "targets": [HOOK, EMAIL]}
    return {"step_id": step_id, "tool": "notify.send", "args": args, **extra}


async def test_each_target_is_its_own_step_and_the_step_records_them_all(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, TOOLS_WITH_NOTIFY)
    async with components_for(database_url, tools) as c, api_client(c) as api:
        task_id = await start_task(api, {"steps": [notify()]})
        by_id = await steps_shown(api, task_id)
        assert set(by_id) == {"tell", "tell[0]", "tell[1]"}
        assert by_id["tell"]["status"] == "blocked"
        assert by_id["tell"]["depends_on"] == ["tell[0]", "tell[1]"]
        claimed = {s.step_id: s for s in await claim(c)}
        assert set(claimed) == {"tell[0]", "tell[1]"}  # the step itself never runs
        assert claimed["tell[0]"].resolved_args == {"message": "take an umbrella", "target": HOOK}
        assert claimed["tell[1]"].resolved_args == {"message": "take an umbrella", "target": EMAIL}
        assert claimed["tell[0]"].idempotency_key != claimed["tell[1]"].idempotency_key
        # The email fails once and is tried again on its own; the webhook is not sent twice.
        await c.reporting.report(
            executor_id="t",
            results=[
                ok(claimed["tell[0]"], {"delivered_at": "2026-12-02T08:00:00Z", "secret": "s3"}),
                failed(claimed["tell[1]"], "downstream_unavailable", retryable=True),
            ],
        )
        [again] = await claim(c, wait=10)
        assert again.step_id == "tell[1]"
        assert again.attempt == 2
        await c.reporting.report(executor_id="t", results=[ok(again, {"id": 7})])
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "succeeded"
        step = next(s for s in task["steps"] if s["step_id"] == "tell")
        receipt = step["receipt"]
        assert receipt["status"] == "succeeded"
        assert receipt["data"]["succeeded"] == 2
        assert receipt["data"]["total"] == 2
        rows = receipt["targets"]
        assert [(r["target"], r["status"], r["attempts"]) for r in rows] == [
            (0, "succeeded", 1),
            (1, "succeeded", 2),
        ]
        assert rows[0]["done_at"] == "2026-12-02T08:00:00Z"  # the connector's word for it
        assert rows[0]["output"]["secret"] == "[redacted]"  # the tool's redactions hold
        assert rows[1]["done_at"] is not None
        assert rows[1]["error"] is None
        events = (await api.get(f"/v1/tasks/{task_id}/events")).json()["events"]
        assert ("tell", "gather") in [(e["step_id"], e["kind"]) for e in events]
        # Each target's attempts are counted by channel, for the delivery alert.
        delivered = "agent_reach_deliveries_total"
        tool = "notify.send"
        assert c.metrics.total(delivered, tool=tool, channel="webhook", outcome="succeeded") == 1
        assert c.metrics.total(delivered, tool=tool, channel="email", outcome="retried") == 1
        assert c.metrics.total(delivered, tool=tool, channel="email", outcome="succeeded") == 1


async def test_partial_delivery_is_an_honest_failure_with_a_row_per_target(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, TOOLS_WITH_NOTIFY)
    async with components_for(database_url, tools) as c, api_client(c) as api:
        body = {
            "steps": [notify(), {"step_id": "after", "tool": "echo.say", "depends_on": ["tell"]}]
        }
        task_id = await start_task(api, body)
        claimed = {s.step_id: s for s in await claim(c)}
        await c.reporting.report(
            executor_id="t",
            results=[
                ok(claimed["tell[0]"], {}),
                failed(claimed["tell[1]"], "downstream_rejected", retryable=False),
            ],
        )
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "failed"
        by_id = {s["step_id"]: s for s in task["steps"]}
        error = by_id["tell"]["receipt"]["error"]
        assert error["code"] == "partially_done"
        assert error["message"].startswith("1 of 2 targets succeeded; targets[1] failed: ")
        rows = by_id["tell"]["receipt"]["targets"]
        assert [r["status"] for r in rows] == ["succeeded", "failed"]
        assert rows[1]["error"]["code"] == "downstream_rejected"
        assert by_id["after"]["status"] == "skipped"


async def test_a_failed_dependency_skips_the_children_and_the_step_in_one_pass(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, TOOLS_WITH_NOTIFY)
    async with components_for(database_url, tools) as c, api_client(c) as api:
        first = {"step_id": "look", "tool": "echo.say"}
        task_id = await start_task(api, {"steps": [first, notify(depends_on=["look"])]})
        [look] = await claim(c)
        await c.reporting.report(
            executor_id="t", results=[failed(look, "downstream_rejected", retryable=False)]
        )
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        statuses = {s["step_id"]: s["status"] for s in task["steps"]}
        assert statuses == {
            "look": "failed",
            "tell": "skipped",
            "tell[0]": "skipped",
            "tell[1]": "skipped",
        }
        tell = next(s for s in task["steps"] if s["step_id"] == "tell")
        assert tell["receipt"]["error"]["code"] == "dependency_failed"
        assert "look" in tell["receipt"]["error"]["message"]


@pytest.mark.parametrize(
    ("targets", "pointer", "says"),
    [
        ("$look.output.targets", "/steps/1/args/targets", "written out as an array"),
        ([], "/steps/1/args/targets", "at least one"),
        ([EMAIL] * 4, "/steps/1/args/targets", "takes 3"),
    ],
)
async def test_the_targets_must_be_known_at_submit(
    sqlite_url: str, tmp_path: Path, targets: Any, pointer: str, says: str
) -> None:
    tools = write_tools(tmp_path, TOOLS_WITH_NOTIFY)
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        step = notify(depends_on=["look"])
        step["args"]["targets"] = targets
        answer = await api.post(
            "/v1/tasks", json={"steps": [{"step_id": "look", "tool": "echo.say"}, step]}
        )
        assert answer.status_code == 422, answer.text
        problems = answer.json()["errors"]
        assert any(p["pointer"] == pointer and says in p["detail"] for p in problems), problems


async def test_a_reference_inside_a_target_is_resolved_and_checked_per_child(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, TOOLS_WITH_NOTIFY)
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        look = {"step_id": "look", "tool": "echo.say"}
        step = notify(depends_on=["look"])
        step["args"]["targets"] = [EMAIL, {"channel": "email", "to": "$look.output.attempt"}]
        task_id = await start_task(api, {"steps": [look, step]})
        [first] = await claim(c)
        await c.reporting.report(executor_id="t", results=[ok(first, {"attempt": 1})])
        by_id = await steps_shown(api, task_id)
        assert by_id["tell[0]"]["status"] == "ready"
        # `to` resolved to a number: the child's own schema (one target) refuses it.
        assert by_id["tell[1]"]["status"] == "failed"
        assert "/args/target/to" in by_id["tell[1]"]["receipt"]["error"]["message"]


async def test_a_chat_turn_gets_one_reply_per_call_not_per_target(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, TOOLS_WITH_NOTIFY)
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        arguments = '{"message": "hi", "targets": [{"channel": "email", "to": "a@b.example"}]}'
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "notify_send", "arguments": arguments},
        }
        answer = await api.post(
            "/v1/tasks", json={"role": "assistant", "content": None, "tool_calls": [call]}
        )
        assert answer.status_code == 202, answer.text
        task_id = answer.json()["task_id"]
        turn = (await api.get(f"/v1/tasks/{task_id}")).json()["turn"]
        assert [p["call_id"] for p in turn["pending"]] == ["call_1"]
        assert turn["pending"][0]["waiting_for"] == "executor"  # what its target waits on
        [child] = await claim(c)
        await c.reporting.report(executor_id="t", results=[ok(child, {})])
        replies = (await api.get(f"/v1/tasks/{task_id}/replies")).json()
        assert [r["tool_call_id"] for r in replies["replies"]] == ["call_1"]
        assert replies["pending"] == []
