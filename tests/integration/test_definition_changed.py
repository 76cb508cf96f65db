"""Rug-pull defence: when a connector reports that a remote tool's definition is no longer the one
approved, the controller disables the tool until someone enables it again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from agent_reach.errors import DEFINITION_CHANGED
from agent_reach_controller.runtime import Components
from tests.integration.stack import api_client, components_for, failed, write_tools

REMOTE = {
    "name": "remote.add",
    "description": "Adds, on a remote MCP server.",
    "connector": "echo",
    "input_schema": {"type": "object"},
}


async def run_once(c: Components, message: str) -> None:
    [step] = await c.leasing.poll(executor_id="t", connectors=["echo"], limit=1, wait=5)
    result = failed(step, "tool_unavailable", retryable=False)
    assert result.error is not None
    await c.reporting.report(
        executor_id="t", results=[replace(result, error=replace(result.error, message=message))]
    )


async def test_a_changed_definition_disables_the_tool(database_url: str, tmp_path: Path) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path, [REMOTE])) as c,
        api_client(c) as api,
    ):
        body = {"steps": [{"step_id": "a", "tool": "remote.add"}]}
        assert (await api.post("/v1/tasks", json=body)).status_code == 202
        # Another reason for tool_unavailable does not touch the catalogue.
        await run_once(c, "remote.add: the server has no tool 'add'")
        assert (await api.get("/v1/tools/remote.add")).json()["enabled"] is True
        assert (await api.post("/v1/tasks", json=body)).status_code == 202
        await run_once(c, f"remote.add: {DEFINITION_CHANGED} since it was imported (sha256 …)")
        tool = (await api.get("/v1/tools/remote.add")).json()
        assert tool["enabled"] is False
        history = (await api.get("/v1/tools/remote.add/versions")).json()
        newest = history["changes"][0]
        assert newest["action"] == "disable"
        assert newest["principal"] == "agent-reach (remote definition changed)"
        refused = await api.post("/v1/tasks", json=body)
        assert refused.status_code == 422  # a disabled tool takes no new steps
