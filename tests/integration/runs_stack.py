"""What the agent-run tests share: a real controller and a real executor running the `model`
connector against the scripted model server, the tools its models call, and helpers to start,
wait on and read runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_controller.runtime import Components
from agent_reach_controller.server import running_controller
from agent_reach_controller.settings import ControllerSettings
from agent_reach_executor import ExecutorSettings, run_executor
from tests.integration.stack import write_tools
from tests.support.models import (
    ScriptedModels,
)

KEY_VARIABLE = "AGENT_REACH_TEST_MODEL_KEY"


KEY = "sk-test-7f3a9c-never-shown"


ECHO = {
    "name": "echo.say",
    "description": "Says what it is given.",
    "connector": "echo",
    "idempotent": True,
    "input_schema": {"type": "object", "properties": {"text": {}}},
}


PAY = {
    "name": "pay.send",
    "description": "Moves money.",
    "connector": "echo",
    "risk": "dangerous",
    "idempotent": True,
    "input_schema": {"type": "object", "properties": {"cents": {"type": "integer"}}},
}


WIRE = {
    "name": "wire.send",
    "description": "Sends a wire; a timeout may have sent it.",
    "connector": "script",
    "risk": "write",
    "config": {"outcomes": ["timeout"]},
    "retry": {"maximum_attempts": 1},
    "input_schema": {"type": "object"},
}


WIRE_TOLD = WIRE | {"name": "wire.told", "if_unknown": "tell_model"}


LEDGER = {
    "name": "ledger.post",
    "description": "Posts to an account, which must come from what the model was given.",
    "connector": "echo",
    "idempotent": True,
    "grounded": ["account"],
    "input_schema": {"type": "object", "properties": {"account": {"type": "string"}}},
}


SECRET_TOOL = {
    "name": "vault.read",
    "description": "Reads the vault.",
    "connector": "echo",
    "input_schema": {"type": "object"},
}


def profile(models: ScriptedModels, kind: str = "openai_chat", **more: Any) -> dict[str, Any]:
    return {
        "description": "Answers with what the echo tool says.",
        "endpoint": {
            "kind": kind,
            "base_url": models.root if kind == "anthropic" else models.url,
            "api_key": f"${{env:{KEY_VARIABLE}}}",
            "allow_hosts": ["127.0.0.1"],
        },
        "model": "scripted-1",
        "system": "You are a careful assistant.",
        "tools": ["echo.*"],
        "retry": {"maximum_attempts": 2, "initial_interval": 0.05, "jitter": False},
    } | more


@contextlib.asynccontextmanager
async def stack(
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra_tools: Sequence[dict[str, Any]] = (),
    **more: Any,
) -> AsyncIterator[tuple[Components, httpx.AsyncClient]]:
    """A controller, an executor hosting `echo` and `model`, and an admin's API client."""
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    tools = [ECHO, PAY, WIRE, WIRE_TOLD, LEDGER, SECRET_TOOL, *extra_tools]
    settings = ControllerSettings(
        database_url=database_url,
        tools=[write_tools(tmp_path, tools)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
        **more,
    )
    async with running_controller(settings) as (c, bound):
        _, token = await c.pools.create(name="pool", created_by="test")
        _, api_key = await c.keys.create(
            name="admin", tenant="default", roles=["admin"], created_by="test"
        )
        stop = asyncio.Event()
        worker = asyncio.create_task(
            run_executor(
                ExecutorSettings(
                    controller=bound.grpc,
                    token=token,
                    connectors=["echo", "model", "script"],
                    drain_grace=1,
                ),
                stop=stop,
                handle_signals=False,
            )
        )
        headers = {"Authorization": f"Bearer {api_key}"}
        try:
            async with httpx.AsyncClient(
                base_url=f"http://{bound.http}", headers=headers, timeout=30
            ) as api:
                yield c, api
        finally:
            stop.set()
            await worker


async def put_agent(api: httpx.AsyncClient, name: str, body: dict[str, Any]) -> dict[str, Any]:
    answer_ = await api.put(f"/v1/agents/{name}", json=body)
    assert answer_.status_code in (200, 201), answer_.text
    return dict(answer_.json())


async def run(api: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    started = await api.post("/v1/runs?wait=30", json=body)
    assert started.status_code == 200, started.text
    got = await api.get(f"/v1/runs/{started.json()['run_id']}")
    assert got.status_code == 200, got.text
    return dict(got.json())


async def started(api: httpx.AsyncClient, body: dict[str, Any]) -> str:
    answer_ = await api.post("/v1/runs", json=body)
    assert answer_.status_code == 202, answer_.text
    return str(answer_.json()["run_id"])


async def step_of(c: Components, api: httpx.AsyncClient, run_id: str, status: str) -> Any:
    """The step of the run's current round that reaches `status` (waited for, 30 s at most)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        task_id = (await api.get(f"/v1/runs/{run_id}")).json()["task_id"]
        view = await c.queries.get(task_id)
        found = next((s for s in view.steps if s.status.value == status), None)
        if found is not None:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no step of run {run_id} reached {status} in 30 s")


async def sse(api: httpx.AsyncClient, url: str, **headers: str) -> list[tuple[str, Any]]:
    """Every (event, data) of a stream, read to its end (30 s at most)."""
    found: list[tuple[str, Any]] = []
    async with api.stream("GET", url, headers=headers, timeout=30) as stream:
        assert stream.status_code == 200, await stream.aread()
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                found.append((kind, json.loads(line.removeprefix("data: "))))
    return found
