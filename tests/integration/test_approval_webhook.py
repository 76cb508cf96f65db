"""Approval requests are announced to a webhook: signed, retried, at least once, never leaking
its URL's token; and nothing is announced when no webhook is configured."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from agent_reach_controller.runtime import Components, background
from agent_reach_controller.storage.schema import webhook_outbox
from tests.integration.stack import TOOLS, api_client, components_for, key_for, write_tools
from tests.integration.test_approvals import PAY, PLAN
from tests.support.sink import Response, Sink

SECRET = "whsec_" + base64.b64encode(b"sixteen byte key and more").decode()
TOKEN = "tok-7f3c-canary"


def hook_settings(sink: Sink, **extra: Any) -> dict[str, Any]:
    return {
        "approval_webhook_url": f"{sink.url}/hooks/approvals?token={TOKEN}",
        "approval_webhook_secret": SECRET,
        **extra,
    }


async def outbox(c: Components) -> list[Any]:
    async with c.db.transaction() as conn:
        return list((await conn.execute(sa.select(webhook_outbox))).all())


async def until(check: Any, *, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_request_is_signed_retried_until_2xx_and_can_be_acted_on(
    database_url: str, tmp_path: Path
) -> None:
    with Sink() as sink:
        sink.script("/hooks/approvals", [Response(status=503), Response(status=204)])
        tools = write_tools(tmp_path, [*TOOLS, PAY])
        async with components_for(database_url, tools, **hook_settings(sink)) as c:
            agent = await key_for(c, roles=("operator",), name="agent")
            approver = await key_for(c, roles=("approver",), name="carol")
            async with api_client(c) as api, background(c):
                task_id = (await api.post("/v1/tasks", json=PLAN, headers=agent)).json()["task_id"]

                async def delivered() -> bool:
                    return any(row.delivered_at for row in await outbox(c))

                await until(delivered)
                first, second = sink.requests("/hooks/approvals")
                assert first.query["token"] == [TOKEN]
                assert first.headers["webhook-id"] == second.headers["webhook-id"]  # one message
                body = Webhook(SECRET).verify(second.body, second.headers)
                with pytest.raises(WebhookVerificationError):
                    Webhook("whsec_" + base64.b64encode(b"another key").decode()).verify(
                        second.body, second.headers
                    )
                view = await c.queries.get(task_id)
                pay = next(s for s in view.steps if s.step_id == "pay")
                assert body | {"decide_by": None, "requested_at": None, "trace_id": None} == {
                    "type": "approval.requested",
                    "task_id": task_id,
                    "step_id": "pay",
                    "tool": "pay.send",
                    "tool_version": pay.tool_version,
                    "args": {"to": "acct-1", "cents": 500},
                    "args_hash": pay.approval["args_hash"],
                    "requested_by": "agent",
                    "tenant": "default",
                    "environment": "dev",
                    "trace_id": None,
                    "requested_at": None,
                    "decide_by": None,
                    "decide_at": f"/v1/tasks/{task_id}/steps/pay/approval",
                }
                decided = await api.post(
                    body["decide_at"], json={"decision": "approve"}, headers=approver
                )
                assert decided.status_code == 200, decided.text
            (row,) = await outbox(c)
            assert (row.attempts, row.last_error, row.given_up_at) == (2, None, None)


async def test_an_unreachable_hook_is_given_up_at_expiry_without_leaking_its_token(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Sink() as sink:
        sink.script("/hooks/approvals", [Response(status=500)])
        settings = hook_settings(sink, approval_timeout_seconds=2.0)
        async with components_for(
            database_url, write_tools(tmp_path, [*TOOLS, PAY]), **settings
        ) as c:
            agent = await key_for(c, roles=("operator",), name="agent")
            caplog.set_level(logging.INFO)
            async with api_client(c) as api, background(c):
                await api.post("/v1/tasks", json=PLAN, headers=agent)

                async def given_up() -> bool:
                    return any(row.given_up_at for row in await outbox(c))

                await until(given_up)
            (row,) = await outbox(c)
            assert row.delivered_at is None
            assert row.last_error == "HTTP 500"
            assert row.attempts == len(sink.requests("/hooks/approvals")) >= 1
            assert "webhook_failed" in {getattr(r, "event", None) for r in caplog.records}
            # Our own log lines (httpx's, which quote URLs, are held at WARNING by
            # configure_logging; the e2e secret canaries grep whole process logs).
            ours = [r.getMessage() for r in caplog.records if r.name.startswith("agent_reach")]
            assert ours
            assert not [line for line in ours if TOKEN in line]


async def test_two_replicas_send_each_request_once(postgres_url: str, tmp_path: Path) -> None:
    with Sink() as sink:
        tools = write_tools(tmp_path, [*TOOLS, PAY])
        settings = hook_settings(sink)
        async with (
            components_for(postgres_url, tools, **settings) as one,
            components_for(postgres_url, tools, **settings) as two,
        ):
            agent = await key_for(one, roles=("operator",), name="agent")
            async with api_client(one) as api:
                for _ in range(12):
                    await api.post("/v1/tasks", json=PLAN, headers=agent)
            assert one.webhook is not None
            assert two.webhook is not None
            sent = await asyncio.gather(
                *(w.deliver_due(limit=3) for w in (one.webhook, two.webhook) for _ in range(4))
            )
            assert sum(sent) == 12
            ids = [d.headers["webhook-id"] for d in sink.requests("/hooks/approvals")]
            assert len(ids) == len(set(ids)) == 12


async def test_nothing_is_written_when_no_webhook_is_configured(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, PAY])) as c:
        agent = await key_for(c, roles=("operator",), name="agent")
        async with api_client(c) as api:
            assert (await api.post("/v1/tasks", json=PLAN, headers=agent)).status_code == 202
        assert c.webhook is None
        assert await outbox(c) == []


async def test_finished_requests_are_pruned_after_a_while(
    database_url: str, tmp_path: Path
) -> None:
    with Sink() as sink:
        tools = write_tools(tmp_path, [*TOOLS, PAY])
        async with components_for(database_url, tools, **hook_settings(sink)) as c:
            assert c.webhook is not None
            now = datetime.now(UTC)
            long_ago, yesterday = now - timedelta(days=8), now - timedelta(days=1)
            rows = [  # delivered and given up long ago; delivered yesterday; still pending
                {"delivered_at": long_ago, "given_up_at": None},
                {"delivered_at": None, "given_up_at": long_ago},
                {"delivered_at": yesterday, "given_up_at": None},
                {"delivered_at": None, "given_up_at": None},
            ]
            async with c.db.transaction() as conn:
                await conn.execute(
                    webhook_outbox.insert(),
                    [
                        {"kind": "approval", "payload": {}, "created_at": now, "due_at": now, **r}
                        for r in rows
                    ],
                )
            assert await c.webhook.prune() == 2
            left = await outbox(c)
            assert sorted(row.delivered_at is None for row in left) == [False, True]
