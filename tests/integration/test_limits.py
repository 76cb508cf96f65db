"""Each limit at its boundary through the HTTP API: one under and exactly at pass, one over is
refused with its own status, code and JSON pointer. (Callers in flight and the queue limit have
their boundary tests in test_auth.py and test_api.py.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_controller.planning.limits import DEFAULT_LIMITS
from tests.integration.stack import api_client, components_for, post_task, write_tools

BODY_LIMIT = 4096
LIMITS = DEFAULT_LIMITS


@pytest.fixture
async def client(sqlite_url: str, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, api_client(c) as http:
        yield http


async def test_the_body_limit_admits_its_size_and_refuses_one_byte_more(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with (
        components_for(sqlite_url, tools, max_body_bytes=BODY_LIMIT) as c,
        api_client(c) as http,
    ):
        for size in (BODY_LIMIT - 1, BODY_LIMIT):
            await post_task(http, padded(size))
        assert_refused(await post_task(http, padded(BODY_LIMIT + 1), expect=413), None)


def padded(size: int) -> bytes:
    """A valid one-step plan of exactly `size` bytes (JSON allows trailing whitespace)."""
    body = json.dumps({"steps": [{"step_id": "s", "tool": "echo.say", "args": {}}]}).encode()
    assert len(body) <= size
    return body + b" " * (size - len(body))


def one_step(args: dict[str, Any]) -> dict[str, Any]:
    return {"steps": [{"step_id": "s", "tool": "echo.say", "args": args}]}


def nested(depth: int) -> dict[str, Any]:
    """Arguments `depth` levels deep (the args object itself is level 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def assert_refused(response: httpx.Response, pointer: str | None) -> None:
    problem = response.json()
    if pointer is None:  # the body itself
        assert problem["code"] == "too_large", problem
    else:  # one problem in the plan, at its place
        assert problem["code"] == "invalid_plan", problem
        assert [(e["pointer"], e["code"]) for e in problem["errors"]] == [(pointer, "too_large")]


@pytest.mark.parametrize(
    ("name", "under", "at", "over", "pointer"),
    [
        (
            "steps per plan",
            *(
                {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(n)]}
                for n in (DEFAULT_LIMITS.max_steps - 1, DEFAULT_LIMITS.max_steps)
            ),
            {
                "steps": [
                    {"step_id": f"s{i}", "tool": "echo.say", "args": {}}
                    for i in range(DEFAULT_LIMITS.max_steps + 1)
                ]
            },
            "/steps",
        ),
        (
            "argument depth",
            *(one_step(nested(d)) for d in (LIMITS.max_depth - 1, LIMITS.max_depth)),
            one_step(nested(LIMITS.max_depth + 1)),
            "/steps/0/args" + "/a" * DEFAULT_LIMITS.max_depth,
        ),
        (
            "string length",
            *(
                one_step({"text": "é" * n})
                for n in (DEFAULT_LIMITS.max_string_length - 1, DEFAULT_LIMITS.max_string_length)
            ),
            one_step({"text": "é" * (DEFAULT_LIMITS.max_string_length + 1)}),
            "/steps/0/args/text",
        ),
    ],
    ids=["steps per plan", "argument depth", "string length"],
)
async def test_a_limit_admits_its_boundary_and_refuses_one_more(
    client: httpx.AsyncClient,
    name: str,
    under: Any,
    at: Any,
    over: Any,
    pointer: str,
) -> None:
    for body in (under, at):
        await post_task(client, body)
    assert_refused(await post_task(client, over, expect=422), pointer)
