"""Request and response shapes, published in the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_reach_controller.planning.shapes import MAX_CAPS
from agent_reach_controller.tools.catalog import EFFECT_CLASS, MAX_UNITS


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


# {effect class: units}: the most the whole task may use of each (planning/effects.py).
Caps = Annotated[
    dict[Annotated[str, Field(pattern=EFFECT_CLASS)], Annotated[float, Field(ge=0, le=MAX_UNITS)]],
    Field(max_length=MAX_CAPS, json_schema_extra={"additionalProperties": False}),
]
CAPS_FIELD: Any = Field(
    None,
    description="Blast-radius caps: the most units of each class of side effects (as tools "
    'declare them in `effects`, and `cost`) the whole task may use, e.g. {"payment": 1}. A '
    "step that would go over is not run (cap_exceeded); a plan whose unconditional steps "
    "already need more is refused at submit",
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
    caps: Caps | None = CAPS_FIELD


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
    caps: Caps | None = CAPS_FIELD


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


class CapUse(BaseModel):
    limit: float | None = Field(
        description="The task's own cap (null when only its tenant's policy caps the class)"
    )
    used: float = Field(description="Units charged so far, each step once before it ran")


class TokensIn(BaseModel):
    """Model tokens spent on a task since the last report (they add up)."""

    model_config = ConfigDict(extra="forbid")
    input_tokens: int = Field(0, ge=0, le=1_000_000_000)
    output_tokens: int = Field(0, ge=0, le=1_000_000_000)


class TaskUsage(BaseModel):
    """What a task has cost so far: model tokens reported by the caller, tool calls, time."""

    input_tokens: int
    output_tokens: int
    tool_calls: int = Field(description="Attempts handed to executors, retries included")
    duration_ms: int = Field(description="From acceptance to the end (or to now)")


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
    caps: dict[str, CapUse] | None = Field(
        None, description="Blast-radius caps on the task and what it used of each class"
    )
    usage: TaskUsage | None = None


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


class StepOutput(BaseModel):
    """A step's whole output, with the tool's `redact` fields replaced (never its projection)."""

    task_id: str
    step_id: str
    status: str
    output: Any = Field(None, description="None until the step succeeded")


class MomentOut(BaseModel):
    at: datetime
    kind: str
    step_id: str | None
    attempt: int | None
    status: str | None
    detail: dict[str, Any]


class StepReplayOut(BaseModel):
    step_id: str
    recorded_status: str
    replayed_status: str
    recorded_message: str | None = Field(description="What the model was shown (recorded)")
    replayed_message: str | None = Field(description="What the dry run derives for it")
    differences: list[str]
    notes: list[str]


class DryRunOut(BaseModel):
    finished: bool = Field(description="Every step had ended when the task was replayed")
    identical: bool = Field(description="Finished, and every step replayed as recorded")
    steps: list[StepReplayOut]


class ReplayOut(BaseModel):
    """A task's timeline from its event log, and a dry run of its plan on the recorded results."""

    task_id: str
    trace_id: str
    request: dict[str, Any]
    timeline: list[MomentOut]
    truncated: bool = Field(
        False, description="The task has more events than a timeline shows (the first 50,000)"
    )
    dry_run: DryRunOut
