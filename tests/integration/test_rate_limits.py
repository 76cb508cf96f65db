"""Rate limits at dispatch: buckets per tool and per key, learned pauses, Redis and its fallback."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa

from agent_reach_controller.decide.outcomes import AttemptError, AttemptResult
from agent_reach_controller.decide.ratelimits import Rate, admit
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.limiter import RedisLimiter
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.storage.schema import events
from tests.integration.stack import TOOLS, components_for, ok, submit, write_tools
from tests.support.server import free_port

LIMITED = {
    "name": "echo.limited",
    "description": "A downstream that allows 20 calls a second, 3 at once.",
    "connector": "echo",
    "rate_limit": {"rate": "20/s", "burst": 3},
}
PER_CUSTOMER = {
    "name": "crm.note",
    "description": "Five calls a second per customer.",
    "connector": "echo",
    "rate_limit": {"rate": "5/s", "burst": 1, "key": "args.customer"},
}


async def drain(c: Components, expected: int, *, within: float = 15.0) -> list[StepRow]:
    """Poll like an executor, succeeding every leased step, until `expected` steps ran."""
    leased: list[StepRow] = []
    deadline = time.monotonic() + within
    while len(leased) < expected:
        assert time.monotonic() < deadline, f"only {len(leased)} of {expected} steps ran"
        batch = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=50, wait=1.0)
        leased += batch
        await c.reporting.report(executor_id="x", results=[ok(s, {}) for s in batch])
    return leased


async def lease_times(c: Components, task_id: str) -> dict[str, list[float]]:
    """When each step was leased (the controller's clock), by tool, from the event log."""
    async with c.db.transaction() as conn:
        rows = await conn.execute(
            sa.select(events.c.step_id, events.c.created_at)
            .where(events.c.task_id == task_id, events.c.kind == "lease")
            .order_by(events.c.created_at)
        )
        return {step: [when.timestamp()] for step, when in rows.all()}


def busiest(times: list[float], window: float) -> int:
    """The most calls in any window of this length."""
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t <= start + window) for i, start in enumerate(times))


async def test_leases_keep_to_the_rate_and_refused_steps_wait_in_the_queue(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, LIMITED])) as c:
        n = 15
        steps = [{"step_id": f"s{i}", "tool": "echo.limited", "args": {}} for i in range(n)]
        task_id = await submit(c, {"steps": steps})
        leased = await drain(c, n)
        assert Counter(s.step_id for s in leased).most_common(1)[0][1] == 1
        times = sorted(t for ts in (await lease_times(c, task_id)).values() for t in ts)
        assert len(times) == n
        for window in (0.1, 0.25, 0.5, 1.0):
            assert busiest(times, window) <= 3 + 20 * window + 1e-6, window
        # The limit bit (12 steps beyond the burst at 20/s take 0.6 s), without idling long.
        assert 0.6 - 1e-3 <= times[-1] - times[0] <= 0.6 + 1.5
        assert c.metrics.total("agent_reach_rate_limited_total") > 0


async def test_each_key_value_has_its_own_bucket(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, PER_CUSTOMER])) as c:
        steps = [
            {"step_id": f"{who}{i}", "tool": "crm.note", "args": {"customer": who}}
            for i in range(3)
            for who in ("a", "b", "c")
        ]
        task_id = await submit(c, {"steps": steps})
        await drain(c, len(steps))
        leased = await lease_times(c, task_id)
        by_customer = {who: sorted(leased[f"{who}{i}"][0] for i in range(3)) for who in "abc"}
        for times in by_customer.values():
            gaps = [b - a for a, b in itertools.pairwise(times)]
            assert min(gaps) >= 0.2 - 1e-3  # one call per 200 ms for each customer
        firsts = [times[0] for times in by_customer.values()]
        assert max(firsts) - min(firsts) < 0.15  # but customers do not wait for each other


async def test_a_downstream_that_says_slow_down_holds_its_whole_tool_back(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await submit(
            c,
            {
                "steps": [
                    *({"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(4)),
                    {"step_id": "other", "tool": "echo.count", "args": {"n": 1}},
                ]
            },
        )
        [first] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
        told = AttemptResult(
            step_key=first.id,
            attempt=first.attempt,
            error=AttemptError(
                code="rate_limited", message="429", retryable=True, retry_after_s=1.0
            ),
        )
        # Taken before the report: the pause runs from the controller's clock inside it, and a
        # slow report (a loaded machine) must not make the pause look short.
        paused_at = time.monotonic()
        await c.reporting.report(executor_id="x", results=[told])
        # Only the other tool runs while echo.say is held back, retries included.
        during = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert [s.step_id for s in during] == ["other"]
        after = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=10, wait=3.0)
        assert time.monotonic() - paused_at >= 1.0 - 0.05
        assert {s.step_id for s in after} == {"s0", "s1", "s2", "s3"}  # s0's retry too
        # A success that says the quota is spent holds the tool back as well.
        # Long enough that a loaded machine still claims within it.
        spent = AttemptResult(step_key=after[0].id, attempt=after[0].attempt, throttle_s=1.5)
        spent_at = time.monotonic()
        await c.reporting.report(executor_id="x", results=[spent, *map(_ok, after[1:])])
        await c.reporting.report(executor_id="x", results=[ok(s, {}) for s in during])
        await submit(c, {"steps": [{"step_id": "late", "tool": "echo.say", "args": {}}]})
        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10) == []
        [late] = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=10, wait=3)
        assert late.step_id == "late"
        assert time.monotonic() - spent_at >= 1.5 - 0.05


def _ok(step: StepRow) -> AttemptResult:
    return ok(step, {})


# --- Redis and its Postgres fallback -----------------------------------------------------------


async def test_the_redis_script_agrees_with_the_python_rule(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    limiter = RedisLimiter(redis_url, prefix="test:")
    try:
        await client.set("test:{rl}:epoch", "0")  # a Redis that has kept buckets for long
        a, b = Rate(per_second=10.0, burst=3), Rate(per_second=1.0, burst=1)
        asks = [("a", a)] * 5 + [("b", b)] * 2
        before = time.time()
        waits = await limiter.acquire(None, asks, before)  # type: ignore[arg-type]
        tats: dict[str, float | None] = {"a": None, "b": None}
        expected = []
        for bucket, rate in asks:
            tats[bucket], wait = admit(tats[bucket], before, rate)
            expected.append(wait)
        assert waits == pytest.approx(expected, abs=0.05)
        assert [w == 0 for w in waits] == [w == 0 for w in expected]
        # Buckets expire once full again: Redis keeps nothing it does not need.
        ttl = await client.pttl("test:{rl}:b:a")
        assert 0 < ttl <= 1_400
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_wiped_redis_starts_every_bucket_empty(redis_url: str) -> None:
    limiter = RedisLimiter(redis_url, prefix="test:")
    client = aioredis.Redis.from_url(redis_url)
    try:
        rate = Rate(per_second=2.0, burst=5)
        [wait] = await limiter.acquire(None, [("x", rate)], time.time())  # type: ignore[arg-type]
        assert wait == pytest.approx(0.5, abs=0.05)  # not the burst of a full bucket
        await client.set("test:{rl}:epoch", "0")
        await client.delete("test:{rl}:b:x")
        waits = await limiter.acquire(None, [("x", rate)] * 6, time.time())  # type: ignore[arg-type]
        assert [w == 0 for w in waits] == [True] * 5 + [False]
    finally:
        await limiter.close()
        await client.aclose()


async def test_postgres_decides_while_redis_is_down(postgres_url: str) -> None:
    from agent_reach_controller.storage import migrate

    await asyncio.to_thread(migrate.upgrade, postgres_url)
    db = Database(postgres_url)
    limiter = RedisLimiter(f"redis://127.0.0.1:{free_port()}/0", prefix="test:", timeout=0.2)
    rate = Rate(per_second=4.0, burst=2)
    try:
        async with db.transaction() as conn:
            first = await limiter.acquire(conn, [("t", rate)], time.time())
        # Postgres cannot know what Redis admitted: the bucket starts empty as of the switch.
        assert first == [pytest.approx(0.25, abs=0.05)]
        assert limiter.degraded
        await asyncio.sleep(first[0])
        async with db.transaction() as conn:
            second = await limiter.acquire(conn, [("t", rate)] * 2, time.time())
        assert [w == 0 for w in second] == [True, False]
        assert limiter.fallbacks == 1
    finally:
        await limiter.close()
        await db.close()


async def test_retry_after_is_honoured_up_to_the_tools_cap(sqlite_url: str, tmp_path: Path) -> None:
    capped = {
        "name": "slow.down",
        "description": "Asks for long waits.",
        "connector": "echo",
        "retry": {
            "initial_interval": "10ms",
            "maximum_interval": "10ms",
            "maximum_attempts": 5,
            "maximum_retry_after": "3s",
        },
    }
    async with components_for(sqlite_url, write_tools(tmp_path, [*TOOLS, capped])) as c:
        steps = [{"step_id": f"s{i}", "tool": "slow.down", "args": {}} for i in range(2)]
        task_id = await submit(c, {"steps": steps})
        first, second = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=2)
        asked = {first.step_id: 1.5, second.step_id: 10_000.0}
        before = time.time()
        await c.reporting.report(
            executor_id="x",
            results=[
                AttemptResult(
                    step_key=s.id,
                    attempt=1,
                    error=AttemptError(
                        code="downstream_unavailable",
                        message="503",
                        retryable=True,
                        retry_after_s=asked[s.step_id],
                    ),
                )
                for s in (first, second)
            ],
        )
        view = await c.queries.get(task_id)
        assert view is not None
        waits = {s.step_id: s.not_before.timestamp() - before for s in view.steps if s.not_before}
        # Upper bounds leave room for a slow report on a loaded machine.
        assert 1.5 <= waits[first.step_id] < 1.5 + 1.0  # honoured
        assert 3.0 <= waits[second.step_id] < 3.0 + 1.0  # capped by maximum_retry_after
