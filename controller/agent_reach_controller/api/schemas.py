"""Request and response shapes, published in the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StepIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step_id: str = Field(description="Unique within the plan", examples=["weather"])
    tool: str = Field(description="Tool name", examples=["weather.forecast"])
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments; a whole string `$<step_id>.output[.path]` is replaced by that "
        "step's output",
    )
    depends_on: list[str] = Field(default_factory=list)
    when: str | None = Field(None, description="CEL condition over `steps` and `context`")
    retry: dict[str, Any] | None = Field(
        None, description="Overrides of the tool's retry policy for this step, field by field"
    )
    timeouts: TimeoutsIn | None = Field(
        None, description="This step's own timeouts, each replacing the tool's"
    )
    priority: int | None = Field(
        None, ge=-1000, le=1000, description="Dispatch priority (higher first); default the plan's"
    )


class TimeoutsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout: float | str | None = Field(
        None, description="start_to_close of one attempt: seconds or e.g. '30s'"
    )
    schedule_to_start: float | str | None = Field(
        None, description="Longest wait in the queue for an executor, per attempt"
    )
    schedule_to_close: float | str | None = Field(
        None, description="The whole step, retries and waits included"
    )
    heartbeat: float | str | None = Field(
        None, description="Longest silence of a running call before it is stopped as hung"
    )


class ApprovalIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    decision: Literal["approve", "reject"]
    reason: str = Field(
        "", max_length=2000, description="Why (recorded; on a rejection the model reads it)"
    )
    args: dict[str, Any] | None = Field(
        None,
        description="Approve these arguments instead (checked against the tool's schema; the "
        "event log keeps both versions)",
    )


class BudgetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_attempts: int | None = Field(
        None, ge=1, description="Attempts all steps together may use, first attempts included"
    )


class PlanIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    goal: str | None = None
    steps: list[StepIn]
    context: dict[str, Any] = Field(default_factory=dict)
    deadline_seconds: float | None = Field(
        None, gt=0, description="End the task, with receipts, this long after it is accepted"
    )
    budget: BudgetIn | None = None
    priority: int = Field(
        0, ge=-1000, le=1000, description="Dispatch priority of the steps (higher first)"
    )


class FunctionCallIn(BaseModel):
    name: str
    arguments: str | dict[str, Any] = Field(description="JSON-encoded arguments")


class ToolCallIn(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ToolCallsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool_calls: list[ToolCallIn]
    context: dict[str, Any] = Field(default_factory=dict)
    deadline_seconds: float | None = Field(None, gt=0)
    budget: BudgetIn | None = None
    priority: int = Field(0, ge=-1000, le=1000)


class TaskAccepted(BaseModel):
    task_id: str
    trace_id: str
    status: str


class StepOut(BaseModel):
    step_id: str
    tool: str
    tool_version: str
    status: str
    attempt: int
    max_attempts: int
    depends_on: list[str]
    when: str | None
    args: dict[str, Any]
    resolved_args: dict[str, Any] | None
    idempotency_key: str
    not_before: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    receipt: dict[str, Any] | None


class ToolMessage(BaseModel):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str


class TaskOut(BaseModel):
    task_id: str
    trace_id: str
    status: str
    goal: str | None
    source: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    steps: list[StepOut]
    tool_messages: list[ToolMessage] | None = Field(
        None, description="For tool_calls submissions: one tool message per finished call"
    )


class TaskSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    task_id: str
    trace_id: str
    status: str
    goal: str | None
    created_at: datetime
    finished_at: datetime | None


class TaskPage(BaseModel):
    tasks: list[TaskSummary]
    next_before: str | None = Field(None, description="Pass as `before` for the next page")


class EventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    step_id: str | None
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    data: dict[str, Any] | None
    created_at: datetime


class EventPage(BaseModel):
    events: list[EventOut]


class ResolveIn(BaseModel):
    """An operator's verdict on a step whose outcome is unknown."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["retry", "succeeded", "failed"] = Field(
        description="retry: run it again (same idempotency key); succeeded: it happened (give "
        "`output`); failed: it did not happen"
    )
    by: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="On whose behalf, when not the key's own principal (recorded with it)",
    )
    reason: str = Field("", max_length=1000, description="Why (recorded; the model reads it)")
    output: Any = Field(None, description="The step's output, for `succeeded`")


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str
    errors: list[dict[str, Any]] | None = None
