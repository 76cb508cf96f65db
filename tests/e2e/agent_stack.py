"""A `reach dev` for agent runs (its executor hosts `echo` and `model`) and a profile that points
an agent at a ScriptedModels server; shared by the CLI's and the client's run tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.processes import Proc, cluster
from tests.support.models import ScriptedModels

# The model's API key: the executor reads it from its environment; nothing may ever show it.
KEY_VARIABLE = "AGENT_REACH_TEST_MODEL_KEY"
KEY = "sk-test-5e1d0b-never-shown"
TOOLS = [
    {
        "name": "echo.say",
        "description": "Says what it is given.",
        "connector": "echo",
        "idempotent": True,
        "input_schema": {"type": "object", "properties": {"text": {}}},
    },
    {
        "name": "pay.send",
        "description": "Moves money.",
        "connector": "echo",
        "risk": "dangerous",
        "idempotent": True,
        "input_schema": {"type": "object", "properties": {"cents": {"type": "integer"}}},
    },
]


@contextlib.contextmanager
def agent_dev(workdir: Path) -> Iterator[Proc]:
    """`reach dev` on SQLite with the tools above and the model's key in its environment."""
    tools = workdir / "tools.yaml"
    tools.write_text(yaml.safe_dump({"tools": TOOLS}))
    with cluster(workdir, env={KEY_VARIABLE: KEY}) as c:
        yield c.dev("dev", tools=tools)


def profile(models: ScriptedModels, **more: Any) -> dict[str, Any]:
    """An agent on the scripted model's Chat Completions endpoint that may call `echo.*`."""
    return {
        "description": "Answers with what the echo tool says.",
        "endpoint": {
            "kind": "openai_chat",
            "base_url": models.url,
            "api_key": f"${{env:{KEY_VARIABLE}}}",
            "allow_hosts": ["127.0.0.1"],
        },
        "model": "scripted-1",
        "system": "You are a careful assistant.",
        "tools": ["echo.*"],
        "retry": {"maximum_attempts": 2, "initial_interval": 0.05, "jitter": False},
    } | more
