"""Each executor pool's share of the work, read from the database on both backends: what its
scope takes of the queue, what its executors hold, the slots its last executor had, and the
executors that makes. A pool with no executor at all, or none since it scaled to zero, still
gets a figure (scale from zero needs one); `/metrics` and `/metrics/pools/{pool}` serve it with
no key."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent_reach_controller.domain.records import QueuedGroup
from agent_reach_controller.services.autoscaling import pool_demand
from agent_reach_controller.services.sessions import Announcement
from tests.integration.stack import components_for, submit, write_tools
from tests.integration.test_metrics import keyless, scrape, value


async def test_each_pool_gets_its_share_of_the_work(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await c.pools.create(name="general", created_by="test")
        await c.pools.create(name="counters", tools=["echo.count"], created_by="test")
        await c.pools.create(name="acme", tenant="acme", created_by="test")
        await c.pools.create(name="web", connectors=["http"], created_by="test")
        await submit(
            c, {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(5)]}
        )
        counts = [{"step_id": f"c{i}", "tool": "echo.count", "args": {"n": 1}} for i in range(3)]
        await submit(c, {"steps": counts})
        # An executor of `general` with 4 slots takes 2 steps.
        tokens = {t.name: t for t in await c.pools.list()}
        session, _ = await c.sessions.open(
            Announcement(executor_id="e1", connectors=["echo"], slots=4, version="test"),
            scope=tokens["general"].scope,
            now=datetime.now(UTC),
        )
        held = await c.leasing.claim(
            executor_id="e1", connectors=["echo"], limit=2, session=session
        )
        assert len(held) == 2

        found = await c.autoscaling.refresh()
        general, counters = found["general"], found["counters"]
        assert (general.queued, general.running, general.slots_per_executor) == (6, 2, 4)
        assert general.desired_executors == 2  # 8 steps at 4 slots
        assert (counters.queued, counters.running, counters.slots_per_executor) == (3, 0, None)
        assert counters.desired_executors == 1  # work, and no executor ever seen: one to start
        assert found["acme"].queued == 0  # another tenant's pool
        assert found["web"].queued == 0  # another connector's pool
        assert found["web"].desired_executors == 0

        text = await scrape(c)
        assert value(text, "agent_reach_pool_queue_depth", pool="general") == 6
        assert value(text, "agent_reach_pool_running_steps", pool="general") == 2
        assert value(text, "agent_reach_pool_executor_slots", pool="general") == 4
        assert value(text, "agent_reach_pool_executor_slots", pool="counters") is None
        async with keyless(c) as client:
            answer = await client.get("/metrics/pools/general")
            assert answer.status_code == 200
            assert answer.json()["desired_executors"] == 2
            missing = await client.get("/metrics/pools/nobody")
            assert missing.status_code == 404
            assert missing.headers["content-type"].startswith("application/problem+json")

        # Its only executor gone (the pool scaled to zero): its slots are still known.
        async with c.db.transaction() as conn:
            ended = await c.sessions.end_expired(conn, now=datetime.now(UTC) + timedelta(hours=1))
        assert ended == [session.id]
        general = (await c.autoscaling.refresh())["general"]
        assert general.slots_per_executor == 4
        assert general.desired_executors == 2


def test_desired_executors_round_up_and_need_work() -> None:
    now = datetime.now(UTC)
    from agent_reach_controller.identity.pools import PoolScope

    scopes = {
        "a": PoolScope(pool="a", credential="t"),
        "b": PoolScope(pool="b", credential="t", tools=("other.*",)),
    }
    queued = [QueuedGroup(tool="x", connector="echo", tenant="default", depth=9, oldest_due=now)]
    found = pool_demand(scopes, queued, {"a": 1}, {"a": 4, "b": 8}, now=now)
    assert found["a"].desired_executors == 3  # 10 steps at 4 slots
    assert found["b"].desired_executors == 0


async def test_callers_asking_at_once_share_one_read(sqlite_url: str, tmp_path: Path) -> None:
    """`/metrics/pools/{pool}` needs no key: however many ask while the figure is stale, the
    queue is read once (the counter wraps admission's read; the service itself is real)."""
    async with components_for(sqlite_url, write_tools(tmp_path)) as c:
        await c.pools.create(name="general", created_by="test")
        reads = 0
        read_queue = c.admission.refresh_queue_depth

        async def counted() -> int:
            nonlocal reads
            reads += 1
            return await read_queue()

        c.admission.refresh_queue_depth = counted  # type: ignore[method-assign]
        answers = await asyncio.gather(*(c.autoscaling.demand("general") for _ in range(20)))
        assert all(a is not None and a.pool == "general" for a in answers)
        assert reads == 1
