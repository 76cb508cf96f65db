"""The shapes the controller answers with (as the OpenAPI document describes them)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Dialect = Literal["plan", "openai_chat", "openai_responses", "anthropic", "mcp"]
ToolFormat = Literal["native", "openai_chat", "openai_responses", "anthropic", "mcp"]
# A run's input: text (a user message), or messages in the shape of the agent's endpoint.
RunInput = str | list[dict[str, Any]]


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
    subject: NotRequired[str | None]  # the end user it acts for (absent from older controllers)
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


class Agent(TypedDict):
    """An agent profile as stored: credentials only as `${env:NAME}` references."""

    name: str
    version: str
    revision: int
    enabled: bool
    profile: dict[str, Any]  # the body `put_agent` takes


class RunLimits(TypedDict, total=False):
    """A run's limits; each given one may only lower the agent's."""

    max_rounds: int
    input_tokens: int
    output_tokens: int
    cost: float
    deadline: float  # seconds


class RunTokens(TypedDict):
    input: int
    output: int
    cached: int


class RunEntry(TypedDict):
    """One entry of a run's conversation; `message` is in the agent's endpoint's shape."""

    seq: int
    round: int
    role: str  # user, assistant or tool
    message: dict[str, Any]


class Run(TypedDict):
    """An agent run: where it is, what it used, its answer and (from `get_run`) its
    conversation. `end_reason`: answered, max_rounds, budget_exhausted, loop_detected,
    deadline_exceeded, model_failed, invalid_reply or cancelled."""

    run_id: str
    trace_id: str
    agent: str
    agent_version: str
    status: str  # running, succeeded, failed or cancelled
    end_reason: str | None
    round: int
    task_id: str | None
    subject: str | None
    tokens: RunTokens
    cost: float
    answer: str | None
    error: dict[str, Any] | None
    limits: dict[str, Any]
    tools: list[str]
    created_at: str
    finished_at: str | None
    messages: NotRequired[list[RunEntry] | None]


MemoryType = Literal["profile", "preference", "fact", "goal", "project", "constraint"]


class Memory(TypedDict):
    """A long-term memory of a subject (the end user runs act for). `origin`: user (a caller
    wrote it), model (a run, from what its user said) or receipt (a run, after reading a tool's
    output; `untrusted`, never recalled into a run). `version` is its ETag."""

    memory_id: str
    subject: str
    type: str
    key: str
    text: str
    value: Any
    origin: Literal["user", "model", "receipt"]
    untrusted: bool
    confidence: float
    pinned: bool
    source: dict[str, Any] | None  # where a run wrote it: run, task, step
    written_by: str
    version: int
    created_at: str
    updated_at: str
    expires_at: str | None
    score: NotRequired[float]  # from `search_memory`: higher matches better


class MemorySubject(TypedDict):
    subject: str
    entries: int
    updated_at: str


class MemorySubjects(TypedDict):
    subjects: list[MemorySubject]
    next_after: str | None  # the next page's `after`; None: no more
