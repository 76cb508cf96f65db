"""What connector tests share: a scripted DNS and a call of a tool as an executor makes it."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import pytest

from agent_reach_connectors import ToolCall

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Resolver:
    """A scripted DNS: only these names resolve, each to its addresses; `asked` records every
    question, in order."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "unknown name")
        return self.answers[host]


class NoDns:
    """A DNS that fails the test if it is asked anything: what is refused by name is refused
    before any lookup, and nothing leaves the machine."""

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        pytest.fail(f"the DNS was asked for {host!r}")


def tool_call(**given: Any) -> ToolCall:
    """A first attempt of step `s1` of task `task`, with what `given` says instead."""
    values: dict[str, Any] = {
        "tool": "t",
        "task_id": "task",
        "step_id": "s1",
        "args": {},
        "config": {},
        "idempotency_key": "task:s1",
        "attempt": 1,
        "max_attempts": 3,
        "trace_id": TRACEPARENT.split("-")[1],
        "traceparent": TRACEPARENT,
        "timeout_s": 5.0,
        **given,
    }
    return ToolCall(**values)
