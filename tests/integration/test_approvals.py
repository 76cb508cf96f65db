"""Dangerous steps wait for a person: approvals bound to the exact arguments, and no way around."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agent_reach_controller.runtime import Components
from agent_reach_controller.storage.schema import steps
from tests.integration.stack import TOOLS, api_client, components_for, key_for, write_tools

PAY = {
    "name": "pay.send",
    "description": "Moves money.",
    "connector": "echo",
    "risk": "dangerous",
    "idempotent": True,
    "input_schema": {
        "type": "object",
        "required": ["to", "cents"],
        "properties": {"to": {"type": "string"}, "cents": {"type": "integer", "maximum": 10_000}},
    },
}
PLAN = {
    "steps": [
        {"step_id": "look", "tool": "echo.say", "args": {"text": "ok"}},
        {"step_id": "pay", "tool": "pay.send", "args": {"to": "acct-1", "cents": 500}},
    ]
}


async def setup(c: Components) -> tuple[str, dict[str, str], dict[str, str]]:
    """A task submitted by `agent`, and headers for it and for an approver."""
    agent = await key_for(c, roles=("operator",), name="agent")
    approver = await key_for(c, roles=("approver",), name="carol")
    async with api_client(c) as client:
        answer = await client.post("/v1/tasks", json=PLAN, headers=agent)
        assert answer.status_code == 202, answer.text
    return answer.json()["task_id"], agent, approver


async def step(c: Components, task_id: str, step_id: str) -> Any:
    view = await c.queries.get(task_id)
    return next(s for s in view.steps if s.step_id == step_id)


async def test_a_dangerous_step_waits_and_is_never_offered_until_approved(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, PAY])) as c:
        task_id, agent, approver = await setup(c)
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert [s.step_id for s in leased] == ["look"]  # pay waits for a person
        waiting = await step(c, task_id, "pay")
        assert waiting.status.value == "awaiting_approval"
        assert waiting.approval["tool_version"] == c.catalog["pay.send"].version
        async with api_client(c) as client:
            url = f"/v1/tasks/{task_id}/steps/pay/approval"
            # The submitter may not approve its own task (separation of duties).
            mine = await client.post(url, json={"decision": "approve"}, headers=agent)
            assert (mine.status_code, mine.json()["code"]) == (403, "separation_of_duties")
            # A key without approve on pay.* may not either.
            viewer = await key_for(c, roles=("agent",), name="dave")
            assert (await client.post(url, json={"decision": "approve"}, headers=viewer)).json()[
                "code"
            ] == "forbidden"
            approved = await client.post(
                url, json={"decision": "approve", "reason": "invoice 42"}, headers=approver
            )
            assert approved.status_code == 200, approved.text
            again = await client.post(url, json={"decision": "approve"}, headers=approver)
            assert again.status_code == 409  # decided once
        [pay] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert pay.step_id == "pay"
        assert pay.approval["by"] == "carol"


async def test_a_rejection_ends_the_step_with_a_reason_the_model_reads(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, PAY])) as c:
        task_id, _, approver = await setup(c)
        async with api_client(c) as client:
            answer = await client.post(
                f"/v1/tasks/{task_id}/steps/pay/approval",
                json={"decision": "reject", "reason": "the amount looks wrong"},
                headers=approver,
            )
        pay = next(s for s in answer.json()["steps"] if s["step_id"] == "pay")
        assert pay["status"] == "rejected"
        assert pay["receipt"]["error"] == {
            "code": "rejected",
            "message": "rejected by carol: the amount looks wrong",
            "retryable": False,
        }


async def test_edited_arguments_are_checked_rehashed_and_both_versions_kept(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path, [*TOOLS, PAY])) as c:
        task_id, agent, approver = await setup(c)
        url = f"/v1/tasks/{task_id}/steps/pay/approval"
        async with api_client(c) as client:
            too_much = {"decision": "approve", "args": {"to": "acct-1", "cents": 99_999}}
            refused = await client.post(url, json=too_much, headers=approver)
            assert refused.status_code == 422
            assert refused.json()["errors"][0]["pointer"] == "/args/cents"
            smaller = {"decision": "approve", "args": {"to": "acct-1", "cents": 300}}
            assert (await client.post(url, json=smaller, headers=approver)).status_code == 200
            events = (await client.get(f"/v1/tasks/{task_id}/events", headers=agent)).json()
        approve = next(e for e in events["events"] if e["kind"] == "approve")
        assert approve["data"]["edited"] == {
            "before": {"to": "acct-1", "cents": 500},
            "after": {"to": "acct-1", "cents": 300},
        }
        [pay] = [
            s
            for s in await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
            if s.step_id == "pay"
        ]
        assert pay.resolved_args == {"to": "acct-1", "cents": 300}


async def test_an_approval_cannot_be_spent_on_other_arguments(
    database_url: str, tmp_path: Path
) -> None:
    """Arguments changed behind the approval's back (here: straight in the database)."""
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, PAY])) as c:
        task_id, _, approver = await setup(c)
        async with api_client(c) as client:
            url = f"/v1/tasks/{task_id}/steps/pay/approval"
            assert (
                await client.post(url, json={"decision": "approve"}, headers=approver)
            ).is_success
        pay = await step(c, task_id, "pay")
        async with c.db.transaction() as conn:
            await conn.execute(
                sa.update(steps)
                .where(steps.c.id == pay.id)
                .values(resolved_args={"to": "attacker", "cents": 500})
            )
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert "pay" not in [s.step_id for s in leased]
        ended = await step(c, task_id, "pay")
        assert (ended.status.value, ended.error["code"], ended.error["message"]) == (
            "failed",
            "forbidden",
            "not run: its arguments are not the ones that were approved",
        )


async def test_an_approval_nobody_gives_expires_into_a_rejection(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, PAY])
    async with components_for(sqlite_url, tools, approval_timeout_seconds=0.2) as c:
        task_id, _, approver = await setup(c)
        deadline = time.monotonic() + 5
        while not await c.expiry.expire_approvals():
            assert time.monotonic() < deadline, "the approval never expired"
            await asyncio.sleep(0.05)
        pay = await step(c, task_id, "pay")
        assert pay.status.value == "rejected"
        assert pay.error["message"].startswith("not approved in time")
        async with api_client(c) as client:
            late = await client.post(
                f"/v1/tasks/{task_id}/steps/pay/approval",
                json={"decision": "approve"},
                headers=approver,
            )
        assert late.status_code == 409


HELD = {
    "name": "mail.send",
    "description": "Sends an email.",
    "connector": "echo",
    "risk": "write",
    "hold": "2s",
}


async def test_a_write_step_is_held_for_its_undo_window_and_a_cancel_stops_it(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, HELD])) as c:
        body = {"steps": [{"step_id": "m", "tool": "mail.send", "args": {}}]}
        async with api_client(c) as client:
            first = (await client.post("/v1/tasks", json=body)).json()["task_id"]
            second = (await client.post("/v1/tasks", json=body)).json()["task_id"]
            # Queued but not yet due: nothing runs inside the window.
            assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5) == []
            cancelled = (await client.post(f"/v1/tasks/{first}/cancel")).json()
        assert cancelled["steps"][0]["status"] == "cancelled"
        # The other one runs once its window has passed.
        [leased] = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=5, wait=3)
        assert leased.task_id == second
        assert (leased.started_at - leased.created_at).total_seconds() >= 2.0


PAY_EACH = {
    **PAY,
    "name": "pay.each",
    "description": "Pays each payee.",
    "input_schema": {
        "type": "object",
        "required": ["payees"],
        "properties": {"payees": {"type": "array", "items": {"type": "string"}}},
    },
    "fan_out": {"over": "payees", "as": "to", "max": 3},
}


async def test_a_fan_out_step_is_decided_through_its_one_waiting_child(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, PAY_EACH])
    async with components_for(database_url, tools) as c, api_client(c) as client:
        agent = await key_for(c, roles=("operator",), name="agent")
        approver = await key_for(c, roles=("approver",), name="carol")
        one = {"steps": [{"step_id": "pay", "tool": "pay.each", "args": {"payees": ["a"]}}]}
        task_id = (await client.post("/v1/tasks", json=one, headers=agent)).json()["task_id"]
        assert (await step(c, task_id, "pay[0]")).status.value == "awaiting_approval"
        answer = await client.post(
            f"/v1/tasks/{task_id}/steps/pay/approval",
            json={"decision": "approve", "reason": "ok"},
            headers=approver,
        )
        assert answer.status_code == 200, answer.text
        child = await step(c, task_id, "pay[0]")
        assert child.status.value == "ready"
        assert child.approval["by"] == "carol"
        # Where several children wait, each is decided on its own: the 409 names them.
        two = {"steps": [{"step_id": "pay", "tool": "pay.each", "args": {"payees": ["a", "b"]}}]}
        task_id = (await client.post("/v1/tasks", json=two, headers=agent)).json()["task_id"]
        refused = await client.post(
            f"/v1/tasks/{task_id}/steps/pay/approval",
            json={"decision": "approve"},
            headers=approver,
        )
        assert refused.status_code == 409
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "not_decidable"
        assert refused.json()["awaiting"] == ["pay[0]", "pay[1]"]
        assert "'pay[0]', 'pay[1]'" in refused.json()["detail"]
        assert (await step(c, task_id, "pay[0]")).status.value == "awaiting_approval"
        # Once one is decided, the step decides the other.
        first = await client.post(
            f"/v1/tasks/{task_id}/steps/pay[0]/approval",
            json={"decision": "reject"},
            headers=approver,
        )
        assert first.status_code == 200, first.text
        last = await client.post(
            f"/v1/tasks/{task_id}/steps/pay/approval",
            json={"decision": "approve"},
            headers=approver,
        )
        assert last.status_code == 200, last.text
        assert (await step(c, task_id, "pay[1]")).status.value == "ready"
        # Nothing waits any more: the step is not waiting for a decision, as before.
        done = await client.post(
            f"/v1/tasks/{task_id}/steps/pay/approval",
            json={"decision": "approve"},
            headers=approver,
        )
        assert (done.status_code, done.json()["code"]) == (409, "not_decidable")
        assert "awaiting" not in done.json()
