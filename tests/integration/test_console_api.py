"""The /v1 endpoints the web console reads: the task list's filters and keyset paging (with the
indexes Postgres walks for them), the approvals inbox, and a tool's use of its limits."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
import yaml
from redis.exceptions import RedisError

from agent_reach.ids import task_id_floor
from agent_reach_controller.decide.ratelimits import Rate
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.limiter import MemoryLimiter, RedisLimiter, SqlLimiter
from agent_reach_controller.storage import listings
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.storage.listings import TaskFilter
from agent_reach_controller.storage.schema import rate_buckets
from tests.conftest import REDIS_URL, _unavailable
from tests.integration.stack import TOOLS, api_client, components_for, key_for, ok, write_tools
from tests.integration.test_approvals import PAY

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def created_ms(task_id: str) -> int:
    """The creation time of a task (UUIDv7), in Unix milliseconds."""
    return int(task_id.replace("-", "")[:12], 16)


def rfc3339(ms: int) -> str:
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")


async def walk(api: httpx.AsyncClient, params: dict[str, Any], *, limit: int = 2) -> list[str]:
    """Every task id a filtered list gives, page after page."""
    seen: list[str] = []
    before: str | None = None
    for _ in range(100):
        page = await api.get(
            "/v1/tasks", params={**params, "limit": limit, **({"before": before} if before else {})}
        )
        assert page.status_code == 200, page.text
        body = page.json()
        seen += [t["task_id"] for t in body["tasks"]]
        assert len(body["tasks"]) <= limit
        before = body["next_before"]
        if before is None:
            break
    assert len(seen) == len(set(seen)), "a task was listed twice"
    return seen


# --- the task list --------------------------------------------------------------------------


async def test_filters_combine_and_page_without_duplicates_or_gaps(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        ann = await key_for(c, roles=("agent",), name="ann")
        bob = await key_for(c, roles=("agent",), name="bob")
        zed = await key_for(c, roles=("admin",), name="zed", tenant="other")
        plans = {
            "say": {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}}]},
            "count": {"steps": [{"step_id": "a", "tool": "echo.count", "args": {"n": 1}}]},
            "both": {
                "steps": [
                    {"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}},
                    {"step_id": "b", "tool": "echo.count", "args": {"n": 2}},
                ]
            },
        }
        made: list[dict[str, Any]] = []
        for i in range(12):
            who, name = (ann, "ann") if i % 3 else (bob, "bob")
            kind = ("say", "count", "both", "count")[i % 4]
            answer = await api.post("/v1/tasks", json=plans[kind], headers=who)
            assert answer.status_code == 202, answer.text
            made.append({"id": answer.json()["task_id"], "principal": name, "kind": kind})
            # Another tenant's tasks, interleaved in time, with the same tools and names.
            assert (await api.post("/v1/tasks", json=plans[kind], headers=zed)).status_code == 202
            await asyncio.sleep(0.003)  # each task in a millisecond of its own
        for task in made[::5]:
            cancelled = await api.post(f"/v1/tasks/{task['id']}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            task["status"] = "cancelled"
        newest_first = sorted(made, key=lambda t: t["id"], reverse=True)
        assert [t["id"] for t in newest_first] == [t["id"] for t in made][::-1]  # time-ordered
        since, until = created_ms(made[3]["id"]), created_ms(made[9]["id"])
        cases: list[tuple[dict[str, Any], Any]] = [
            ({}, lambda t: True),
            ({"status": "cancelled"}, lambda t: t.get("status") == "cancelled"),
            ({"status": "pending"}, lambda t: "status" not in t),
            ({"principal": "ann"}, lambda t: t["principal"] == "ann"),
            ({"tool": "echo.count"}, lambda t: t["kind"] in ("count", "both")),
            ({"tool": "echo.say"}, lambda t: t["kind"] in ("say", "both")),
            ({"since": rfc3339(since)}, lambda t: created_ms(t["id"]) >= since),
            ({"until": rfc3339(until)}, lambda t: created_ms(t["id"]) < until),
            (
                {"since": rfc3339(since), "until": rfc3339(until), "tool": "echo.count"},
                lambda t: since <= created_ms(t["id"]) < until and t["kind"] != "say",
            ),
            (
                {"principal": "ann", "tool": "echo.say", "status": "pending"},
                lambda t: t["principal"] == "ann" and t["kind"] != "count" and "status" not in t,
            ),
            ({"tool": "echo.nothing"}, lambda t: False),
        ]
        async with api_client(c, name="zed2", tenant="other") as outsider:
            for params, wanted in cases:
                expected = [t["id"] for t in newest_first if wanted(t)]
                assert await walk(api, params) == expected, params
                assert await walk(api, params, limit=5) == expected, params
                # Another tenant's callers never see these, under any filter.
                assert not set(await walk(outsider, params, limit=50)) & set(expected), params
        first = (await api.get("/v1/tasks", params={"limit": 1})).json()["tasks"][0]
        assert (first["task_id"], first["principal"]) == (made[-1]["id"], made[-1]["principal"])


@pytest.mark.parametrize(
    ("params", "pointer"),
    [
        ({"since": "yesterday"}, "/query/since"),
        ({"since": "2026-12-05"}, "/query/since"),  # a date is not an instant
        ({"since": "2026-12-05T08:00:00"}, "/query/since"),  # nor a time without an offset
        ({"until": "1764921600"}, "/query/until"),  # nor a Unix time
        ({"since": "2026-12-05T08:00:00Z", "until": "2026-12-05T07:00:00Z"}, "/query/until"),
        ({"tool": "no such tool!"}, "/query/tool"),
        ({"status": "lost"}, "/query/status"),
        ({"principal": ""}, "/query/principal"),
        ({"limit": "0"}, "/query/limit"),
    ],
)
async def test_a_bad_filter_is_a_problem_with_a_pointer(
    sqlite_url: str, tmp_path: Path, params: dict[str, str], pointer: str
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as api:
        answer = await api.get("/v1/tasks", params=params)
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert [e["pointer"] for e in answer.json()["errors"]] == [pointer]
        fine = {"since": "2026-12-05T08:00:00.123+08:00", "until": "2026-12-06T00:00:00z"}
        assert (await api.get("/v1/tasks", params=fine)).status_code == 200


def test_a_time_is_a_task_id_bound() -> None:
    ms = 1_764_921_600_123
    floor = task_id_floor(ms)
    assert floor == "019aed86-687b-0000-0000-000000000000"
    assert created_ms(floor) == ms
    assert task_id_floor(ms - 1) < floor < task_id_floor(ms + 1)
    assert task_id_floor(-5) == "00000000-0000-0000-0000-000000000000"
    assert task_id_floor(1 << 60) == "ffffffff-ffff-0000-0000-000000000000"


# --- the plans Postgres picks for the list ------------------------------------------------------

TASKS = 60_000
# One task a second; tenant `acme` has every third one, the others are spread over six tenants.
# Each task has an `echo.say` step and one of ten other tools (`rare.tool` on one in 200).
FILL_TASKS = """
INSERT INTO tasks (task_id, trace_id, status, principal, tenant, source, request, context,
                   created_at, updated_at)
SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || lpad(to_hex(i %% 4096), 3, '0')
       || '-8' || lpad(to_hex(i %% 4096), 3, '0') || '-' || lpad(to_hex(i), 12, '0'),
       'trace',
       CASE i %% 20 WHEN 0 THEN 'failed' WHEN 1 THEN 'running' WHEN 2 THEN 'pending'
                    WHEN 3 THEN 'cancelled' ELSE 'succeeded' END,
       'p' || (i %% 50),
       CASE WHEN i %% 3 = 0 THEN 'acme' ELSE 'other' || (i %% 7) END,
       'plan', '{}', '{}', now(), now()
FROM (SELECT i, lpad(to_hex(%(start)s::bigint + i * 1000), 12, '0') AS h
      FROM generate_series(1, %(n)s) AS i) AS g
"""
FILL_STEPS = """
INSERT INTO steps (task_id, step_id, position, trace_id, tool, tool_version, connector, args,
                   depends_on, status, attempt, max_attempts, idempotency_key, tenant,
                   created_at, updated_at)
SELECT t.task_id, 's' || k, k, 'trace',
       CASE WHEN k = 0 THEN 'echo.say'
            WHEN abs(hashtext(t.task_id)) % 200 = 0 THEN 'rare.tool'
            ELSE 'tool.' || (abs(hashtext(t.task_id)) % 10) END,
       '1', 'echo', '{}', '[]', 'succeeded', 1, 3, t.task_id || k, t.tenant, now(), now()
FROM tasks t CROSS JOIN generate_series(0, 1) AS k
"""


@pytest.fixture
def many_tasks(postgres_url: str) -> tuple[str, int]:
    """A database of TASKS analysed tasks (and twice as many steps); and the first one's time."""
    start = int(time.time() * 1000) - TASKS * 1000
    with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(FILL_TASKS, {"start": start, "n": TASKS})
        conn.execute(FILL_STEPS)
        conn.execute("ANALYZE tasks, steps")
    return postgres_url, start


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def _plan_of(db: Database, where: TaskFilter) -> list[dict[str, Any]]:
    """The plan of the very statement `listings.list_tasks` sends, with its parameters."""
    sent: list[tuple[str, Any]] = []

    def capture(*args: Any) -> None:
        sent.append((args[2], args[3]))  # (conn, cursor, statement, parameters, ...)

    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        async with db.transaction() as conn:
            await listings.list_tasks(conn, where)
            [(statement, parameters)] = [s for s in sent if "FROM tasks" in s[0]]
            found = await conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, parameters)
            document = found.scalar_one()
    finally:
        sa.event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return list(_nodes(plan))


async def test_each_filter_walks_its_index(many_tasks: tuple[str, int]) -> None:
    url, start = many_tasks
    middle = _EPOCH + timedelta(milliseconds=start + TASKS * 500)
    db = Database(url)
    try:
        async with db.transaction() as conn:
            some = (await listings.list_tasks(conn, TaskFilter(tenant="acme", limit=5000)))[-1]
        by_task = {"pk_tasks", "ix_tasks_tenant_task_id"}
        # Each filter alone: a walk of its index, newest first, that stops after a page.
        alone: list[tuple[TaskFilter, set[str]]] = [
            (TaskFilter(tenant="acme"), by_task),
            (TaskFilter(tenant="acme", before=some.task_id), by_task),
            (TaskFilter(tenant="acme", status="failed"), {"ix_tasks_tenant_status_task_id"}),
            (
                TaskFilter(tenant="acme", status="failed", before=some.task_id),
                {"ix_tasks_tenant_status_task_id"},
            ),
            (TaskFilter(tenant="acme", principal="p3"), {"ix_tasks_tenant_principal_task_id"}),
            (TaskFilter(tenant="acme", tool="echo.say"), {"ix_steps_tenant_tool_task_id"}),
            (TaskFilter(tenant="acme", tool="tool.3"), {"ix_steps_tenant_tool_task_id"}),
            (TaskFilter(tenant="acme", since=middle), by_task),
            (TaskFilter(tenant="acme", until=middle), by_task),
            (
                TaskFilter(tenant="acme", since=middle - timedelta(hours=2), until=middle),
                by_task,
            ),
        ]
        for where, indexes in alone:
            nodes = await _plan_of(db, where)
            used = {n.get("Index Name") for n in nodes}
            assert used & indexes, (where, nodes)
            assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], (where, nodes)
            assert not [n for n in nodes if n["Node Type"] == "Sort"], (where, nodes)
        # Combined, Postgres picks among the same indexes; it may gather a few matches by
        # bitmap and sort them, never scan a table.
        combined = [
            TaskFilter(tenant="acme", status="failed", tool="tool.3"),
            TaskFilter(tenant="acme", status="succeeded", principal="p3", tool="echo.say"),
            TaskFilter(tenant="acme", tool="rare.tool", since=middle - timedelta(hours=5)),
            TaskFilter(
                tenant="acme",
                status="failed",
                principal="p0",
                tool="rare.tool",
                since=middle - timedelta(hours=3),
                until=middle,
                before=some.task_id,
            ),
        ]
        for where in combined:
            nodes = await _plan_of(db, where)
            scanned = {n["Relation Name"] for n in nodes if n["Node Type"] == "Seq Scan"}
            assert not scanned & {"tasks", "steps"}, (where, nodes)
            if where.tool is not None:
                assert "ix_steps_tenant_tool_task_id" in {n.get("Index Name") for n in nodes}
    finally:
        await db.close()


# --- the approvals inbox --------------------------------------------------------------------

WIRE = {**PAY, "name": "wire.send", "description": "Moves more money."}
POLICY = {
    "roles": {
        "operator": [{"tools": "*", "actions": ["submit", "approve"]}],
        "approver": [{"tools": "pay.*", "actions": ["approve"]}],
        "viewer": [],
    }
}


def pay_plan(tool: str, cents: int) -> dict[str, Any]:
    return {
        "steps": [
            {"step_id": "quote", "tool": "echo.say", "args": {"text": "q", "n": cents}},
            {
                "step_id": "pay",
                "tool": tool,
                "args": {"to": "acct-1", "cents": "$quote.output.n"},
                "depends_on": ["quote"],
            },
        ]
    }


@pytest.fixture
async def inbox(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Components, list[str]]]:
    """Three tasks of `ann` waiting for a decision (pay, wire, pay; resolved arguments), and
    one of another tenant's."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    tools = write_tools(tmp_path, [*TOOLS, PAY, WIRE])
    async with components_for(database_url, tools, policy=policy) as c:
        ann = await key_for(c, roles=("operator",), name="ann")
        bob = await key_for(c, roles=("operator",), name="bob", tenant="other")
        ids = []
        async with api_client(c, roles=("operator",), name="setup") as api:
            for who, tool, cents in [
                (ann, "pay.send", 100),
                (ann, "wire.send", 200),
                (ann, "pay.send", 300),
                (bob, "pay.send", 400),
            ]:
                answer = await api.post("/v1/tasks", json=pay_plan(tool, cents), headers=who)
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["task_id"])
                leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
                await c.reporting.report(
                    executor_id="x", results=[ok(s, {"n": s.args["n"]}) for s in leased]
                )
                await asyncio.sleep(0.002)  # a decide_by of its own
        yield c, ids


async def inbox_of(api: httpx.AsyncClient, *, limit: int = 50) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(50):
        params: dict[str, Any] = {"limit": limit} | ({"after": after} if after else {})
        page = await api.get("/v1/approvals", params=params)
        assert page.status_code == 200, page.text
        items += page.json()["approvals"]
        after = page.json()["next_after"]
        if after is None:
            return items
    raise AssertionError("the inbox never ended")


async def test_the_inbox_shows_what_the_caller_may_decide(
    inbox: tuple[Components, list[str]],
) -> None:
    c, (pay1, wire, pay3, _) = inbox
    async with api_client(c, roles=("approver",), name="carol") as carol:
        mine = await inbox_of(carol)
        assert [(a["task_id"], a["step_id"]) for a in mine] == [(pay1, "pay"), (pay3, "pay")]
        first = mine[0]
        assert first["tool"] == "pay.send"
        assert first["tool_version"] == c.catalog["pay.send"].version
        assert (first["risk"], first["environment"]) == ("dangerous", "dev")
        # Exactly what would run: the arguments resolved from the quote, not the template.
        assert first["args"] == {"to": "acct-1", "cents": 100}
        assert first["input_schema"] == PAY["input_schema"]
        assert first["asked_by"] == "ann"
        asked_at = datetime.fromisoformat(first["asked_at"])
        assert asked_at < datetime.fromisoformat(first["decide_by"])
        assert (first["may_decide"], first["why_not"]) == (True, None)
        # Paged one at a time, soonest deadline first: the same two, no more.
        assert await inbox_of(carol, limit=1) == mine
        # Once decided, it leaves the inbox.
        url = f"/v1/tasks/{pay1}/steps/pay/approval"
        assert (await carol.post(url, json={"decision": "approve"})).status_code == 200
        assert [a["task_id"] for a in await inbox_of(carol)] == [pay3]
    async with api_client(c, roles=("viewer",), name="dave") as dave:
        assert await inbox_of(dave) == []
    async with api_client(c, roles=("operator",), name="erin") as erin:
        everything = await inbox_of(erin, limit=1)
        assert [a["task_id"] for a in everything] == [wire, pay3]
        assert all(a["may_decide"] for a in everything)


async def test_the_asker_sees_its_own_steps_but_may_not_decide(
    inbox: tuple[Components, list[str]],
) -> None:
    c, (pay1, wire, pay3, theirs) = inbox
    async with api_client(c, roles=("operator",), name="ann") as ann:
        mine = await inbox_of(ann)
        assert [a["task_id"] for a in mine] == [pay1, wire, pay3]
        for item in mine:
            assert item["may_decide"] is False
            assert item["why_not"]["code"] == "separation_of_duties"
        # The API refuses it for the same reason, in the same words.
        refused = await ann.post(
            f"/v1/tasks/{pay1}/steps/pay/approval", json={"decision": "approve"}
        )
        assert refused.status_code == 403
        assert refused.json()["detail"] == mine[0]["why_not"]["detail"]
    # Another tenant's approver sees only its own tenant's step.
    async with api_client(c, roles=("operator",), name="olga", tenant="other") as olga:
        assert [a["task_id"] for a in await inbox_of(olga)] == [theirs]


async def test_without_separation_of_duties_the_asker_may_decide(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, PAY])
    async with (
        components_for(sqlite_url, tools, separation_of_duties=False) as c,
        api_client(c, roles=("operator",), name="ann") as ann,
    ):
        assert (await ann.post("/v1/tasks", json=pay_plan("pay.send", 5))).status_code == 202
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        await c.reporting.report(executor_id="x", results=[ok(s, {"n": 5}) for s in leased])
        [item] = await inbox_of(ann)
        assert (item["may_decide"], item["why_not"]) == (True, None)


@pytest.mark.parametrize(
    ("params", "pointer"),
    [
        ({"after": "soon"}, "/query/after"),
        ({"after": "999999999999999999-1"}, "/query/after"),  # past the year 9999
        ({"limit": "201"}, "/query/limit"),
    ],
)
async def test_a_bad_inbox_page_is_a_problem_with_a_pointer(
    sqlite_url: str, tmp_path: Path, params: dict[str, str], pointer: str
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as api:
        answer = await api.get("/v1/approvals", params=params)
        assert answer.status_code == 422, answer.text
        assert [e["pointer"] for e in answer.json()["errors"]] == [pointer]


# --- a tool's use of its limits -------------------------------------------------------------

LIMITED = {
    "name": "echo.limited",
    "description": "One call a minute, three at once; two running at most.",
    "connector": "echo",
    "rate_limit": {"rate": "1/m", "burst": 3},
    "concurrency": 2,
    "breaker": {"minimum_calls": 10},
}
KEYED = {
    "name": "crm.note",
    "description": "One call a minute per customer, two at once.",
    "connector": "echo",
    "input_schema": {"type": "object", "properties": {"customer": {"type": "string"}}},
    "rate_limit": {"rate": "1/m", "burst": 2, "key": "args.customer"},
    "concurrency_per_key": {"limit": 5, "key": "args.customer"},
}


async def buckets(c: Components) -> list[tuple[str, float]]:
    async with c.db.transaction() as conn:
        rows = await conn.execute(sa.select(rate_buckets).order_by(rate_buckets.c.bucket))
        return [(b, t) for b, t in rows.all()]


async def test_usage_before_and_after_steps_run(database_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, LIMITED, KEYED])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        # In embedded mode (SQLite) the limiter cannot know what ran before it started: it
        # takes every bucket's burst as spent then, and says so. Postgres's buckets start full.
        fresh = c.db.is_postgres
        url = "/v1/tools/echo.limited/usage"
        before = (await api.get(url)).json()
        assert before["name"] == "echo.limited"
        assert before["rate_limit"] | {"use": None} == {
            "per_second": pytest.approx(1 / 60),
            "burst": 3,
            "key": None,
            "use": None,
            "keys": None,
            "more_keys": False,
        }
        use = before["rate_limit"]["use"]
        if fresh:
            assert use == {"in_use": 0, "frees_in": 0.0}
        else:
            assert use["in_use"] == 3
            assert 50 < use["frees_in"] <= 60
        assert before["concurrency"] == {"limit": 2, "per_key": None, "running": 0}
        assert before["breaker"] == {
            "state": "closed",
            "calls": 0,
            "failures": 0,
            "opened_at": None,
        }

        steps = [{"step_id": f"s{i}", "tool": "echo.limited", "args": {}} for i in range(3)]
        assert (await api.post("/v1/tasks", json={"steps": steps})).status_code == 202
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert len(leased) == (2 if fresh else 0)  # two at once at most; none while refused
        during = (await api.get(url)).json()
        assert during["concurrency"]["running"] == len(leased)
        if fresh:
            assert during["rate_limit"]["use"]["in_use"] == 2
            assert 50 < during["rate_limit"]["use"]["frees_in"] <= 60
            # Reading the use changed no bucket.
            stored = await buckets(c)
            assert (await api.get(url)).status_code == 200
            assert await buckets(c) == stored
            await c.reporting.report(executor_id="x", results=[ok(s, {}) for s in leased])
            after = (await api.get(url)).json()
            assert after["concurrency"]["running"] == 0
            assert after["rate_limit"]["use"]["in_use"] == 2  # still in the window
            assert after["breaker"]["calls"] == 2
            [third] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
            assert third.step_id == "s2"
            full = (await api.get(url)).json()["rate_limit"]["use"]
            assert full["in_use"] == 3
            assert 50 < full["frees_in"] <= 60  # the first call leaves the window then

        keyed = [
            {"step_id": f"n{i}", "tool": "crm.note", "args": {"customer": who}}
            for i, who in enumerate("aab")
        ]
        assert (await api.post("/v1/tasks", json={"steps": keyed})).status_code == 202
        notes = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert len(notes) == (3 if fresh else 0)
        usage = (await api.get("/v1/tools/crm.note/usage")).json()
        assert usage["rate_limit"]["key"] == "args.customer"
        # Two customers' buckets hold state (taken as spent, in embedded mode); `a` is full.
        assert (usage["rate_limit"]["keys"], usage["rate_limit"]["more_keys"]) == (2, False)
        assert usage["rate_limit"]["use"]["in_use"] == 2
        assert usage["concurrency"] == {
            "limit": None,
            "per_key": {"limit": 5, "key": "args.customer"},
            "running": len(notes),
        }
        assert usage["breaker"] is None
        plain = (await api.get("/v1/tools/echo.say/usage")).json()
        assert (plain["rate_limit"], plain["breaker"]) == (None, None)


async def test_usage_is_seen_as_the_tool_is(sqlite_url: str, tmp_path: Path) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path, [*TOOLS, LIMITED])) as c:
        async with api_client(c, roles=("viewer",), name="dave") as dave:
            hidden = await dave.get("/v1/tools/echo.limited/usage")
            assert (hidden.status_code, hidden.json()["code"]) == (404, "not_found")
        async with api_client(c, roles=("agent",), name="ann") as ann:
            assert (await ann.get("/v1/tools/echo.limited/usage")).status_code == 200
            assert (await ann.get("/v1/tools/no.such/usage")).status_code == 404


# --- peeking at each limiter's buckets ----------------------------------------------------------

RATE = Rate(per_second=1.0, burst=3)


async def _peeks_change_nothing(
    limiter: Any, conn: Any, now: float, *, own_clock: bool = False
) -> None:
    """What every store must answer, at `now` (well past any floor). With `own_clock`, the
    store reads its own clock (Redis), and only what holds at the present is checked."""
    empty = await limiter.peek(conn, "t", RATE, keyed=False, now=now)
    assert (empty.busiest.calls, empty.busiest.frees_in, empty.keys) == (0, 0.0, None)
    assert await limiter.acquire(conn, [("t", RATE)] * 2, now) == [0.0, 0.0]
    two = await limiter.peek(conn, "t", RATE, keyed=False, now=now)
    assert two.busiest.calls == 2
    assert two.busiest.frees_in == pytest.approx(1.0, abs=0.05)
    if not own_clock:
        later = await limiter.peek(conn, "t", RATE, keyed=False, now=now + 1.5)
        assert (later.busiest.calls, later.busiest.frees_in) == (1, pytest.approx(0.5, abs=0.05))
    # As if nobody had looked: the third call goes, the fourth waits a second.
    waits = await limiter.acquire(conn, [("t", RATE)] * 2, now)
    assert waits == [0.0, pytest.approx(1.0, abs=0.05)]
    asks = [("k#a", RATE), ("k#a", RATE), ("k#b", RATE), ("kx1#c", RATE), ("k_1x#d", RATE)]
    await limiter.acquire(conn, asks, now)
    keyed = await limiter.peek(conn, "k", RATE, keyed=True, now=now)
    assert (keyed.keys, keyed.more_keys, keyed.busiest.calls) == (2, False, 2)
    # `_` in a name is no wildcard (`k_1` is not `kx1`).
    none = await limiter.peek(conn, "k_1", RATE, keyed=True, now=now)
    assert (none.keys, none.busiest.calls) == (0, 0)
    if not own_clock:
        drained = await limiter.peek(conn, "k", RATE, keyed=True, now=now + 10)
        assert (drained.keys, drained.busiest.calls) == (0, 0)


async def test_memory_and_sql_buckets_are_read_without_a_change(database_url: str) -> None:
    db = Database(database_url)
    try:
        await _peeks_change_nothing(MemoryLimiter(), None, time.time() + 3600)
        async with db.transaction() as conn:
            await _peeks_change_nothing(SqlLimiter(), conn, time.time())
            rows = (await conn.execute(sa.select(rate_buckets))).all()
            await SqlLimiter().peek(conn, "k", RATE, keyed=True, now=time.time())
            await SqlLimiter().peek(conn, "t", RATE, keyed=False, now=time.time())
            assert (await conn.execute(sa.select(rate_buckets))).all() == rows
    finally:
        await db.close()


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    """A key prefix of this test's own in the tests' Redis (nothing else there is touched)."""
    client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        await client.ping()
    except (OSError, RedisError) as exc:
        await client.aclose()
        _unavailable("Redis", exc)
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    try:
        await client.set(f"{prefix}{{rl}}:epoch", "0")  # a Redis that has kept buckets for long
        yield prefix
    finally:
        mine = [key async for key in client.scan_iter(match=f"{prefix}*")]
        if mine:
            await client.delete(*mine)
        await client.aclose()


async def test_redis_buckets_are_read_without_a_change(redis_prefix: str) -> None:
    limiter = RedisLimiter(REDIS_URL, prefix=redis_prefix)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        seconds, micros = await client.time()
        await _peeks_change_nothing(limiter, None, seconds + micros / 1e6, own_clock=True)
    finally:
        await limiter.close()
        await client.aclose()


async def test_redis_keys_and_values_are_left_as_they_were(redis_prefix: str) -> None:
    limiter = RedisLimiter(REDIS_URL, prefix=redis_prefix)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await limiter.acquire(None, [("t", RATE), ("k#a", RATE)], time.time())  # type: ignore[arg-type]

        async def state() -> dict[bytes, bytes | None]:
            keys = sorted([k async for k in client.scan_iter(match=f"{redis_prefix}*")])
            return dict(zip(keys, await client.mget(keys), strict=True))

        before = await state()
        await limiter.peek(None, "t", RATE, keyed=False, now=time.time())  # type: ignore[arg-type]
        await limiter.peek(None, "k", RATE, keyed=True, now=time.time())  # type: ignore[arg-type]
        assert await state() == before
    finally:
        await limiter.close()
        await client.aclose()


async def test_a_peek_reads_postgres_while_redis_is_down_and_marks_nothing(
    database_url: str,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    db = Database(database_url)
    limiter = RedisLimiter(f"redis://127.0.0.1:{port}/0", prefix="test:", timeout=0.2)
    try:
        async with db.transaction() as conn:
            now = time.time()
            await SqlLimiter().acquire(conn, [("t", RATE)] * 2, now)
            use = await limiter.peek(conn, "t", RATE, keyed=False, now=now)
        assert use.busiest.calls == 2
        # Only a claim decides that Redis is down (and switches stores): a peek does not.
        assert (limiter.degraded, limiter.fallbacks) == (False, 0)
    finally:
        await limiter.close()
        await db.close()
