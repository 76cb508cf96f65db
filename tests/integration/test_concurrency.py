"""Two controllers on one Postgres: no step leased twice; one task per Idempotency-Key."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.services.intake import IdempotencyConflictError, SubmitInput
from tests.integration.stack import components_for, ok, write_tools


async def test_two_controllers_never_lease_a_step_twice(postgres_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path)
    body = {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(300)]}
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
    ):
        plan = parse_plan(body, one.catalog)
        for _ in range(4):
            await one.intake.submit(SubmitInput(plan=plan, request=body))
        leased: list[tuple[int, int]] = []

        async def drain(c, name: str) -> None:
            while True:
                claimed = await c.leasing.claim(executor_id=name, connectors=["echo"], limit=25)
                if not claimed:
                    return
                leased.extend((s.id, s.attempt) for s in claimed)
                acks = await c.reporting.report(
                    executor_id=name, results=[ok(s, {}) for s in claimed]
                )
                assert all(a.accepted for a in acks)

        await asyncio.gather(
            *(drain(c, f"{n}-{i}") for i in range(3) for n, c in (("a", one), ("b", two)))
        )
        assert len(leased) == 1200
        assert len(set(leased)) == 1200
        statuses = {t.status for t in await one.queries.list_tasks(limit=10)}
        assert statuses == {"succeeded"}


async def test_concurrent_submits_with_one_key_make_one_task(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    body = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
    ):
        plan = parse_plan(body, one.catalog)

        async def attempt(c):
            submitted = await c.intake.submit(
                SubmitInput(plan=plan, request=body, idempotency_key="same")
            )
            return submitted.task_id

        ids = await asyncio.gather(*(attempt(c) for c in (one, two) * 5), return_exceptions=True)
        assert not [i for i in ids if isinstance(i, IdempotencyConflictError)]
        assert len({i for i in ids if isinstance(i, str)}) == 1
        assert len(await one.queries.list_tasks()) == 1
