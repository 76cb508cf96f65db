"""Behind a pooler in transaction mode a prepared statement may be sent to a server session that
never saw it: `db_prepare=False` must leave nothing prepared on the controller's connections,
however often a statement repeats, and the whole path must still work."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from tests.integration.stack import components_for, ok, write_tools

BODY = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}
ROUNDS = 8  # psycopg prepares a statement on its own from its 5th run on a connection


async def _run_tasks(c: Components) -> None:
    plan = parse_plan(BODY, c.catalog)
    for _ in range(ROUNDS):
        submitted = await c.intake.submit(SubmitInput(plan=plan, request=BODY))
        claimed = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        assert [s.task_id for s in claimed] == [submitted.task_id]
        acks = await c.reporting.report(executor_id="x", results=[ok(claimed[0], {})])
        assert all(a.accepted for a in acks)
        assert (await c.queries.get(submitted.task_id)).task.status == "succeeded"


async def _prepared_here(c: Components) -> int:
    # One connection at a time here, so the transactions above and this one share it.
    async with c.db.transaction() as conn:
        count = await conn.scalar(sa.text("SELECT count(*) FROM pg_prepared_statements"))
    return int(count or 0)


@pytest.mark.parametrize("prepare", [True, False])
async def test_nothing_is_prepared_when_preparation_is_off(
    postgres_url: str, tmp_path: Path, prepare: bool
) -> None:
    async with components_for(
        postgres_url, write_tools(tmp_path), db_prepare=prepare, db_pool_size=1
    ) as c:
        await _run_tasks(c)
        prepared = await _prepared_here(c)
    if prepare:
        assert prepared > 0
    else:
        assert prepared == 0
