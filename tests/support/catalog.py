"""The tool catalogue most tests load, and the one writer of a tools file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

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


def write_tools(
    directory: Path, tools: Sequence[dict[str, Any]] | None = None, *, name: str = "tools.yaml"
) -> Path:
    """Write `tools` (the echo catalogue when none or empty) as a tools file in `directory`."""
    path = directory / name
    path.write_text(yaml.safe_dump({"tools": list(tools or TOOLS)}, sort_keys=False))
    return path
