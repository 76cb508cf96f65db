"""A running controller runs every background duty as its own sweep task."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_reach_controller.runtime import sweeps_of
from agent_reach_controller.server import running_controller
from agent_reach_controller.settings import ControllerSettings
from tests.integration.stack import write_tools


async def test_every_background_duty_is_its_own_sweep(sqlite_url: str, tmp_path: Path) -> None:
    settings = ControllerSettings(
        database_url=sqlite_url,
        tools=[write_tools(tmp_path)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
    )
    async with running_controller(settings) as (c, _):
        names = [s.name for s in sweeps_of(c)]
        assert len(names) == len(set(names))
        assert {"executor_sessions", "expired_leases", "audit_seal", "task_deadlines"} <= set(names)
        running = {t.get_name() for t in asyncio.all_tasks()}
        assert {f"sweep-{n}" for n in names} <= running
