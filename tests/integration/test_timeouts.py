"""schedule_to_start, per-step timeout overrides, and the heartbeat timeout on the wire."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agent_reach_controller.rpc.convert import assignment_to_proto
from agent_reach_controller.runtime import Components
from tests.integration.stack import TOOLS, components_for, submit, write_tools

NOBODY_RUNS = {
    "name": "gpu.render",
    "description": "Needs an executor that may never come.",
    "connector": "gpu",
    "schedule_to_start": "1s",
    "fallback": "echo.say",
}
LONG = {
    "name": "batch.export",
    "description": "A long call that reports progress.",
    "connector": "echo",
    "timeout": "1h",
    "heartbeat": "15s",
}


async def sweep_until(c: Components, expected: int, *, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    swept = 0
    while swept < expected:
        assert time.monotonic() < deadline, f"swept {swept} of {expected} steps"
        swept += await c.expiry.expire_unstarted()
        await asyncio.sleep(0.02)


async def test_a_step_no_executor_takes_goes_to_its_fallback_or_fails(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, NOBODY_RUNS])
    async with components_for(database_url, tools) as c:
        render_or_quick = [
            {"step_id": "render", "tool": "gpu.render", "args": {}},
            # The step's own, shorter limit on a tool that has none.
            {
                "step_id": "quick",
                "tool": "echo.say",
                "args": {},
                "timeouts": {"schedule_to_start": "500ms"},
            },
        ]
        task_id = await submit(c, {"steps": render_or_quick})
        assert await c.expiry.expire_unstarted() == 0  # nothing is late yet
        await sweep_until(c, 2, within=10.0)
        view = await c.queries.get(task_id)
        assert view is not None
        steps = {s.step_id: s for s in view.steps}
        quick = steps["quick"]
        assert quick.status.value == "failed"
        assert quick.error is not None
        assert quick.error["message"] == (
            "echo.say was not started within 0.5s of being queued (schedule_to_start): "
            "no executor for connector 'echo' took it"
        )
        # The render step moved to its fallback on another connector, queued again.
        render = steps["render"]
        assert (render.status.value, render.tool, render.connector) == ("ready", "echo.say", "echo")
        assert render.fallback_from == "gpu.render"
        [leased] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        assert leased.step_id == "render"


async def test_the_assignment_carries_the_steps_timeout_and_the_tools_heartbeat(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path, [*TOOLS, LONG])) as c:
        own_or_short = [
            {"step_id": "own", "tool": "batch.export", "args": {}},
            {
                "step_id": "short",
                "tool": "batch.export",
                "args": {},
                "timeouts": {"timeout": "90s", "heartbeat": "5s"},
            },
        ]
        await submit(c, {"steps": own_or_short})
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        sent = {s.step_id: assignment_to_proto(s, c.catalog["batch.export"]) for s in leased}
        assert (sent["own"].timeout_ms, sent["own"].heartbeat_timeout_ms) == (3_600_000, 15_000)
        assert (sent["short"].timeout_ms, sent["short"].heartbeat_timeout_ms) == (90_000, 5_000)
