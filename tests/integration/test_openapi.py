"""The OpenAPI document is one a client generator can use: every reference resolves, problems are
one component, operations have readable ids and typed answers, and the submit body describes the
dialects the server reads (the same models validate them)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_controller.api.app import create_app
from agent_reach_controller.planning.dialects import DIALECTS, DialectName
from agent_reach_controller.server import running_controller
from tests.integration.stack import api_client, components_for, listening_settings, write_tools


@pytest.fixture
async def document(sqlite_url: str, tmp_path: Path) -> dict[str, Any]:
    async with (
        components_for(sqlite_url, write_tools(tmp_path)) as c,
        api_client(c) as client,
    ):
        answer = await client.get("/openapi.json")
        assert answer.status_code == 200
        doc: dict[str, Any] = answer.json()
        return doc


def _walk(value: Any) -> list[Any]:
    found = [value]
    if isinstance(value, dict):
        for item in value.values():
            found += _walk(item)
    elif isinstance(value, list):
        for item in value:
            found += _walk(item)
    return found


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_every_reference_resolves(document: dict[str, Any]) -> None:
    components = document["components"]["schemas"]
    refs = {n["$ref"] for n in _walk(document) if isinstance(n, dict) and "$ref" in n}
    assert refs
    assert {r for r in refs if r.removeprefix("#/components/schemas/") not in components} == set()


def test_problems_are_one_component(document: dict[str, Any]) -> None:
    problem_schemas = [
        media["schema"]
        for _, _, op in _operations(document)
        for response in op["responses"].values()
        for kind, media in response.get("content", {}).items()
        if kind == "application/problem+json"
    ]
    assert len(problem_schemas) > 50
    assert all(s == {"$ref": "#/components/schemas/Problem"} for s in problem_schemas)
    errors = document["components"]["schemas"]["Problem"]["properties"]["errors"]
    assert "ProblemItem" in str(errors)


def test_operation_ids_are_unique_and_readable(document: dict[str, Any]) -> None:
    ids = [op["operationId"] for _, _, op in _operations(document)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z][a-z_]*[a-z]", i) for i in ids), ids
    assert {"submit_task", "get_task", "list_tools", "get_turn_replies"} <= set(ids)


def test_every_success_is_typed(document: dict[str, Any]) -> None:
    untyped = [
        (method, path, code, kind)
        for method, path, op in _operations(document)
        for code, response in op["responses"].items()
        if code.startswith("2")
        for kind, media in response.get("content", {}).items()
        if kind != "text/event-stream" and not media.get("schema")
    ]
    assert untyped == []


def test_the_submit_body_is_the_dialects_models(document: dict[str, Any]) -> None:
    submit = document["paths"]["/v1/tasks"]["post"]
    schema = submit["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {
        "oneOf": [{"$ref": f"#/components/schemas/{d.body.__name__}"} for d in DIALECTS.values()]
    }
    dialect = next(p for p in submit["parameters"] if p["name"] == "dialect")
    names = dialect["schema"]["anyOf"][0]["enum"]
    assert names == list(DIALECTS) == list(DialectName.__args__)


def test_durations_and_rates_are_published_as_the_strings_they_accept(
    document: dict[str, Any],
) -> None:
    schemas = document["components"]["schemas"]
    spec = next(v for k, v in schemas.items() if k.startswith("ToolSpec"))
    timeout = spec["properties"]["timeout"]
    assert timeout["oneOf"][1]["type"] == "string"
    assert re.match(timeout["oneOf"][1]["pattern"], "30s")
    rate = schemas["RateLimit"]["properties"]["rate"]
    assert re.match(rate["oneOf"][1]["pattern"], "10/s")


async def test_mcp_off_serves_no_mcp(sqlite_url: str, tmp_path: Path) -> None:
    async with (
        components_for(sqlite_url, write_tools(tmp_path), mcp=False) as c,
        api_client(c) as client,
    ):
        answer = await client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer.status_code == 404
        assert c.settings.mcp is False


async def test_building_the_document_does_not_hold_the_other_requests(
    sqlite_url: str, tmp_path: Path
) -> None:
    # The first /openapi.json builds the document (a second or more of CPU here). Requests that
    # come meanwhile are answered: the build runs in a thread. Were it built on the event loop,
    # no second request could be answered before it ends.
    settings = listening_settings(sqlite_url, tmp_path)
    async with (
        running_controller(settings) as (_, bound),
        httpx.AsyncClient(base_url=f"http://{bound.http}", timeout=60) as first,
        httpx.AsyncClient(base_url=f"http://{bound.http}", timeout=60) as other,
    ):
        document = asyncio.create_task(first.get("/openapi.json"))
        answered = 0
        while not document.done() and answered < 5:
            assert (await other.get("/healthz")).status_code == 200
            answered += 1
        assert (await document).status_code == 200
        assert answered == 5, f"only {answered} requests were answered while it was built"
        again = await other.get("/openapi.json")
        assert again.json() == (await document).json()


async def test_a_controller_under_a_prefix_names_it_as_its_server(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c:
        app = create_app(c)
        transport = httpx.ASGITransport(app=app, root_path="/reach")
        async with httpx.AsyncClient(transport=transport, base_url="http://reach") as client:
            doc = (await client.get("/openapi.json")).json()
    assert doc["servers"][0] == {"url": "/reach"}
