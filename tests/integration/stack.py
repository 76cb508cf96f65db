"""Builds controller components on a test database, with a small tool catalogue."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from agent_reach_controller.api.app import create_app
from agent_reach_controller.decide.outcomes import AttemptError, AttemptResult
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.runtime import Components, open_components
from agent_reach_controller.settings import ControllerSettings

TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo.say",
        "description": "Echo the arguments back.",
        "connector": "echo",
        "input_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
        },
        "retry": {"initial_interval": "10ms", "maximum_attempts": 3, "jitter": False},
        "idempotent": True,
    },
    {
        "name": "echo.count",
        "description": "Takes a number.",
        "connector": "echo",
        "input_schema": {
            "type": "object",
            "required": ["n"],
            "properties": {"n": {"type": "integer"}},
        },
        "retry": {"maximum_attempts": 1},
    },
]


def write_tools(directory: Path, tools: list[dict[str, Any]] | None = None) -> Path:
    path = directory / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": tools or TOOLS}))
    return path


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
