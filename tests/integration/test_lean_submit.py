"""The submit's short way in (api/lean_submit.py) answers exactly as the route does.

Each request is sent twice: as it is, which the lean submit serves, and with `?atomic=false`
appended (the default, so the same request), which it leaves to FastAPI's route. The two answers
must be equal (status, headers, body) once the ids a new task is given are set aside; what each
way stored is compared through the API too. `LeanSubmit.served` tells which way each one went.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from agent_reach_controller.api.app import create_app
from agent_reach_controller.api.lean_submit import LeanSubmit
from agent_reach_controller.runtime import Components
from tests.integration.stack import components_for, key_for, write_tools
from tests.integration.test_bad_input import bodies

PLAN = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}}]}
LIMIT = 4096  # max_body_bytes here: a larger body is a 413
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
# What differs between two tasks submitted alike: their ids.
_TASK_ID = re.compile(
    r"tsk_[0-9A-Za-z_-]+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)


class Both:
    """Sends a submit both ways and compares the answers."""

    def __init__(self, c: Components, headers: Mapping[str, str]) -> None:
        self.app = create_app(c)
        lean = self.app.middleware_stack
        assert isinstance(lean, LeanSubmit)
        self.lean = lean
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://reach.test",
            headers=dict(headers),
        )

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        sent = {"content-type": "application/json", **headers}
        return await self.http.post(path, content=body, headers=sent)

    async def compare(
        self, body: bytes, headers: Mapping[str, str] | None = None, *, lean: bool = True
    ) -> tuple[httpx.Response, httpx.Response]:
        """(lean answer, route's answer), checked equal; `lean`: whether the first is lean's."""
        served = self.lean.served
        short = await self.post("/v1/tasks", body, headers or {})
        assert self.lean.served == served + lean, "the lean submit did not take it" if lean else ""
        long = await self.post("/v1/tasks?atomic=false", body, headers or {})
        assert self.lean.served == served + lean, "a request with a query went the short way"
        assert short.status_code == long.status_code, (short.text, long.text)
        assert _shape(short) == _shape(long)
        return short, long


def _shape(answer: httpx.Response) -> tuple[int, dict[str, str], Any]:
    """An answer with the ids a task is given replaced by a placeholder."""
    headers = {k: _TASK_ID.sub("<id>", v) for k, v in answer.headers.items()}
    body = json.loads(answer.content) if answer.content else None
    if answer.status_code == 202:
        body = {**body, "task_id": "<id>", "trace_id": len(body["trace_id"])}
        headers["content-length"] = "<length>"
    return answer.status_code, headers, body


@pytest.fixture
async def both(database_url: str, tmp_path: Path) -> AsyncIterator[Both]:
    async with components_for(database_url, write_tools(tmp_path), max_body_bytes=LIMIT) as c:
        pair = Both(c, await key_for(c))
        try:
            yield pair
        finally:
            await pair.http.aclose()


async def test_an_accepted_submit_is_answered_and_stored_alike(both: Both) -> None:
    short, long = await both.compare(json.dumps(PLAN).encode())
    assert short.status_code == 202
    assert short.headers["location"] == f"/v1/tasks/{short.json()['task_id']}"
    stored = [(await both.http.get(a.headers["location"])).json() for a in (short, long)]
    assert [s["status"] for s in stored] == ["pending", "pending"]
    assert stored[0]["steps"][0]["args"] == stored[1]["steps"][0]["args"] == {"text": "hi"}


async def test_a_traceparent_and_an_idempotency_key_are_honoured_alike(both: Both) -> None:
    traced = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
    short, long = await both.compare(json.dumps(PLAN).encode(), traced)
    assert short.json()["trace_id"] == long.json()["trace_id"] == TRACE
    body = json.dumps(PLAN).encode()
    first = await both.post("/v1/tasks", body, {"idempotency-key": "k-1"})
    again, long_again = await both.compare(body, {"idempotency-key": "k-1"})
    assert again.json()["task_id"] == long_again.json()["task_id"] == first.json()["task_id"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (b'{"steps": [{"step_id": "a", "tool": "echo.say", "args": {"n": NaN}}]}', 400),
        (b"", 400),
        (json.dumps({"steps": [{"step_id": "a", "tool": "nope"}]}).encode(), 422),
        (json.dumps({"steps": "x"}).encode(), 422),
        (json.dumps({**PLAN, "goal": "x" * LIMIT}).encode(), 413),
    ],
)
async def test_a_refused_body_gets_the_same_problem(both: Both, body: bytes, status: int) -> None:
    short, _ = await both.compare(body)
    assert short.status_code == status
    assert short.headers["content-type"] == "application/problem+json"


async def test_a_bad_key_or_a_missing_right_gets_the_same_problem(both: Both) -> None:
    short, _ = await both.compare(json.dumps(PLAN).encode(), {"authorization": "Bearer ark_no"})
    assert short.status_code == 401
    components = both.app.state.components
    viewer = await key_for(components, roles=("viewer",), name="viewer")
    short, _ = await both.compare(json.dumps(PLAN).encode(), viewer)
    assert short.status_code == 403
    as_header = {"authorization": "", "x-api-key": viewer["Authorization"].split()[1]}
    short, _ = await both.compare(json.dumps(PLAN).encode(), as_header)
    assert short.status_code == 403


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": ""},  # no key: the route's 401 (or a console session)
        {"content-type": "text/plain"},  # the route's 415
        {"idempotency-key": "k" * 256},  # the route's 422
    ],
)
async def test_what_the_lean_submit_does_not_serve_goes_the_long_way(
    both: Both, headers: dict[str, str]
) -> None:
    short, _ = await both.compare(json.dumps(PLAN).encode(), headers, lean=False)
    assert short.status_code >= 400


async def test_a_header_given_twice_goes_the_long_way(both: Both) -> None:
    served = both.lean.served
    twice = [("content-type", "application/json"), ("traceparent", "a"), ("traceparent", "b")]
    answer = await both.http.post("/v1/tasks", content=json.dumps(PLAN).encode(), headers=twice)
    assert answer.status_code == 202
    assert both.lean.served == served


def test_generated_bodies_are_answered_alike(tmp_path: Path, sqlite_url: str) -> None:
    loop = asyncio.new_event_loop()
    ctx = components_for(sqlite_url, write_tools(tmp_path), max_body_bytes=LIMIT)
    components = loop.run_until_complete(ctx.__aenter__())
    pair = Both(components, loop.run_until_complete(key_for(components)))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(body=bodies)
    def check(body: Any) -> None:
        loop.run_until_complete(pair.compare(json.dumps(body).encode()))

    try:
        check()
    finally:
        loop.run_until_complete(pair.http.aclose())
        loop.run_until_complete(ctx.__aexit__(None, None, None))
        loop.close()
