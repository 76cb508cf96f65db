"""A Postgres transaction's commit-time writes and guards are one statement, sent with COMMIT.

What that must keep: a guard that fails writes nothing of its transaction (the refusal comes back
as the guard's own error), and each part keeps its own parameters. (What a task costs in
transactions is counted in `test_commits.py`.)
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.storage.catalog import CatalogChangedError
from agent_reach_controller.storage.commit import CommitStatement, compose
from agent_reach_controller.storage.engine import driver, libpq_conninfo
from tests.integration.stack import components_for, write_tools

BODY = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}


def _count(url: str, sql: str) -> int:
    with psycopg.connect(libpq_conninfo(url)) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


async def test_a_failed_guard_writes_nothing_and_raises_its_own_error(
    postgres_url: str, tmp_path: Path
) -> None:
    async with components_for(postgres_url, write_tools(tmp_path)) as c:
        plan = parse_plan(BODY, c.catalog)
        tables = ("tasks", "steps", "events", "audit_log", "idempotency_keys")
        before = {t: _count(postgres_url, f"SELECT count(*) FROM {t}") for t in tables}
        stale = SubmitInput(
            plan=plan,
            request=BODY,
            idempotency_key="k1",
            catalog_revision=c.registry.revision - 1,
        )
        with pytest.raises(CatalogChangedError):
            await c.intake.submit(stale)
        after = {t: _count(postgres_url, f"SELECT count(*) FROM {t}") for t in tables}
        assert after == before
        # The key was never held: the same submit against the current catalogue takes it.
        fresh = await c.intake.submit(
            SubmitInput(plan=plan, request=BODY, idempotency_key="k1", catalog_revision=None)
        )
        assert fresh.created
        assert _count(postgres_url, "SELECT count(*) FROM idempotency_keys") == 1


async def test_parts_keep_their_own_parameters(postgres_url: str) -> None:
    statement = CommitStatement()
    statement.select("SELECT %(x)s::int AS v", {"x": 1})
    statement.expect(
        "SELECT %(x)s::int AS v", {"x": 2}, holds="bool_and(v = 2)", refusal=CatalogChangedError
    )
    sql = compose((("SELECT %(x)s::int", "count(*)"), ("SELECT %(x)s::int", None)))
    assert "%(p0_x)s" in sql
    assert "%(p1_x)s" in sql
    async with await psycopg.AsyncConnection.connect(libpq_conninfo(postgres_url)) as pg:
        async with pg.pipeline():
            await statement.send(pg, prepare=None)
        failing = CommitStatement()
        failing.expect(
            "SELECT %(x)s::int AS v", {"x": 1}, holds="bool_and(v = 2)", refusal=CatalogChangedError
        )
        with pytest.raises(psycopg.Error) as raised:
            async with pg.pipeline():
                await failing.send(pg, prepare=None)
        assert isinstance(failing.refusal(raised.value), CatalogChangedError)


async def test_a_unit_of_one_statement_leaves_its_connection_transactional(
    postgres_url: str, tmp_path: Path
) -> None:
    """A submit is one statement, sent alone in autocommit mode (no BEGIN, no COMMIT). Whether
    it commits or is refused, the connection goes back to the pool out of autocommit: the next
    unit of several statements on it is still all or nothing."""
    async with components_for(postgres_url, write_tools(tmp_path), db_pool_size=1) as c:
        plan = parse_plan(BODY, c.catalog)
        await c.intake.submit(SubmitInput(plan=plan, request=BODY))
        with pytest.raises(CatalogChangedError):
            await c.intake.submit(
                SubmitInput(plan=plan, request=BODY, catalog_revision=c.registry.revision - 1)
            )
        before = _count(postgres_url, "SELECT count(*) FROM tasks")

        class Abandon(Exception):
            pass

        async def delete_then_fail() -> None:
            async with c.db.transaction() as conn:
                pg = await driver(conn)
                assert not pg.autocommit
                await pg.execute("DELETE FROM tasks")
                raise Abandon

        with pytest.raises(Abandon):
            await delete_then_fail()
        assert _count(postgres_url, "SELECT count(*) FROM tasks") == before == 1
