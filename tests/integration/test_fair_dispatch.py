"""Dispatch order: priority first, then submitters take turns, each oldest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.stack import components_for, submit, write_tools


def echo(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"step_id": f"{prefix}{i}", "tool": "echo.say", "args": {}} for i in range(n)]


async def test_one_submitters_burst_does_not_starve_anothers_single_step(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await submit(c, {"steps": echo("a", 300)}, tenant="tenant-a")
        await submit(c, {"steps": echo("b", 1)}, tenant="tenant-b")
        await submit(c, {"steps": echo("c", 2)}, tenant="tenant-c")
        first = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=6)
        assert [s.step_id for s in sorted(first, key=lambda s: s.id)] == [
            "a0",
            "a1",
            "a2",
            "b0",
            "c0",
            "c1",
        ]
        # Only tenant-a is left: its steps keep their order.
        rest = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        assert sorted(s.step_id for s in rest) == ["a3", "a4", "a5", "a6", "a7"]


async def test_higher_priority_runs_first_and_a_step_may_set_its_own(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await submit(c, {"steps": echo("low", 5), "priority": -5}, tenant="ops")
        await submit(c, {"steps": echo("mid", 3)}, tenant="ops")
        urgent = [
            *echo("hi", 2),
            {"step_id": "top", "tool": "echo.say", "args": {}, "priority": 99},
        ]
        await submit(c, {"steps": urgent, "priority": 10}, tenant="ops")
        order = []
        while batch := await c.leasing.claim(executor_id="x", connectors=["echo"], limit=2):
            order += sorted(batch, key=lambda s: (-s.priority, s.id))
        assert [s.step_id for s in order] == [
            "top",
            "hi0",
            "hi1",
            "mid0",
            "mid1",
            "mid2",
            "low0",
            "low1",
            "low2",
            "low3",
            "low4",
        ]
