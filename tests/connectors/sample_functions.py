"""Functions the python connector tests call by import path."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

from agent_reach_connectors import ConnectorError

CANARY = "canary-3f9a1c"


def add(a: int, b: int) -> dict[str, int]:
    return {"sum": a + b}


async def greet(name: str) -> str:
    await asyncio.sleep(0)
    return f"hello {name}"


class Doubler:
    """An object whose async __call__ must be awaited on the loop, not run in a thread."""

    async def __call__(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x


double = Doubler()


def thread_name() -> str:
    return threading.current_thread().name


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def leaky() -> None:
    raise RuntimeError(f"password={CANARY}")


def broken_inside(x: int) -> None:
    len(x)  # type: ignore[arg-type]  # a TypeError raised by the body, not by the arguments


def exits() -> None:
    sys.exit(3)


def classified() -> None:
    raise ConnectorError("rate_limited", "too fast", retry_after=3)


def not_json() -> Any:
    return object()


def not_a_number() -> float:
    return float("nan")


NOT_CALLABLE = 42


def burn(seconds: float) -> dict[str, int]:
    """Keep a core busy in Python (holding the GIL between switches) for `seconds`."""
    deadline = time.monotonic() + seconds
    spins = 0
    while time.monotonic() < deadline:
        spins += sum(range(1000)) > 0
    return {"spins": spins}
