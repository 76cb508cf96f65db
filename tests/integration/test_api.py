"""The REST API over the real app and a real database: shapes, problems and status codes."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_controller.runtime import Components
from agent_reach_controller.services.admission import QueueFullError
from agent_reach_controller.tools.memory import memory_tools
from tests.integration.stack import api_client, components_for, ok, write_tools

PLAN = {
    "goal": "say twice",
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}},
        {
            "step_id": "b",
            "tool": "echo.say",
            "depends_on": ["a"],
            "args": {"text": "$a.output.text"},
        },
    ],
}


@contextlib.asynccontextmanager
async def api(
    url: str, tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Components]]:
    async with (
        components_for(url, write_tools(tmp_path), **settings) as c,
        api_client(c) as client,
    ):
        yield client, c


async def work_off(c: Components, *, rounds: int = 10) -> None:
    """Act as an executor: succeed every ready step, echoing its arguments."""
    for _ in range(rounds):
        claimed = await c.leasing.poll(executor_id="t", connectors=["echo"], limit=10, wait=2)
        if not claimed:
            return
        await c.reporting.report(executor_id="t", results=[ok(s, s.resolved_args) for s in claimed])


async def test_submit_then_get_and_events(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, c):
        response = await client.post("/v1/tasks", json=PLAN)
        assert response.status_code == 202
        accepted = response.json()
        assert set(accepted) == {"task_id", "trace_id", "status"}
        assert len(accepted["trace_id"]) == 32
        await work_off(c)
        task = (await client.get(f"/v1/tasks/{accepted['task_id']}")).json()
        assert task["status"] == "succeeded"
        assert [s["receipt"]["data"] for s in task["steps"]] == [{"text": "hi"}, {"text": "hi"}]
        events = (await client.get(f"/v1/tasks/{accepted['task_id']}/events")).json()["events"]
        assert events[0]["kind"] == "task_created"
        assert events[-1]["to_status"] == "succeeded"


async def test_wait_returns_full_task_when_done(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, c):
        worker = asyncio.create_task(work_off(c))
        response = await client.post("/v1/tasks", params={"wait": 10}, json=PLAN)
        await worker
        assert response.status_code == 200
        assert response.json()["status"] == "succeeded"


async def test_openai_tool_calls_get_tool_messages(sqlite_url: str, tmp_path: Path) -> None:
    body = {
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "echo_say", "arguments": '{"text": "one"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "echo.say", "arguments": '{"text": "two"}'},
            },
        ]
    }
    async with api(sqlite_url, tmp_path) as (client, c):
        worker = asyncio.create_task(work_off(c))
        response = await client.post("/v1/tasks", params={"wait": 10}, json=body)
        await worker
        messages = response.json()["tool_messages"]
        assert [m["tool_call_id"] for m in messages] == ["call_1", "call_2"]
        assert all(m["role"] == "tool" for m in messages)
        assert '"succeeded"' in messages[0]["content"]
        assert "one" in messages[0]["content"]


async def test_invalid_plan_lists_every_problem_and_persists_nothing(
    sqlite_url: str, tmp_path: Path
) -> None:
    body = {
        "steps": [
            {"step_id": "a", "tool": "nope.tool", "args": {}},
            {"step_id": "a", "tool": "echo.say", "depends_on": ["ghost"], "args": {"text": 5}},
        ]
    }
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post("/v1/tasks", json=body)
        assert response.status_code == 422
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        codes = {(e["code"], e["pointer"]) for e in problem["errors"]}
        assert ("unknown_tool", "/steps/0/tool") in codes
        assert ("duplicate_step_id", "/steps/1/step_id") in codes
        assert ("unknown_dependency", "/steps/1/depends_on/0") in codes
        assert ("invalid_arguments", "/steps/1/args/text") in codes
        assert (await client.get("/v1/tasks")).json()["tasks"] == []


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (
            b'{"steps": [{"step_id": "a", "tool": "echo.say", "args": {"n": NaN}}]}',
            400,
            "invalid_json",
        ),
        (b"[]", 422, "invalid_plan"),
        (b'"text"', 422, "invalid_plan"),
    ],
)
async def test_bad_bodies_get_specific_problems(
    sqlite_url: str, tmp_path: Path, content: bytes, status: int, code: str
) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post(
            "/v1/tasks", content=content, headers={"content-type": "application/json"}
        )
        assert response.status_code == status
        assert response.json()["code"] == code


async def test_body_over_limit_is_413(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path, max_body_bytes=1000) as (client, _):
        big = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "x" * 2000}}]}
        response = await client.post("/v1/tasks", json=big)
        assert response.status_code == 413
        assert response.json()["code"] == "too_large"

        async def chunks():  # no Content-Length: the limit holds while streaming
            for _ in range(100):
                yield b" " * 100

        streamed = await client.post(
            "/v1/tasks", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413


async def test_idempotency_key(database_url: str, tmp_path: Path) -> None:
    async with api(database_url, tmp_path) as (client, _):
        headers = {"Idempotency-Key": "order-42"}
        first = await client.post("/v1/tasks", json=PLAN, headers=headers)
        again = await client.post("/v1/tasks", json=PLAN, headers=headers)
        assert first.json()["task_id"] == again.json()["task_id"]
        changed = {**PLAN, "goal": "something else"}
        conflict = await client.post("/v1/tasks", json=changed, headers=headers)
        assert conflict.status_code == 409
        assert conflict.json()["task_id"] == first.json()["task_id"]


async def test_traceparent_is_continued(sqlite_url: str, tmp_path: Path) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post(
            "/v1/tasks", json=PLAN, headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}
        )
        assert response.json()["trace_id"] == trace


async def test_unknown_task_is_404_problem(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        for path in ("/v1/tasks/nope", "/v1/tasks/nope/events"):
            response = await client.get(path)
            assert response.status_code == 404
            assert response.json()["code"] == "not_found"
        assert (await client.post("/v1/tasks/nope/cancel")).status_code == 404


async def test_cancel_and_list_filters(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        ids = [(await client.post("/v1/tasks", json=PLAN)).json()["task_id"] for _ in range(3)]
        cancelled = await client.post(f"/v1/tasks/{ids[0]}/cancel")
        assert cancelled.json()["status"] == "cancelled"
        assert {s["status"] for s in cancelled.json()["steps"]} == {"cancelled"}
        page = (await client.get("/v1/tasks", params={"status": "cancelled"})).json()
        assert [t["task_id"] for t in page["tasks"]] == [ids[0]]
        first = (await client.get("/v1/tasks", params={"limit": 2})).json()
        assert [t["task_id"] for t in first["tasks"]] == [ids[2], ids[1]]
        rest = (
            await client.get("/v1/tasks", params={"limit": 2, "before": first["next_before"]})
        ).json()
        assert [t["task_id"] for t in rest["tasks"]] == [ids[0]]
        bad = await client.get("/v1/tasks", params={"limit": 0})
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["pointer"] == "/query/limit"


async def test_tools_catalogue_formats_and_health(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        native = (await client.get("/v1/tools")).json()["tools"]
        seeded = {t.name for t in memory_tools()}  # listed, never in a model's shape
        assert {t["name"] for t in native} == {"echo.say", "echo.count", *seeded}
        openai = (await client.get("/v1/tools", params={"format": "openai"})).json()
        assert {t["function"]["name"] for t in openai} == {"echo_say", "echo_count"}
        assert all(t["type"] == "function" for t in openai)
        anthropic = (await client.get("/v1/tools", params={"format": "anthropic"})).json()
        assert {"name", "description", "input_schema"} <= set(anthropic[0])
        assert (await client.get("/healthz")).json() == {"status": "ok", "process": os.getpid()}
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200


async def test_storage_gone_is_503_with_retry_after(postgres_url: str, tmp_path: Path) -> None:
    import psycopg

    from tests.conftest import POSTGRES_ADMIN

    async with api(postgres_url, tmp_path) as (client, _):
        assert (await client.get("/readyz")).status_code == 200
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{postgres_url.rsplit("/", 1)[1]}" WITH (FORCE)')
        for response in (
            await client.get("/readyz"),
            await client.post("/v1/tasks", json=PLAN),
            await client.get("/v1/tasks"),
        ):
            assert response.status_code == 503
            assert response.headers["retry-after"] == "2"
            assert response.json()["code"] == "storage_unavailable"


async def test_submits_beyond_the_queue_limit_get_429(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path, max_queued_steps=3) as (client, c):
        for _ in range(2):
            assert (
                await client.post("/v1/tasks", json={"steps": [PLAN["steps"][0]]})
            ).status_code == 202
        assert await c.admission.refresh_queue_depth() == 2
        refused = await client.post("/v1/tasks", json=PLAN)  # 2 queued + 2 more > 3
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["code"] == "overloaded"
        assert len((await client.get("/v1/tasks")).json()["tasks"]) == 2  # nothing stored
        await work_off(c)
        assert await c.admission.refresh_queue_depth() == 0
        assert (await client.post("/v1/tasks", json=PLAN)).status_code == 202  # recovered


async def test_a_connection_lost_mid_transaction_surfaces_as_the_lost_connection(
    postgres_url: str,
) -> None:
    """Not as PendingRollbackError from the cleanup, which the API would answer with a 500."""
    import psycopg
    import sqlalchemy as sa
    from sqlalchemy.exc import OperationalError

    from agent_reach_controller.storage.engine import Database
    from tests.conftest import POSTGRES_ADMIN

    async def lose_the_connection_mid_transaction() -> None:
        async with db.transaction() as conn:
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
            with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await conn.execute(sa.text("SELECT 1"))

    db = Database(postgres_url)
    try:
        with pytest.raises(OperationalError):
            await lose_the_connection_mid_transaction()
    finally:
        await db.close()


async def test_the_queue_limit_holds_between_refreshes(sqlite_url: str, tmp_path: Path) -> None:
    """Accepted submits count at once: a burst cannot slip in before the next refresh."""
    twenty = {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(20)]}
    async with api(sqlite_url, tmp_path, max_queued_steps=100) as (client, c):
        answers = [(await client.post("/v1/tasks", json=twenty)).status_code for _ in range(10)]
        assert answers == [202] * 5 + [429] * 5
        assert await c.admission.refresh_queue_depth() == 100
        # An idempotent replay adds nothing, so it reserves nothing either.
        await work_off(c, rounds=20)
        await c.admission.refresh_queue_depth()
        keyed = {"Idempotency-Key": "once"}
        for _ in range(3):
            assert (await client.post("/v1/tasks", json=twenty, headers=keyed)).status_code == 202
        assert c.admission.queue_depth == 20


async def test_a_refresh_counts_submits_still_in_their_transaction(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The count a refresh reads cannot see an uncommitted submit; it must not forget it."""
    async with components_for(sqlite_url, write_tools(tmp_path)) as c:
        with c.admission.admit(20, limit=30) as admitted:  # admitted, not committed yet
            assert await c.admission.refresh_queue_depth() == 20
            with pytest.raises(QueueFullError), c.admission.admit(20, limit=30):
                pass
            admitted.keep = False
        assert c.admission.queue_depth == 0
        assert await c.admission.refresh_queue_depth() == 0


async def test_the_queue_limit_holds_while_refreshes_race_submits(
    postgres_url: str, tmp_path: Path
) -> None:
    twenty = {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(20)]}
    async with api(postgres_url, tmp_path, max_queued_steps=100) as (client, c):
        done = asyncio.Event()

        async def refresh_all_along() -> None:
            while not done.is_set():
                await c.admission.refresh_queue_depth()
                await asyncio.sleep(0)

        refresher = asyncio.create_task(refresh_all_along())
        try:
            answers = await asyncio.gather(
                *(client.post("/v1/tasks", json=twenty) for _ in range(30))
            )
        finally:
            done.set()
            await refresher
        accepted = sum(a.status_code == 202 for a in answers)
        assert {a.status_code for a in answers} == {202, 429}
        assert 1 <= accepted <= 5, accepted
        assert await c.admission.refresh_queue_depth() == 20 * accepted <= 100
