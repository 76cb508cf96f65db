"""Blast-radius caps: a step that would go over its task's or tenant's cap never runs.

Steps are driven through dispatch as an executor would (claim, report); nothing here runs a
connector, so a refused step is one that ended `failed` without ever being handed out by a claim.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.runtime import Components
from agent_reach_controller.storage.schema import cap_charges, cap_usage, steps
from tests.integration.stack import (
    TOOLS,
    api_client,
    claim,
    components_for,
    failed,
    ok,
    steps_of,
    submit,
    write_tools,
)

FAST_RETRY = {"initial_interval": "10ms", "maximum_attempts": 3, "jitter": False}
MSG = {
    "name": "msg.send",
    "description": "Sends one message.",
    "connector": "echo",
    "effects": {"message": 1},
    "idempotent": True,
    "retry": FAST_RETRY,
}
PAY = {
    "name": "pay.charge",
    "description": "Takes one payment.",
    "connector": "echo",
    "effects": {"payment": 1},
    "cost": 2,
    "idempotent": True,
    "retry": FAST_RETRY,
}
ROWS = {
    "name": "db.insert",
    "description": "Writes rows.",
    "connector": "echo",
    "effects": {"rows": "size(args.rows)"},
    "input_schema": {"type": "object", "properties": {"rows": {"type": "array"}}},
    "idempotent": True,
}
SMS = {
    "name": "sms.send",
    "description": "Texts; calls when texting fails.",
    "connector": "echo",
    "effects": {"message": 1},
    "fallback": "voice.call",
    "retry": {"maximum_attempts": 1},
}
CALL = {
    "name": "voice.call",
    "description": "Calls.",
    "connector": "echo",
    "effects": {"call": 1},
    "retry": {"maximum_attempts": 1},
}
CAPPED_TOOLS = [*TOOLS, MSG, PAY, ROWS, SMS, CALL]


def sends(n: int, tool: str = "msg.send", *, prefix: str = "m") -> list[dict[str, Any]]:
    """`n` steps of `tool`; conditional, so that only dispatch (not submit) can count them."""
    return [{"step_id": f"{prefix}{i}", "tool": tool, "when": "true"} for i in range(n)]


async def totals(c: Components) -> dict[tuple[str, str], float]:
    async with c.db.transaction() as conn:
        rows = await conn.execute(
            sa.select(cap_usage.c.scope, cap_usage.c.effect, cap_usage.c.used).where(
                cap_usage.c.bucket == 0
            )
        )
        return {(scope, effect): used for scope, effect, used in rows.all()}


async def charges(c: Components, task_id: str) -> list[tuple[int, str, dict[str, float]]]:
    async with c.db.transaction() as conn:
        rows = await conn.execute(
            sa.select(cap_charges.c.step_key, cap_charges.c.tool, cap_charges.c.units)
            .where(cap_charges.c.task_id == task_id)
            .order_by(cap_charges.c.step_key, cap_charges.c.tool)
        )
        return [(key, tool, units) for key, tool, units in rows.all()]


def policy_file(tmp_path: Path, tenants: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "policy.yaml"
    roles = {"admin": [{"tools": "*", "actions": ["submit", "approve", "admin"]}]}
    path.write_text(yaml.safe_dump({"roles": roles, "tenants": tenants}))
    return {"policy": path}


async def test_a_plan_cap_refuses_the_message_over_it_with_a_receipt(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, CAPPED_TOOLS)) as c:
        task_id = await submit(c, {"steps": sends(3), "caps": {"message": 2}})
        handed_out = await claim(c, wait=None)
        assert [s.step_id for s in handed_out] == ["m0", "m1"]  # exactly at the cap: allowed
        assert await claim(c, wait=None) == []
        third = (await steps_of(c, task_id))["m2"]
        assert (third.status.value, third.attempt, third.lease_owner) == ("failed", 1, None)
        error = third.receipt["error"]
        assert error["code"] == "cap_exceeded"
        assert error["retryable"] is False
        assert error["message"] == (
            "not run: msg.send would use 1 of 'message', but the task's cap on 'message' is 2 "
            "and 2 has been used; the tool was not called"
        )
        events = [e for e in await c.queries.events(task_id) if e.kind == "cap_exceeded"]
        assert [(e.step_id, e.data["limit"], e.data["used"], e.data["asked"]) for e in events] == [
            ("m2", 2, 2, 1)
        ]
        assert (await totals(c))[(f"task:{task_id}", "message")] == 2
        for step in handed_out:
            await c.reporting.report(executor_id="t", results=[ok(step, {})])
        async with api_client(c) as client:
            shown = (await client.get(f"/v1/tasks/{task_id}")).json()
        assert shown["status"] == "failed"
        assert shown["caps"] == {"message": {"limit": 2, "used": 2}}


async def test_at_most_one_payment_even_when_it_is_retried(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, CAPPED_TOOLS)) as c:
        body = {
            "steps": [
                {"step_id": "p1", "tool": "pay.charge"},
                {"step_id": "p2", "tool": "pay.charge", "depends_on": ["p1"], "when": "true"},
            ],
            "caps": {"payment": 1},
        }
        task_id = await submit(c, body)
        [first] = await claim(c, wait=None)
        await c.reporting.report(
            executor_id="t", results=[failed(first, "downstream_unavailable", retryable=True)]
        )
        # The retry of the same payment is not a second payment: it is handed out again.
        [again] = await claim(c, wait=5, limit=5)
        assert (again.step_id, again.attempt) == ("p1", 2)
        await c.reporting.report(executor_id="t", results=[ok(again, {"paid": True})])
        assert await claim(c, wait=0, limit=5) == []
        after = await steps_of(c, task_id)
        assert after["p1"].status.value == "succeeded"
        assert after["p2"].status.value == "failed"
        assert after["p2"].receipt["error"]["code"] == "cap_exceeded"
        assert "cap on 'payment' is 1 and 1 has been used" in after["p2"].error["message"]
        assert await charges(c, task_id) == [(first.id, "pay.charge", {"payment": 1, "cost": 2})]
        assert (await totals(c))[(f"task:{task_id}", "payment")] == 1


async def test_a_lease_that_expires_is_not_charged_twice(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, CAPPED_TOOLS)) as c:
        task_id = await submit(c, {"steps": sends(1, "pay.charge"), "caps": {"payment": 1}})
        [first] = await claim(c, wait=None)
        async with c.db.transaction() as conn:  # the executor went silent a while ago
            await conn.execute(
                sa.update(steps)
                .where(steps.c.id == first.id)
                .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
        assert await c.expiry.reap_expired() == 1
        [again] = await claim(c, wait=5, limit=5, executor="y")
        assert (again.id, again.attempt) == (first.id, 2)
        assert len(await charges(c, task_id)) == 1


async def test_the_units_can_come_from_the_resolved_arguments(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, CAPPED_TOOLS)) as c:
        body = {
            "steps": [
                {"step_id": "fetch", "tool": "echo.say", "args": {"text": "rows"}},
                {
                    "step_id": "write",
                    "tool": "db.insert",
                    "args": {"rows": "$fetch.output.rows"},
                    "depends_on": ["fetch"],
                },
            ],
            "caps": {"rows": 3},
        }
        task_id = await submit(c, body)  # accepted: 'rows' is not known before `fetch` runs
        [fetch] = await claim(c, wait=None)
        await c.reporting.report(executor_id="t", results=[ok(fetch, {"rows": [1, 2, 3, 4]})])
        assert await claim(c, wait=None) == []
        write = (await steps_of(c, task_id))["write"]
        assert write.receipt["error"]["code"] == "cap_exceeded"
        assert "would use 4 of 'rows'" in write.error["message"]
        assert "cap on 'rows' is 3 and 0 has been used" in write.error["message"]


async def test_a_fallback_is_charged_under_its_own_class(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, CAPPED_TOOLS)) as c:
        body = {"steps": sends(2, "sms.send"), "caps": {"message": 2, "call": 1}}
        task_id = await submit(c, body)
        texts = await claim(c, wait=None)
        assert [s.tool for s in texts] == ["sms.send", "sms.send"]
        for text in texts:  # both fail for good: each goes to its fallback, voice.call
            await c.reporting.report(
                executor_id="t", results=[failed(text, "downstream_rejected", retryable=False)]
            )
        calls = await claim(c, wait=5, limit=5)
        assert [s.tool for s in calls] == ["voice.call"]  # one call allowed, not two
        after = await steps_of(c, task_id)
        refused = next(s for s in after.values() if s.status.value == "failed")
        assert refused.tool == "voice.call"
        assert "cap on 'call' is 1 and 1 has been used" in refused.error["message"]
        charged = await charges(c, task_id)
        assert sorted(tool for _, tool, _ in charged) == ["sms.send", "sms.send", "voice.call"]
        used = await totals(c)
        assert used[(f"task:{task_id}", "message")] == 2
        assert used[(f"task:{task_id}", "call")] == 1


async def test_a_tenant_window_cap_holds_across_tasks(database_url: str, tmp_path: Path) -> None:
    settings = policy_file(
        tmp_path,
        {
            "acme": {"caps": {"payment": {"limit": 2, "window": "1h"}}},
            "*": {"per_task": {"message": 1}},
        },
    )
    tools = write_tools(tmp_path, CAPPED_TOOLS)
    async with components_for(database_url, tools, **settings) as c:
        one = await submit(c, {"steps": sends(1, "pay.charge")}, tenant="acme")
        two = await submit(c, {"steps": sends(2, "pay.charge")}, tenant="acme")
        other = await submit(c, {"steps": sends(2, "pay.charge")}, tenant="beta")
        handed_out = await claim(c, wait=None)
        assert sorted((s.task_id, s.step_id) for s in handed_out) == sorted(
            [(one, "m0"), (two, "m0"), (other, "m0"), (other, "m1")]
        )
        refused = (await steps_of(c, two))["m1"]
        assert refused.error["code"] == "cap_exceeded"
        assert refused.error["message"] == (
            "not run: pay.charge would use 1 of 'payment', but tenant acme's cap on 'payment' "
            "is 2 per 1h and 2 has been used in the last 1h; the tool was not called"
        )
        # Every tenant's tasks ("*") may send one message each, whatever they ask for.
        task_id = await submit(c, {"steps": sends(2), "caps": {"message": 5}}, tenant="beta")
        assert [s.step_id for s in await claim(c, wait=None)] == ["m0"]
        capped = (await steps_of(c, task_id))["m1"]
        assert "tenant beta's per-task cap on 'message' is 1" in capped.error["message"]


async def test_old_usage_leaves_a_tenant_window(database_url: str, tmp_path: Path) -> None:
    settings = policy_file(tmp_path, {"acme": {"caps": {"payment": {"limit": 1, "window": 60}}}})
    async with components_for(database_url, write_tools(tmp_path, CAPPED_TOOLS), **settings) as c:
        now = datetime.now(UTC)
        async with c.db.transaction() as conn:  # a payment 3 minutes ago, and one 30 s ago
            await conn.execute(
                cap_usage.insert(),
                [
                    {
                        "scope": "tenant:acme",
                        "effect": "payment",
                        "bucket": int((now - timedelta(seconds=ago)).timestamp()),
                        "used": 1.0,
                        "updated_at": now,
                    }
                    for ago in (180, 30)
                ],
            )
        task_id = await submit(c, {"steps": sends(1, "pay.charge")}, tenant="acme")
        assert await claim(c, wait=None) == []
        assert (
            "1 has been used in the last 1m" in (await steps_of(c, task_id))["m0"].error["message"]
        )
        async with c.db.transaction() as conn:
            await conn.execute(
                sa.update(cap_usage)
                .where(cap_usage.c.bucket != 0)
                .values(bucket=cap_usage.c.bucket - 120)
            )  # both are now older than the window: the next payment fits
        await submit(c, {"steps": sends(1, "pay.charge")}, tenant="acme")
        assert len(await claim(c, wait=None)) == 1
        async with c.db.transaction() as conn:
            buckets = (
                await conn.execute(
                    sa.select(sa.func.count()).where(
                        cap_usage.c.scope == "tenant:acme", cap_usage.c.bucket != 0
                    )
                )
            ).scalar_one()
        assert buckets == 1  # the stale buckets went; only the new charge's is left


async def test_concurrent_claims_on_two_replicas_never_over_admit(
    postgres_url: str, tmp_path: Path
) -> None:
    settings = policy_file(tmp_path, {"acme": {"caps": {"payment": {"limit": 7, "window": "1h"}}}})
    tools = write_tools(tmp_path, CAPPED_TOOLS)
    async with (
        components_for(postgres_url, tools, **settings) as one,
        components_for(postgres_url, tools, **settings) as two,
    ):
        own = await submit(one, {"steps": sends(30), "caps": {"message": 5}})
        shared = [
            await submit(one, {"steps": sends(15, "pay.charge")}, tenant="acme") for _ in range(2)
        ]
        handed_out: list[StepRow] = []
        for _ in range(60):  # rounds of racing claims, until every step is leased or refused
            batches = await asyncio.gather(
                *(
                    c.leasing.claim(executor_id=f"x{i}", connectors=["echo"], limit=4)
                    for i, c in enumerate([one, two] * 10)
                )
            )
            handed_out += [s for batch in batches for s in batch]
            assert sum(s.tool == "msg.send" for s in handed_out) <= 5
            assert sum(s.tool == "pay.charge" for s in handed_out) <= 7
            views = [s for t in [own, *shared] for s in (await steps_of(one, t)).values()]
            if not any(s.status.value == "ready" for s in views):
                break
        assert len({s.id for s in handed_out}) == len(handed_out)
        assert sum(s.tool == "msg.send" for s in handed_out) == 5
        assert sum(s.tool == "pay.charge" for s in handed_out) == 7
        used = await totals(one)
        assert used[(f"task:{own}", "message")] == 5
        assert used[("tenant:acme", "payment")] == 7
        assert one.leasing.effect_caps.refused + two.leasing.effect_caps.refused == 60 - 12
        ended = [s for s in views if s.status.value == "failed"]
        assert len(ended) == 48
        assert {s.error["code"] for s in ended} == {"cap_exceeded"}


async def test_a_plan_over_its_own_cap_is_refused_at_submit(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, CAPPED_TOOLS)
    async with components_for(database_url, tools) as c, api_client(c) as client:
        plan = {
            "steps": [
                {"step_id": "pay1", "tool": "pay.charge"},
                {"step_id": "note", "tool": "echo.say"},
                {"step_id": "pay2", "tool": "pay.charge"},
                {"step_id": "maybe", "tool": "pay.charge", "when": "true"},
            ],
            "caps": {"payment": 1, "cost": 10},
        }
        answer = await client.post("/v1/tasks", json=plan)
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert answer.json()["errors"] == [
            {
                "pointer": "/steps/2",
                "code": "cap_exceeded",
                "detail": "with this step the plan uses 2 of 'payment' (steps pay1, pay2), "
                "over its cap of 1",
            }
        ]
        calls = {
            "tool_calls": [
                {"id": f"c{i}", "function": {"name": "pay.charge", "arguments": "{}"}}
                for i in range(3)
            ],
            "caps": {"cost": 4},
        }
        answer = await client.post("/v1/tasks", json=calls, params={"atomic": "true"})
        assert answer.status_code == 422, answer.text
        assert [e["pointer"] for e in answer.json()["errors"]] == ["/tool_calls/2"]
        bad = {"steps": [{"step_id": "a", "tool": "echo.say"}], "caps": {"payment": -1}}
        answer = await client.post("/v1/tasks", json=bad)
        assert answer.status_code == 422
        assert answer.json()["errors"][0]["pointer"] == "/caps/payment"
        assert (await client.get("/v1/tasks")).json()["tasks"] == []
        fits = {**calls, "caps": {"cost": 6, "payment": 3}}
        assert (await client.post("/v1/tasks", json=fits)).status_code == 202


async def test_racing_charges_never_over_admit(postgres_url: str, tmp_path: Path) -> None:
    """Ten charging transactions at once, from two replicas, on the same counters."""
    settings = policy_file(tmp_path, {"acme": {"caps": {"payment": {"limit": 7, "window": "1h"}}}})
    tools = write_tools(tmp_path, CAPPED_TOOLS)
    async with (
        components_for(postgres_url, tools, **settings) as one,
        components_for(postgres_url, tools, **settings) as two,
    ):
        tasks = [
            await submit(one, {"steps": sends(30), "caps": {"message": 5}}),
            await submit(one, {"steps": sends(15, "pay.charge")}, tenant="acme"),
            await submit(one, {"steps": sends(15, "pay.charge")}, tenant="acme"),
        ]
        rows = [s for t in tasks for s in (await steps_of(one, t)).values()]
        batches = [rows[i::10] for i in range(10)]
        refused = await asyncio.gather(
            *(c.leasing.effect_caps.charge(b) for c, b in zip([one, two] * 5, batches, strict=True))
        )
        admitted = [s for s in rows if not any(s.id in r for r in refused)]
        assert sum(s.tool == "msg.send" for s in admitted) == 5
        assert sum(s.tool == "pay.charge" for s in admitted) == 7
        used = await totals(one)
        assert used[(f"task:{tasks[0]}", "message")] == 5
        assert used[("tenant:acme", "payment")] == 7


async def test_the_same_step_charged_twice_at_once_is_charged_once(
    postgres_url: str, tmp_path: Path
) -> None:
    """Two charges of one step race (its lease expired mid-charge and it was taken again): the
    one that waited for the counters sees the other's charge and adds nothing."""
    tools = write_tools(tmp_path, CAPPED_TOOLS)
    async with components_for(postgres_url, tools) as c:
        task_id = await submit(c, {"steps": sends(2), "caps": {"message": 5}})
        first, second = (await steps_of(c, task_id)).values()
        assert await c.leasing.effect_caps.charge([first]) == {}  # the counter row exists now
        held = await c.db.engine.connect()  # hold the counter: both charges wait behind it
        transaction = await held.begin()
        await held.execute(
            sa.select(cap_usage.c.used)
            .where(cap_usage.c.scope == f"task:{task_id}")
            .with_for_update()
        )
        racing = [asyncio.create_task(c.leasing.effect_caps.charge([second])) for _ in range(2)]
        await wait_for_lock_waiters(c, 2)  # both past their first look, blocked on the counter
        await transaction.rollback()
        await held.close()
        assert await asyncio.gather(*racing) == [{}, {}]
        used = await totals(c)
        assert used[(f"task:{task_id}", "message")] == 2  # one per step, not three


async def wait_for_lock_waiters(c: Components, count: int, *, within: float = 10.0) -> None:
    """Until `count` sessions of this database wait for a lock (each read is a new snapshot)."""
    waiting = sa.text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        async with c.db.transaction() as conn:
            if (await conn.execute(waiting)).scalar_one() >= count:
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} sessions never waited for a lock")
