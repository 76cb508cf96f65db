"""A task's end is announced to the webhook its submit named: signed (Standard Webhooks), retried
until acknowledged, only to hosts the operator allows, its URL's token kept out of the request
that replay shows."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook

from agent_reach_controller.runtime import background
from tests.integration.stack import api_client, components_for, ok, write_tools
from tests.integration.test_approval_webhook import outbox, until
from tests.support.sink import Response, Sink

SECRET = "whsec_" + base64.b64encode(b"task hooks are signed too").decode()
TOKEN = "tok-task-canary"


def settings(**extra: Any) -> dict[str, Any]:
    return {"task_webhook_hosts": ["127.0.0.1"], "task_webhook_secret": SECRET, **extra}


async def test_a_turn_announces_its_end_signed_and_retried(
    database_url: str, tmp_path: Path
) -> None:
    with Sink() as sink:
        sink.script("/hooks/done", [Response(status=502), Response(status=200)])
        hook = f"{sink.url}/hooks/done?token={TOKEN}"
        async with (
            components_for(database_url, write_tools(tmp_path), **settings()) as c,
            api_client(c) as api,
            background(c),
        ):
            turn = {
                "tool_calls": [
                    {"id": "c1", "function": {"name": "echo_say", "arguments": "{}"}},
                    {"id": "c2", "function": {"name": "ghost", "arguments": "{}"}},
                ],
                "webhook": {"url": hook},
            }
            answer = await api.post("/v1/tasks", json=turn)
            assert answer.status_code == 202, answer.text
            task_id = answer.json()["task_id"]
            claimed = await c.leasing.poll(executor_id="t", connectors=["echo"], limit=10, wait=2)
            await c.reporting.report(executor_id="t", results=[ok(s, {}) for s in claimed])

            async def delivered() -> bool:
                return any(row.delivered_at for row in await outbox(c))

            await until(delivered)
            first, second = sink.requests("/hooks/done")
            assert first.headers["webhook-id"] == second.headers["webhook-id"]
            body = Webhook(SECRET).verify(second.body, second.headers)
            assert body["type"] == "task.finished"
            assert (body["task_id"], body["status"], body["source"]) == (
                task_id,
                "failed",
                "openai_chat",
            )
            assert body["replies_url"] == f"/v1/tasks/{task_id}/replies"
            # The URL (and its token) is not in the request replay shows.
            replay = (await api.get(f"/v1/tasks/{task_id}/replay")).json()
            assert "webhook" not in replay["request"]
            assert TOKEN not in str(replay)
            (row,) = [r for r in await outbox(c) if r.kind == "task.finished"]
            assert (row.attempts, row.last_error) == (2, None)


async def test_only_allowed_hosts_and_only_when_configured(sqlite_url: str, tmp_path: Path) -> None:
    plan: dict[str, Any] = {"steps": [{"step_id": "a", "tool": "echo.say"}]}
    cases = [
        ({}, "http://127.0.0.1:9/x", "sends no task webhooks"),
        (settings(), "http://10.0.0.1/x", "host '10.0.0.1' is not one this controller may call"),
        (settings(), "http://user:pw@127.0.0.1/x", "may not carry credentials"),
        (settings(), "file:///etc/passwd", "should match pattern"),
    ]
    for extra, url, said in cases:
        async with (
            components_for(sqlite_url, write_tools(tmp_path), **extra) as c,
            api_client(c) as api,
        ):
            answer = await api.post("/v1/tasks", json={**plan, "webhook": {"url": url}})
        assert answer.status_code == 422, (url, answer.text)
        [error] = answer.json()["errors"]
        assert error["pointer"] == "/webhook/url"
        assert said in error["detail"]
