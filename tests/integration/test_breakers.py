"""A breaker shared by replicas stops dispatch to a failing tool, probes it, and closes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.services.intake import SubmitInput
from tests.integration.stack import TOOLS, api_client, components_for, failed, ok, write_tools

FLAKY = {
    "name": "flaky.call",
    "description": "A downstream that falls over.",
    "connector": "echo",
    "retry": {"maximum_attempts": 1},
    "idempotent": True,
    "breaker": {
        "failure_rate": 0.5,
        "minimum_calls": 2,
        "window": "60s",
        # Long enough that the claims right after it opens all fall inside it on a busy machine.
        "cooldown": "2s",
        "probes": 1,
    },
}


def plan(n: int) -> dict:
    steps = [{"step_id": f"f{i}", "tool": "flaky.call", "args": {}} for i in range(n)]
    return {"steps": [*steps, {"step_id": "other", "tool": "echo.say", "args": {}}]}


async def test_open_breaker_defers_probes_and_closes(database_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, FLAKY])
    async with components_for(database_url, tools) as c:
        body = plan(6)
        await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
        first = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=2)
        flaky = [s for s in first if s.tool == "flaky.call"]
        assert len(flaky) == 2
        opened = time.monotonic()  # the breaker opens after this, in the report below
        await c.reporting.report(
            executor_id="x",
            results=[failed(s, "downstream_unavailable", retryable=True) for s in flaky],
        )
        assert (await c.tool_health.breaker_states())["flaky.call"]["state"] == "open"
        # Open: the other tool still runs, the flaky one waits (deferred, not failed).
        during = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert [s.tool for s in during] == ["echo.say"]
        # Nothing more until the cooldown has passed; then one probe.
        while not (leased := await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)):
            assert time.monotonic() - opened < 20, "no probe after the cooldown"
            await asyncio.sleep(0.05)
        assert time.monotonic() - opened >= 2.0
        [probe] = leased
        assert probe.tool == "flaky.call"
        assert (await c.tool_health.breaker_states())["flaky.call"]["state"] == "half_open"
        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10) == []
        await c.reporting.report(executor_id="x", results=[ok(probe, {})])
        assert (await c.tool_health.breaker_states())["flaky.call"]["state"] == "closed"
        rest = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert len([s for s in rest if s.tool == "flaky.call"]) == 6 - 2 - 1


async def test_breakers_are_visible_through_the_api(sqlite_url: str, tmp_path: Path) -> None:

    async with (
        components_for(sqlite_url, write_tools(tmp_path, [*TOOLS, FLAKY])) as c,
        api_client(c) as client,
    ):
        shown = (await client.get("/v1/tools/breakers")).json()
    assert shown == {
        "breakers": {
            "flaky.call": {"state": "closed", "calls": 0, "failures": 0, "opened_at": None}
        }
    }


FAIL_FAST = {
    **FLAKY,
    "name": "flaky.fast",
    "breaker": {**FLAKY["breaker"], "cooldown": "60s", "while_open": "fail_fast"},
}


async def test_an_open_fail_fast_breaker_ends_queued_steps_or_sends_them_to_the_fallback(
    database_url: str, tmp_path: Path
) -> None:
    with_fallback = {**FAIL_FAST, "name": "flaky.routed", "fallback": "echo.say"}
    tools = write_tools(tmp_path, [*TOOLS, FAIL_FAST, with_fallback])
    async with components_for(database_url, tools) as c:
        steps = [
            {"step_id": f"{tool}-{i}", "tool": f"flaky.{tool}", "args": {}}
            for i in range(3)
            for tool in ("fast", "routed")
        ]
        body = {"steps": steps}
        done = await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
        first = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=4)
        assert sorted(s.step_id for s in first) == ["fast-0", "fast-1", "routed-0", "routed-1"]
        await c.reporting.report(
            executor_id="x",
            results=[failed(s, "downstream_unavailable", retryable=True) for s in first],
        )
        shown = await c.tool_health.breaker_states()
        assert shown["flaky.fast"]["state"] == shown["flaky.routed"]["state"] == "open"
        # The report that opened them already ended what was queued: nothing waits for 60 s.
        view = await c.queries.get(done.task_id)
        assert view is not None
        by_id = {s.step_id: s for s in view.steps}
        fast = by_id["fast-2"]
        assert fast.status.value == "failed"
        assert fast.error == {
            "code": "circuit_open",
            "message": "flaky.fast was not called: its downstream has been failing and its "
            "circuit breaker is open",
            "retryable": False,
        }
        routed = by_id["routed-2"]
        assert (routed.status.value, routed.tool, routed.fallback_from) == (
            "ready",
            "echo.say",
            "flaky.routed",
        )
        assert await c.expiry.fail_fast_open() == 0  # nothing left to end
