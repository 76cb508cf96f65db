"""Builds controller components on a test database, with a small tool catalogue."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml

from agent_reach_controller.runtime import Components, open_components
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.state.outcomes import AttemptError, AttemptResult
from agent_reach_controller.state.records import StepRow

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
