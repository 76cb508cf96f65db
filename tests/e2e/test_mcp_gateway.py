"""The MCP gateway against the official `mcp` client: a real `reach dev` on 127.0.0.1 serves each
key's permitted tools over Streamable HTTP; every call is a governed, durable, traced task."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agent_reach.ids import new_span_id, new_trace_id
from agent_reach_controller.api.mcp import TESTED_REVISIONS
from tests.e2e.processes import TEST_API_KEY, Proc, api, cluster

pytestmark = pytest.mark.e2e

TOOLS = [
    {
        "name": "echo.say",
        "description": "Echo the arguments back.",
        "connector": "echo",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "idempotent": True,
    },
    {
        "name": "nap.take",
        "description": "Sleeps a while.",
        "connector": "sleep",
        "risk": "write",
        "input_schema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
    },
    {
        "name": "vault.wipe",
        "description": "Wipes a vault.",
        "connector": "echo",
        "risk": "dangerous",
        "input_schema": {"type": "object", "properties": {"vault": {"type": "string"}}},
    },
]
# The connect modes of the client: the initialize handshake, and the stateless envelope.
MODES = {"2025-11-25": "legacy", "2026-07-28": "2026-07-28"}


@asynccontextmanager
async def mcp_client(dev: Proc, *, key: str = TEST_API_KEY, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(
            streamable_http_client(f"http://{dev.info['http']}/mcp", http_client=http), mode=mode
        ) as client,
    ):
        yield client


def text_of(result: mcp_types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, mcp_types.TextContent))


@pytest.fixture
def dev(tmp_path: Path) -> Any:
    tools = tmp_path / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    with cluster(tmp_path) as c:
        yield c.dev("dev", tools=tools)


def test_the_revisions_tested_are_the_ones_the_sdk_speaks() -> None:
    from mcp_types.version import KNOWN_PROTOCOL_VERSIONS

    assert set(TESTED_REVISIONS) == set(MODES) <= set(KNOWN_PROTOCOL_VERSIONS)


@pytest.mark.parametrize("revision", TESTED_REVISIONS)
async def test_tools_list_and_calls_over_mcp(dev: Proc, revision: str) -> None:
    async with mcp_client(dev, mode=MODES[revision]) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {"echo.say", "nap.take", "vault.wipe"}
        assert listed["vault.wipe"].annotations is not None
        assert listed["vault.wipe"].annotations.destructive_hint is True
        assert listed["echo.say"].annotations is not None
        assert listed["echo.say"].annotations.read_only_hint is True

        ok = await client.call_tool("echo.say", {"text": "hello"})
        assert ok.is_error is False
        assert '"hello"' in text_of(ok)
        assert ok.structured_content is not None
        assert ok.structured_content["status"] == "succeeded"
        assert ok.structured_content["receipt"]["status"] == "succeeded"

        # A call the controller refuses is a tool error the model reads, not a protocol error.
        bad = await client.call_tool("echo.say", {"text": 5})
        assert bad.is_error is True
        assert "at /text: 5 is not of type 'string'" in text_of(bad)
        ghost = await client.call_tool("no.such", {})
        assert ghost.is_error is True
        assert "no tool named 'no.such'" in text_of(ghost)


async def test_a_dangerous_call_answers_at_once_that_it_waits_for_approval(dev: Proc) -> None:
    async with mcp_client(dev, mode="legacy") as client:
        waiting = await client.call_tool("vault.wipe", {"vault": "v1"})
    assert waiting.is_error is False
    assert waiting.structured_content is not None
    assert waiting.structured_content["status"] == "awaiting_approval"
    assert "needs approval by one of admin, approver, operator" in text_of(waiting)
    task_id = waiting.structured_content["task_id"]
    with api(dev) as rest:
        approver = rest.post("/v1/keys", json={"name": "ann", "roles": ["approver"]})
        assert approver.status_code == 201, approver.text
        decided = rest.post(
            f"/v1/tasks/{task_id}/steps/call/approval",
            json={"decision": "reject", "reason": "not today"},
            headers={"Authorization": f"Bearer {approver.json()['token']}"},
        )
        assert decided.status_code == 200, decided.text
        replies = rest.get(waiting.structured_content["replies_url"]).json()
    [reply] = replies["replies"]
    assert reply["isError"] is True
    assert "not today" in reply["content"][0]["text"]


async def test_progress_idempotency_and_the_callers_trace(dev: Proc) -> None:
    trace_id, span_id = new_trace_id(), new_span_id()
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    meta: Any = {"idempotency_key": "nap-1", "traceparent": f"00-{trace_id}-{span_id}-01"}
    async with mcp_client(dev, mode="legacy") as client:
        first = await client.call_tool(
            "nap.take", {"seconds": 2}, progress_callback=on_progress, meta=meta
        )
        again = await client.call_tool("nap.take", {"seconds": 2}, meta=meta)
    assert first.is_error is False, text_of(first)
    assert progress, "no progress notification while the call ran"
    assert any(message and "running" in message for _, message in progress), progress
    assert first.structured_content is not None
    assert again.structured_content is not None
    # The same key and arguments: the same task, not a second nap.
    assert again.structured_content["task_id"] == first.structured_content["task_id"]
    assert first.structured_content["trace_id"] == trace_id
    with api(dev) as rest:
        task = rest.get(f"/v1/tasks/{first.structured_content['task_id']}").json()
    assert task["source"] == "mcp"
    assert task["trace_id"] == trace_id


async def test_keys_decide_what_mcp_shows_and_runs(dev: Proc) -> None:
    with api(dev) as rest:
        created = rest.post(
            "/v1/keys", json={"name": "viewer", "roles": ["viewer"], "tenant": "default"}
        )
        assert created.status_code == 201, created.text
        viewer = created.json()["token"]
    async with mcp_client(dev, key=viewer, mode="legacy") as client:
        assert (await client.list_tools()).tools == []
        refused = await client.call_tool("echo.say", {"text": "x"})
    assert refused.is_error is True
    assert "you may not call tool 'echo.say'" in text_of(refused)
    # No key, or a wrong one: the HTTP request is refused before MCP sees it.
    url = f"http://{dev.info['http']}/mcp"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient() as plain:
        answers = [
            await plain.post(url, json=ping, headers=headers)
            for headers in ({}, {"Authorization": "Bearer ark_wrong"})
        ]
    for answer in answers:
        assert answer.status_code == 401
        assert answer.headers["content-type"].startswith("application/problem+json")
        assert json.loads(answer.text)["code"] == "unauthenticated"
