"""Functions the python connector tests call by import path."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_reach_connectors import ConnectorError


def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


async def greet(name: str) -> str:
    await asyncio.sleep(0)
    return f"hello {name}"


def leaky() -> None:
    raise RuntimeError("password=canary-3f9a1c")


def classified() -> None:
    raise ConnectorError("rate_limited", "too fast", retry_after=3)


def not_json() -> Any:
    return object()


NOT_CALLABLE = 42
