"""Request and response shapes, published in the OpenAPI document."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

from agent_reach.times import rfc3339
from agent_reach_controller.settings import Environment
from agent_reach_controller.tools.catalog import DURATION_SCHEMA

# A moment in an answer: RFC 3339, UTC, `Z`, milliseconds (`agent_reach.times`), whatever the
# row held, so every time a client reads has one shape.
Instant = Annotated[
    datetime,
    PlainSerializer(rfc3339, return_type=str, when_used="json"),
    WithJsonSchema(
        {"type": "string", "format": "date-time", "examples": ["2026-12-06T08:00:00.000Z"]}
    ),
]


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


class NotMovedOut(BaseModel):
    """A step that keeps its time."""

    step_id: str
    status: str = Field(description="What it is now (a child that has started)")
    follows: str | None = Field(
        description="It waits on this sibling, which keeps its time (a verified write's "
        "read-back follows its write)",
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
    run_at: Instant | None = Field(
        None, description="When the step was asked to run (`run_at`, or the submit plus `delay`)"
    )
    not_before: Instant | None
    started_at: Instant | None
    finished_at: Instant | None
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
    decide_by: Instant | None = Field(None, description="For approval: when it expires")
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


class TaskErrorOut(BaseModel):
    """Why a task failed, at its top."""

    code: str = Field(description="The failing step's error code (a stable code to switch on)")
    message: str
    step_id: str = Field(
        description="The first step that failed, in plan order; for a fan-out or verified step "
        "that failed because a child did, that child (e.g. `tell[2]`)"
    )


class TaskOut(BaseModel):
    task_id: str
    trace_id: str
    status: str
    error: TaskErrorOut | None = Field(
        None, description="Why the task failed; null unless its status is `failed`"
    )
    goal: str | None
    source: str = Field(description="The dialect it was submitted in")
    run_id: str | None = Field(None, description="The agent run this task is a round of")
    subject: str | None = Field(
        None,
        description="The end user it acts for, as its caller named it (a run's rounds: the "
        "run's); memory's tools act for it",
    )
    environment: Environment = Field(
        "dev",
        description="Where it runs, fixed at submit (the tenant's in the policy, else the "
        "controller's): in sandbox writes go to each tool's sandbox target; in prod every write "
        "waits for approval unless its tool is exempted",
    )
    created_at: Instant
    updated_at: Instant
    finished_at: Instant | None
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


class RescheduleOut(TaskOut):
    """The task after a reschedule, and which steps moved: the step named, or for a fan-out or
    verified step (it never runs itself) each of its children that had not started."""

    moved: list[str] = Field(description="The steps given the new time")
    not_moved: list[NotMovedOut] = Field(
        description="Children of the step named that keep their time (they have started)"
    )


# RFC 3339's date-time (section 5.6): a date, a time and an offset, nothing left out.
RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)
# A name a tool may have (ToolSpec.name): anything else names no task's tool.
TOOL_NAME = r"^[a-zA-Z][a-zA-Z0-9_.-]{0,127}$"


def _rfc3339(value: Any) -> Any:
    # Pydantic also takes Unix times, bare dates and naive times: none says one instant.
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not RFC3339.fullmatch(value):
        raise ValueError("expected an RFC 3339 date-time, e.g. 2026-12-05T08:00:00Z")
    return value


Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


class TaskListQuery(BaseModel):
    """The task list's query: filters that combine, and keyset paging newest first."""

    status: Literal["pending", "running", "succeeded", "failed", "cancelled"] | None = None
    tool: str | None = Field(
        None, pattern=TOOL_NAME, description="Tasks with at least one step of this tool"
    )
    principal: str | None = Field(
        None, min_length=1, max_length=128, description="Tasks this principal submitted"
    )
    since: Rfc3339 | None = Field(None, description="Created at or after (to the millisecond)")
    until: Rfc3339 | None = Field(None, description="Created before (to the millisecond)")
    before: str | None = Field(
        None, max_length=64, description="The last task id of the previous page (`next_before`)"
    )
    limit: int = Field(50, ge=1, le=500)

    @field_validator("until")
    @classmethod
    def _after_since(cls, until: datetime | None, info: ValidationInfo) -> datetime | None:
        since = info.data.get("since")
        if until is not None and since is not None and until <= since:
            raise ValueError("'until' must be later than 'since'")
        return until


class TaskSummary(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    task_id: str
    trace_id: str
    status: str
    principal: str = Field(description="Who submitted it")
    goal: str | None
    run_id: str | None = Field(None, description="The agent run this task is a round of")
    subject: str | None = Field(None, description="The end user the task acts for")
    created_at: Instant
    finished_at: Instant | None


class TaskPage(BaseModel):
    tasks: list[TaskSummary]
    next_before: str | None = Field(None, description="Pass as `before` for the next page")


class NotDecidable(BaseModel):
    """Why the caller may not decide on a step it would otherwise approve."""

    code: Literal["separation_of_duties", "expired"] = Field(
        description="separation_of_duties: the caller submitted the task; expired: `decide_by` "
        "has passed (it is about to be rejected)"
    )
    detail: str


class ApprovalOut(BaseModel):
    """A step waiting for a decision: what exactly would run, who asked, and until when."""

    task_id: str
    step_id: str
    tool: str
    tool_version: str = Field(description="The version the approval is for")
    risk: Literal["read", "write", "dangerous"]
    environment: Environment
    args: dict[str, Any] = Field(
        description="Exactly the arguments the approval is for (its step's resolved arguments)"
    )
    input_schema: dict[str, Any] = Field(
        description="The tool version's JSON Schema for its arguments (edited arguments sent "
        "with an approval must fit it)"
    )
    asked_by: str = Field(description="Who submitted the task")
    asked_at: Instant | None = Field(description="When the approval was asked for")
    decide_by: Instant = Field(description="When it expires: the step is rejected then")
    may_decide: bool = Field(description="The caller may approve or reject it now")
    why_not: NotDecidable | None = Field(None, description="When `may_decide` is false")


class ApprovalPage(BaseModel):
    approvals: list[ApprovalOut]
    next_after: str | None = Field(
        None,
        description="Pass as `after` for the next page (a page may be short and still have one; "
        "null: nothing after it)",
    )


class BucketUseOut(BaseModel):
    in_use: int = Field(description="Calls admitted within the current burst window")
    frees_in: float = Field(
        description="Seconds until the oldest of them leaves the window (0 when none is held)"
    )


class RateUseOut(BaseModel):
    per_second: float
    burst: int
    key: str | None = Field(description="The key expression of a keyed limit (one bucket each)")
    use: BucketUseOut = Field(description="The bucket's use; for a keyed limit, the busiest key's")
    keys: int | None = Field(
        None, description="A keyed limit: how many key buckets hold state now (a bounded count)"
    )
    more_keys: bool = Field(False, description="There may be more key buckets than counted")


class PerKeyConcurrencyOut(BaseModel):
    limit: int
    key: str


class ConcurrencyOut(BaseModel):
    limit: int | None = Field(description="The most steps of the tool running at once")
    per_key: PerKeyConcurrencyOut | None
    running: int = Field(description="Steps of the tool running now, every caller's")


class BreakerOut(BaseModel):
    state: Literal["closed", "open", "half_open"]
    calls: int = Field(description="Calls in the current window")
    failures: int = Field(description="Failures among them")
    opened_at: Instant | None


class ToolUsageOut(BaseModel):
    """A tool's limits and what it uses of them now (shared by every replica and caller)."""

    name: str
    version: str
    rate_limit: RateUseOut | None = Field(description="null: the tool has no rate limit")
    concurrency: ConcurrencyOut
    breaker: BreakerOut | None = Field(description="null: the tool has no circuit breaker")


class EventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    step_id: str | None
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    data: dict[str, Any] | None
    created_at: Instant


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
    awaiting: list[str] | None = Field(
        None,
        description="not_decidable, for a step whose children wait for several decisions: "
        "their ids (decide each)",
    )
    not_moved: list[NotMovedOut] | None = Field(
        None,
        description="not_reschedulable, for a fan-out or verified step: its children, none of "
        "which could move",
    )


class StepOutput(BaseModel):
    """A step's whole output, with the tool's `redact` fields replaced (never its projection)."""

    task_id: str
    step_id: str
    status: str
    output: Any = Field(None, description="None until the step succeeded")


class MomentOut(BaseModel):
    at: Instant
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
