"""Builds controller components on a test database, with a small tool catalogue."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from agent_reach_controller.api.app import create_app
from agent_reach_controller.decide.outcomes import AttemptError, AttemptResult
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components, open_components
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.settings import ControllerSettings
from tests.support import catalog

# Most integration tests take the catalogue and its writer from here.
TOOLS = catalog.TOOLS
write_tools = catalog.write_tools


def listening_settings(url: str, tmp_path: Path, **settings: Any) -> ControllerSettings:
    """A whole controller's settings: the small catalogue, REST and gRPC on free local ports."""
    return ControllerSettings(
        database_url=url,
        tools=[write_tools(tmp_path)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
        **settings,
    )


@contextlib.asynccontextmanager
async def components_for(url: str, tools_file: Path, **settings: Any) -> AsyncIterator[Components]:
    opened = await open_components(
        ControllerSettings(database_url=url, tools=[tools_file], **settings)
    )
    try:
        yield opened
    finally:
        await opened.close()


async def key_for(
    c: Components,
    *,
    roles: tuple[str, ...] = ("admin",),
    tenant: str = "default",
    name: str = "tester",
) -> dict[str, str]:
    """Headers carrying a new API key with these roles."""
    _, token = await c.keys.create(name=name, tenant=tenant, roles=list(roles), created_by="test")
    return {"Authorization": f"Bearer {token}"}


@contextlib.asynccontextmanager
async def api_client(
    c: Components, *, base_url: str = "http://reach.test", **key: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the app over these components, authenticated with a new key."""
    headers = await key_for(c, **key)
    transport = httpx.ASGITransport(app=create_app(c))
    async with httpx.AsyncClient(transport=transport, base_url=base_url, headers=headers) as client:
        yield client


async def submit(
    c: Components, body: dict[str, Any], *, tenant: str = "default", key: str | None = None
) -> str:
    """The id of a task of this plan, handed to intake directly as the API does once it has
    checked the caller (no HTTP, no API key); `key` is its Idempotency-Key."""
    plan = parse_plan(body, c.catalog)
    data = SubmitInput(plan=plan, request=body, tenant=tenant, idempotency_key=key)
    return (await c.intake.submit(data)).task_id


async def post_task(
    api: httpx.AsyncClient,
    body: Any,
    *,
    expect: int | None = 202,
    headers: Mapping[str, str] | None = None,
) -> httpx.Response:
    """POST /v1/tasks with `body` (JSON, or bytes sent as they are); the answer, which must have
    the status `expect` (None: any)."""
    if isinstance(body, bytes):
        raw = {"content-type": "application/json", **(headers or {})}
        answer = await api.post("/v1/tasks", content=body, headers=raw)
    else:
        answer = await api.post("/v1/tasks", json=body, headers=headers)
    if expect is not None:
        assert answer.status_code == expect, answer.text
    return answer


async def start_task(
    api: httpx.AsyncClient, body: Any, *, headers: Mapping[str, str] | None = None
) -> str:
    """The id of a task submitted over HTTP (and accepted)."""
    task_id: str = (await post_task(api, body, headers=headers)).json()["task_id"]
    return task_id


async def claim(
    c: Components,
    *,
    wait: float | None = 0,
    limit: int = 10,
    executor: str = "t",
    connectors: Sequence[str] = ("echo",),
) -> list[StepRow]:
    """Ready steps leased as an executor leases them: by a long poll of up to `wait` seconds, or
    with `wait=None` by one plain claim (no waiting, and no shortcut for a queue the last poll
    found drained)."""
    if wait is None:
        return await c.leasing.claim(executor_id=executor, connectors=connectors, limit=limit)
    return list(
        await c.leasing.poll(executor_id=executor, connectors=connectors, limit=limit, wait=wait)
    )


async def steps_of(c: Components, task_id: str) -> dict[str, StepRow]:
    """A task's steps as stored, by step id."""
    return {s.step_id: s for s in (await c.queries.get(task_id)).steps}


async def steps_shown(api: httpx.AsyncClient, task_id: str) -> dict[str, dict[str, Any]]:
    """A task's steps as GET /v1/tasks/{id} shows them, by step id."""
    task = (await api.get(f"/v1/tasks/{task_id}")).json()
    return {s["step_id"]: s for s in task["steps"]}


def ok(step: StepRow, output: Any) -> AttemptResult:
    return AttemptResult(step_key=step.id, attempt=step.attempt, output=output)


def failed(
    step: StepRow,
    code: str,
    *,
    retryable: bool,
    attempt: int | None = None,
    maybe_applied: bool = False,
) -> AttemptResult:
    return AttemptResult(
        step_key=step.id,
        attempt=step.attempt if attempt is None else attempt,
        error=AttemptError(
            code=code,
            message=f"{step.tool} failed: {code}",
            retryable=retryable,
            maybe_applied=maybe_applied,
        ),
    )
