"""Bad input at the REST edge: a body not declared JSON (415); CEL naming what it may not."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from agent_reach_controller.runtime import Components
from tests.integration.stack import api_client, components_for, write_tools

PLAN = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}}]}
BODY = json.dumps(PLAN).encode()


@contextlib.asynccontextmanager
async def api(url: str, tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Components]]:
    async with components_for(url, write_tools(tmp_path)) as c, api_client(c) as client:
        yield client, c


def assert_unsupported(response: httpx.Response, got: str) -> None:
    assert response.status_code == 415, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert {k: problem[k] for k in ("type", "title", "status", "code")} == {
        "type": "urn:agent-reach:problem:unsupported_media_type",
        "title": "Unsupported Media Type",
        "status": 415,
        "code": "unsupported_media_type",
    }
    assert got in problem["detail"]
    assert "application/json" in problem["detail"]


@pytest.mark.parametrize(
    ("content_type", "got"),
    [
        ("text/plain", "'text/plain'"),
        ("text/plain; charset=utf-8", "'text/plain; charset=utf-8'"),
        ("application/x-www-form-urlencoded", "'application/x-www-form-urlencoded'"),  # curl -d
        ("application/xml", "'application/xml'"),
        (None, "no Content-Type"),
    ],
)
async def test_a_plan_not_sent_as_json_is_415_and_nothing_is_stored(
    sqlite_url: str, tmp_path: Path, content_type: str | None, got: str
) -> None:
    async with api(sqlite_url, tmp_path) as (client, c):
        headers = {"content-type": content_type} if content_type else {}
        response = await client.post("/v1/tasks", content=BODY, headers=headers)
        assert_unsupported(response, got)
        assert await c.queries.list_tasks(tenant="default") == []


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.agent-reach.plan+json",
    ],
)
async def test_json_and_json_suffixed_media_types_are_accepted(
    sqlite_url: str, tmp_path: Path, content_type: str
) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post(
            "/v1/tasks", content=BODY, headers={"content-type": content_type}
        )
        assert response.status_code == 202, response.text


async def test_an_empty_body_is_left_to_the_route(sqlite_url: str, tmp_path: Path) -> None:
    """No body, no media type to check: the submit route says the body is not JSON (400)."""
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post("/v1/tasks")
        assert response.status_code == 400
        assert response.json()["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/steps/a/resolve", {"action": "failed"}),
        ("/steps/a/approval", {"decision": "approve"}),
        ("/usage", {"input_tokens": 1, "output_tokens": 1}),
    ],
)
async def test_every_json_body_route_of_a_task_refuses_other_media_types(
    sqlite_url: str, tmp_path: Path, path: str, body: dict[str, object]
) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        task_id = (await client.post("/v1/tasks", json=PLAN)).json()["task_id"]
        response = await client.post(  # was a 422 "Input should be a valid dictionary"
            f"/v1/tasks/{task_id}{path}",
            content=json.dumps(body),
            headers={"content-type": "text/plain"},
        )
        assert_unsupported(response, "'text/plain'")


async def test_the_415_is_documented(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        spec = (await client.get("/openapi.json")).json()
        submit = spec["paths"]["/v1/tasks"]["post"]
        assert "application/problem+json" in submit["responses"]["415"]["content"]


# --- CEL naming what its site does not declare ---------------------------------------------------


@pytest.mark.parametrize(
    ("when", "phrase"),
    [
        ("foo.bar == 1", "uses undeclared variable 'foo'"),
        ("steps.a.output.text == bar", "uses undeclared variable 'bar'"),
        ("nosuchfn(steps.a.output)", "calls unknown function 'nosuchfn'"),
    ],
)
async def test_a_condition_naming_an_undeclared_name_is_refused_at_submit(
    sqlite_url: str, tmp_path: Path, when: str, phrase: str
) -> None:
    plan = {
        "steps": [
            *PLAN["steps"],
            {"step_id": "b", "tool": "echo.say", "depends_on": ["a"], "when": when},
        ]
    }
    async with api(sqlite_url, tmp_path) as (client, c):
        response = await client.post("/v1/tasks", json=plan)
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["code"] == "invalid_plan"
        [error] = problem["errors"]
        assert (error["pointer"], error["code"]) == ("/steps/1/when", "invalid_condition")
        assert phrase in error["detail"]
        assert await c.queries.list_tasks(tenant="default") == []


async def test_a_macro_variable_and_words_in_strings_are_no_undeclared_names(
    sqlite_url: str, tmp_path: Path
) -> None:
    when = "['x', 'y'].exists(w, w == steps.a.output.text) || 'foo.bar' == context.mode"
    plan = {
        "steps": [
            *PLAN["steps"],
            {"step_id": "b", "tool": "echo.say", "depends_on": ["a"], "when": when},
        ]
    }
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post("/v1/tasks", json=plan)
        assert response.status_code == 202, response.text


async def test_a_tool_whose_key_reads_anything_but_args_is_refused_when_created(
    sqlite_url: str, tmp_path: Path
) -> None:
    tool = {
        "name": "crm.update",
        "description": "Update a customer.",
        "connector": "echo",
        "rate_limit": {"rate": "5/s", "key": "customer.id"},
    }
    async with api(sqlite_url, tmp_path) as (client, _):
        response = await client.post("/v1/tools", json=tool)
        assert response.status_code == 422, response.text
        [error] = response.json()["errors"]
        assert error["pointer"] == "/body/rate_limit/key"
        assert "key uses undeclared variable 'customer'" in error["detail"]
        tool["rate_limit"] = {"rate": "5/s", "key": "args.customer.id"}
        assert (await client.post("/v1/tools", json=tool)).status_code == 201
