"""The shapes the controller answers with (as the OpenAPI document describes them)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Dialect = Literal["plan", "openai_chat", "openai_responses", "anthropic", "mcp"]
ToolFormat = Literal["native", "openai_chat", "openai_responses", "anthropic", "mcp"]


class PendingCall(TypedDict):
    """A call of a turn without a reply yet, and what it waits for."""

    call_id: str
    status: str
    waiting_for: Literal["approval", "dependencies", "executor", "start", "operator"]
    approvers: NotRequired[list[str] | None]
    decide_by: NotRequired[str | None]
    replies_url: str


class Turn(TypedDict):
    """A model's turn answered in its own dialect."""

    task_id: str
    status: str
    dialect: str
    replies: list[dict[str, Any]]
    pending: list[PendingCall]


class Step(TypedDict):
    step_id: str
    tool: str
    tool_version: str
    status: str
    attempt: int
    max_attempts: int
    args: dict[str, Any]
    receipt: dict[str, Any] | None


class TaskError(TypedDict):
    """Why a task failed: the first step that failed (a fan-out step's failing child)."""

    code: str
    message: str
    step_id: str


class Task(TypedDict):
    task_id: str
    trace_id: str
    status: str
    error: NotRequired[TaskError | None]  # null unless failed (absent from older controllers)
    source: str
    environment: NotRequired[str]  # dev, sandbox or prod (absent from older controllers)
    steps: list[Step]
    turn: NotRequired[Turn | None]


class Accepted(TypedDict):
    task_id: str
    trace_id: str
    status: str


class Event(TypedDict):
    id: int
    step_id: str | None
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    data: dict[str, Any] | None
    created_at: str
