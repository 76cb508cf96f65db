"""A tool's concurrency cap holds across replicas and frees up as steps finish or expire."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.services.intake import SubmitInput
from tests.integration.stack import TOOLS, components_for, ok, write_tools

CAPPED = {
    "name": "bank.transfer",
    "description": "At most two at once.",
    "connector": "echo",
    "concurrency": 2,
    "idempotent": True,
}


def body(n: int) -> dict:
    steps = [{"step_id": f"t{i}", "tool": "bank.transfer", "args": {}} for i in range(n)]
    return {"steps": [*steps, {"step_id": "free", "tool": "echo.say", "args": {}}]}


async def test_cap_holds_and_frees(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, CAPPED])) as c:
        plan = body(6)
        await c.intake.submit(SubmitInput(plan=parse_plan(plan, c.catalog), request=plan))
        first = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert sorted(s.tool for s in first) == ["bank.transfer", "bank.transfer", "echo.say"]
        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10) == []
        done = next(s for s in first if s.tool == "bank.transfer")
        await c.reporting.report(executor_id="x", results=[ok(done, {})])
        again = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert [s.tool for s in again] == ["bank.transfer"]


async def test_cap_holds_across_two_controllers(postgres_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, CAPPED])
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
    ):
        plan = body(40)
        await one.intake.submit(SubmitInput(plan=parse_plan(plan, one.catalog), request=plan))
        claims = await asyncio.gather(
            *(
                c.leasing.claim(executor_id=f"x{i}", connectors=["echo"], limit=5)
                for i, c in enumerate([one, two] * 6)
            )
        )
        capped = [s for batch in claims for s in batch if s.tool == "bank.transfer"]
        assert len(capped) == 2


PER_ACCOUNT = {
    "name": "acct.write",
    "description": "One write at a time per account.",
    "connector": "echo",
    "concurrency_per_key": {"limit": 1, "key": "args.account"},
}


async def test_a_key_at_its_cap_waits_while_other_keys_run(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, PER_ACCOUNT])) as c:
        body = {
            "steps": [
                {"step_id": f"{who}{i}", "tool": "acct.write", "args": {"account": who}}
                for who in ("a", "b")
                for i in range(3)
            ]
            + [{"step_id": "free", "tool": "echo.say", "args": {}}]
        }
        await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
        first = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert sorted(s.step_id for s in first) == ["a0", "b0", "free"]
        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10) == []
        a0 = next(s for s in first if s.step_id == "a0")
        await c.reporting.report(executor_id="x", results=[ok(a0, {})])
        [after] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert after.step_id == "a1"
