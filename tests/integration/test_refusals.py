"""What a replica answers when it does not serve a request (stopping, not started yet) or finds
nothing by that name outside /v1 routes' own lookups: each a problem from the one error table,
with its status, code and title, and the Retry-After that tells the caller when to come back."""

from __future__ import annotations

from pathlib import Path

import httpx

from agent_reach.errors import ERROR_KINDS, PROBLEM_KINDS, ErrorCode, ProblemCode, problem_kind
from agent_reach_controller.api.problems import PROBLEM_MEDIA_TYPE
from tests.integration.stack import api_client, components_for, write_tools

MCP = {"accept": "application/json, text/event-stream"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}


def assert_problem(
    answer: httpx.Response, code: str, *, title: str | None = None, retry_after: str | None = None
) -> None:
    """The answer is the problem the table gives `code` (its own title when the row has one)."""
    kind = problem_kind(code)
    assert kind is not None
    assert answer.status_code == kind.http_status, answer.text
    assert answer.headers["content-type"] == PROBLEM_MEDIA_TYPE
    body = answer.json()
    assert (body["code"], body["status"]) == (code, kind.http_status)
    assert body["title"] == (title or kind.title)
    assert body["detail"]
    assert answer.headers.get("retry-after") == retry_after


async def test_readyz_of_a_stopping_replica_says_shutting_down(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as client:
        assert (await client.get("/readyz")).status_code == 200
        c.stopping = True
        assert_problem(await client.get("/readyz"), "shutting_down", retry_after="2")
        assert PROBLEM_KINDS[ProblemCode.SHUTTING_DOWN].retryable


async def test_the_mcp_gateway_refuses_from_the_table(sqlite_url: str, tmp_path: Path) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as client:
        anonymous = await client.post("/mcp", json=INITIALIZE, headers={**MCP, "Authorization": ""})
        assert_problem(anonymous, "unauthenticated")
        assert anonymous.headers["www-authenticate"] == "Bearer"
        # The gateway serves only inside `McpGateway.running()`, which the server enters.
        not_yet = await client.post("/mcp", json=INITIALIZE, headers=MCP)
        assert_problem(not_yet, "not_started", retry_after="1")
        c.stopping = True
        stopping = await client.post("/mcp", json=INITIALIZE, headers=MCP)
        assert_problem(stopping, "shutting_down", retry_after="1")


async def test_no_such_pool_nor_executor_token_is_a_404_with_its_own_title(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as client:
        token = await client.delete("/v1/executor-tokens/nope")
        assert_problem(token, "not_found", title="No such executor token")
        assert "'nope'" in token.json()["detail"]
        pool = await client.get("/metrics/pools/nobody")
        assert_problem(pool, "not_found", title="No such pool")
        assert "'nobody'" in pool.json()["detail"]
        assert ERROR_KINDS[ErrorCode.NOT_FOUND].http_status == 404
