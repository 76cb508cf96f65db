"""A newer release's expand migration (a column added) under a controller still running the older
code: its prepared statements keep working. Statements that read `*` would have their result
grow under them, and Postgres refuses to run such a plan again ("cached plan must not change
result type") in every process of the rollout until it restarts."""

from __future__ import annotations

from pathlib import Path

import psycopg

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from tests.integration.stack import components_for, ok, write_tools

TABLES = ("tasks", "steps", "events", "audit_log", "executor_sessions", "idempotency_keys")


async def _one_task(c: Components, n: int) -> str:
    body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {"n": n}}]}
    done = await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
    [step] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
    await c.reporting.report(executor_id="x", results=[ok(step, {"n": n})])
    return done.task_id


async def test_prepared_statements_survive_a_column_added_mid_run(
    postgres_url: str, tmp_path: Path
) -> None:
    # One pooled connection: the statements it prepared before the migration are the ones reused.
    async with components_for(postgres_url, write_tools(tmp_path), db_pool_size=1) as c:
        before = [await _one_task(c, n) for n in range(6)]
        with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as admin:
            existing = {
                name
                for (name,) in admin.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                )
            }
            for table in TABLES:
                if table in existing:
                    admin.execute(f"ALTER TABLE {table} ADD COLUMN rollout_probe text")
        after = [await _one_task(c, n) for n in range(6, 9)]
        for task_id in [*before, *after]:
            view = await c.queries.get(task_id)
            assert view.task.status == "succeeded", task_id
