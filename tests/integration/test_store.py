"""The store's compare-and-set itself: a transition read from a stale row writes nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_reach.states import IllegalTransitionError, StepStatus, Transition
from agent_reach_controller.domain.records import StepChange
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.storage import steps
from tests.integration.stack import components_for, write_tools

BODY = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}


def succeed(step, output: object) -> StepChange:
    return StepChange(step=step, transition=Transition.SUCCEED, values={"output": output})


async def test_stale_row_changes_nothing(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        submitted = await c.intake.submit(
            SubmitInput(plan=parse_plan(BODY, c.catalog), request=BODY)
        )
        view = await c.queries.get(submitted.task_id)
        [leased] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
        now = datetime.now(UTC)
        async with c.db.transaction() as conn:
            assert await steps.change_steps(conn, [succeed(leased, {"n": 1})], now=now) == {
                leased.id
            }
        async with c.db.transaction() as conn:
            # `leased` still says running/attempt 1, but the row has moved on to succeeded.
            assert await steps.change_steps(conn, [succeed(leased, {"n": 2})], now=now) == set()
        final = (await c.queries.get(view.task.task_id)).steps[0]
        assert final.status is StepStatus.SUCCEEDED
        assert final.output == {"n": 1}
        kinds = [e.kind for e in await c.queries.events(view.task.task_id) if e.step_id == "a"]
        assert kinds.count("succeed") == 1


async def test_illegal_transition_is_refused_before_sql(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        submitted = await c.intake.submit(
            SubmitInput(plan=parse_plan(BODY, c.catalog), request=BODY)
        )
        view = await c.queries.get(submitted.task_id)
        ready = view.steps[0]
        async with c.db.transaction() as conn:
            with pytest.raises(IllegalTransitionError):
                await steps.change_steps(conn, [succeed(ready, {})], now=datetime.now(UTC))


async def test_concurrent_transitions_of_one_row_have_one_winner(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
    ):
        await one.intake.submit(SubmitInput(plan=parse_plan(BODY, one.catalog), request=BODY))
        [leased] = await one.leasing.claim(executor_id="x", connectors=["echo"], limit=1)

        async def attempt(c, output: int) -> set[int]:
            async with c.db.transaction() as conn:
                return await steps.change_steps(
                    conn, [succeed(leased, output)], now=datetime.now(UTC)
                )

        outcomes = await asyncio.gather(*(attempt(c, i) for i, c in enumerate([one, two] * 4)))
        assert sorted(len(o) for o in outcomes) == [0] * 7 + [1]


async def test_a_claim_never_leases_more_than_its_limit(database_url: str, tmp_path: Path) -> None:
    many = {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(50)]}
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await c.intake.submit(SubmitInput(plan=parse_plan(many, c.catalog), request=many))
        for limit in (1, 2, 7):
            claimed = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=limit)
            assert len(claimed) == limit
