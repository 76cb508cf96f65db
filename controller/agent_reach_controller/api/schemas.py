"""Request and response shapes, published in the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from agent_reach_controller.settings import Environment
from agent_reach_controller.tools.catalog import DURATION_SCHEMA


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
    run_at: datetime | None = Field(
        None, description="When the step was asked to run (`run_at`, or the submit plus `delay`)"
    )
    not_before: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    receipt: dict[str, Any] | None


class ToolMessage(BaseModel):
    role: Literal["tool"] = "tool"
    tool_call_id: str
    content: str


class PendingCall(BaseModel):
    """A call of a model's turn that has no reply yet: it is still running, queued or waiting."""

    call_id: str
    status: str
    waiting_for: Literal["approval", "dependencies", "executor", "start", "operator"] = Field(
        description="approval: a person must decide (see `approvers`); executor: queued or "
        "running; start: a backoff or hold before it may run; operator: its outcome is unknown "
        "and someone must resolve it"
    )
    approvers: list[str] | None = Field(
        None, description="For approval: the roles that may decide on this tool"
    )
    decide_by: datetime | None = Field(None, description="For approval: when it expires")
    replies_url: str = Field(description="Where the replies are, once it has one")


class TurnReplies(BaseModel):
    """A model's turn answered in its own dialect: what to append to the conversation, and the
    calls that have no reply yet (append the replies once `pending` is empty)."""

    task_id: str
    status: str
    dialect: str
    replies: list[dict[str, Any]] = Field(
        description="openai_chat: `role: tool` messages; openai_responses: "
        "`function_call_output` items; anthropic: one user message of `tool_result` blocks"
    )
    pending: list[PendingCall]


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
    source: str = Field(description="The dialect it was submitted in")
    environment: Environment = Field(
        "dev",
        description="Where it runs, fixed at submit (the tenant's in the policy, else the "
        "controller's): in sandbox writes go to each tool's sandbox target; in prod every write "
        "waits for approval unless its tool is exempted",
    )
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    steps: list[StepOut]
    tool_messages: list[ToolMessage] | None = Field(
        None,
        description="For OpenAI Chat submissions: one tool message per finished call (as "
        "in `turn.replies`)",
    )
    turn: TurnReplies | None = Field(
        None, description="For a model's turn (not a plan): the replies in its own dialect"
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


class ScheduleIn(BaseModel):
    """A new time for a step that has not started: `run_at` or `delay` (from now)."""

    model_config = ConfigDict(extra="forbid")
    run_at: str | None = Field(
        None,
        description="RFC 3339 with an offset, or a local time in `timezone`",
        examples=["2026-12-03T08:00:00+08:00"],
    )
    delay: Annotated[Any, WithJsonSchema(DURATION_SCHEMA)] = Field(
        None, description="From now, e.g. '30m'"
    )
    timezone: str | None = Field(None, description="The IANA time zone of a local `run_at`")


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


class ProblemItem(BaseModel):
    pointer: str = Field(description="RFC 6901 JSON pointer into the request ('' for all of it)")
    code: str = Field(description="A stable code to switch on")
    detail: str


class Problem(BaseModel):
    """An RFC 9457 problem document: every error this API answers has this shape."""

    type: str
    title: str
    status: int
    detail: str
    code: str = Field(description="A stable code to switch on")
    errors: list[ProblemItem] | None = Field(
        None, description="Each problem of the request, where it is"
    )


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
