"""Rows as frozen values: steps, tasks, events, breakers and decided changes, as the rules and
the use cases read them (storage fills them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from agent_reach.states import StepStatus, TaskStatus, Transition
from agent_reach_controller.settings import DEFAULT_ENVIRONMENT, Environment


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    id: int
    task_id: str
    step_id: str
    position: int
    trace_id: str
    tool: str
    tool_version: str
    connector: str
    args: dict[str, Any]
    resolved_args: dict[str, Any] | None
    depends_on: tuple[str, ...]
    when_expr: str | None
    status: StepStatus
    attempt: int
    max_attempts: int
    not_before: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    idempotency_key: str
    output: Any
    error: dict[str, Any] | None
    receipt: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    retry: dict[str, Any] | None = None
    fallback_from: str | None = None
    rate_key: str | None = None
    concurrency_key: str | None = None
    timeouts: dict[str, Any] | None = None
    start_by: datetime | None = None
    priority: int = 0
    tenant: str = "default"
    key_id: str | None = None
    approval: dict[str, Any] | None = None
    decide_by: datetime | None = None
    lease_seq: int | None = None
    run_at: datetime | None = None  # when the step was asked to run (a scheduled step)
    # Its task's (dev, sandbox or prod); a row a release before environments stored: dev.
    environment: Environment = DEFAULT_ENVIRONMENT
    # Not a column: set only on a step just leased, its `updated_at` before the lease (when the
    # attempt was queued), for the schedule-to-start metric.
    queued_at: datetime | None = None

    @property
    def due_at(self) -> datetime | None:
        """When a just-leased attempt became due: queued, and past its backoff or hold."""
        if self.queued_at is None:
            return None
        return max(self.queued_at, self.not_before or self.queued_at)

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> StepRow:
        """A row (every column, by name) as a StepRow; keys that are not fields are ignored."""
        step = _filled(cls, _STEP_FIELDS, row)
        _set(step, "status", StepStatus(row["status"]))
        _set(step, "depends_on", tuple(row["depends_on"] or ()))
        _set(step, "environment", row.get("environment") or DEFAULT_ENVIRONMENT)
        return step


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRow:
    task_id: str
    trace_id: str
    parent_span_id: str | None
    status: TaskStatus
    principal: str
    goal: str | None
    source: str
    request: dict[str, Any]
    context: dict[str, Any]
    cancel_requested: bool
    version: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    deadline: datetime | None = None
    max_attempts: int | None = None
    tenant: str = "default"
    caps: dict[str, float] | None = None  # the task's own blast-radius caps
    input_tokens: int = 0  # model tokens the caller reported for this task
    output_tokens: int = 0
    webhook_url: str | None = None  # where the task's end is announced
    environment: Environment = DEFAULT_ENVIRONMENT  # where it runs (NULL in older rows: dev)
    run_id: str | None = None  # the agent run this task is a round of
    subject: str | None = None  # the end user it acts for, named by its caller (memory's tools)

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> TaskRow:
        """A row (every column, by name) as a TaskRow; keys that are not fields are ignored."""
        task = _filled(cls, _TASK_FIELDS, row)
        _set(task, "status", TaskStatus(row["status"]))
        _set(task, "environment", row.get("environment") or DEFAULT_ENVIRONMENT)
        return task


# Rows are read by the hundred on the hot path, and a frozen dataclass's generated __init__
# (keyword arguments, one object.__setattr__ each) costs ~13 µs for StepRow's 39 fields: they
# are filled field by field instead (~5 µs), with the same result.
_set = object.__setattr__
_Row = TypeVar("_Row")


def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, default or None) of each field."""
    return tuple(
        (f.name, None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(cls)
    )


def _filled(cls: type[_Row], fields: tuple[tuple[str, Any], ...], row: Mapping[Any, Any]) -> _Row:
    made = object.__new__(cls)
    get = row.get
    for name, default in fields:
        _set(made, name, get(name, default))
    return made


_STEP_FIELDS = _fields(StepRow)
_TASK_FIELDS = _fields(TaskRow)


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRow:
    id: int
    task_id: str
    step_id: str | None
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    data: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> EventRow:
        return cls(**dict(row))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedGroup:
    """Ready steps of one tool, connector and tenant, and when the longest-waiting due one became
    due (None: none is due yet). Admission sums them, the gauges add them up per tool, and each
    executor pool takes the groups its scope allows."""

    tool: str
    connector: str
    tenant: str
    depth: int
    oldest_due: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepChange:
    """One decided transition of one step: which edge, and the columns it sets besides status."""

    step: StepRow
    transition: Transition
    values: Mapping[str, Any]
    event_data: Mapping[str, Any] | None = None


class BreakerState(StrEnum):
    """Where a circuit breaker stands: letting calls through, stopping them, or probing."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True, kw_only=True)
class Breaker:
    """One tool's circuit breaker row: its state and the calls counted in its window."""

    tool: str
    state: BreakerState
    window_started_at: datetime
    calls: int
    failures: int
    opened_at: datetime | None = None


class RunStatus(StrEnum):
    """Where an agent run is: running a round, waiting for a person, or ended."""

    RUNNING = "running"
    WAITING = "waiting"  # for an approval or a resolution inside its current round
    SUCCEEDED = "succeeded"  # the model answered
    FAILED = "failed"  # a limit, a loop, or a failed model call ended it (`end_reason`)
    CANCELLED = "cancelled"


ENDED_RUN_STATES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRow:
    run_id: str
    tenant: str
    principal: str
    key_id: str | None
    trace_id: str
    agent: str
    agent_version: str
    subject: str | None
    context: dict[str, Any]
    status: RunStatus
    end_reason: str | None
    round: int
    task_id: str | None
    limits: dict[str, Any]
    tools: list[str]
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float
    answer: str | None
    ungrounded_claims: list[str] | None
    error: dict[str, Any] | None
    calls: dict[str, int]
    turn_start: int
    version: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    deadline: datetime | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> RunRow:
        fields = {name: row[name] for name in cls.__dataclass_fields__}
        return cls(**fields | {"status": RunStatus(row["status"])})


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMessage:
    """One entry of a run's conversation, in its endpoint's own shape."""

    seq: int
    round: int
    role: str  # user, assistant or tool
    message: dict[str, Any]


class MemoryOrigin(StrEnum):
    """Who a memory's content came from: it decides whether recall may inject it."""

    USER = "user"  # a caller wrote it (API, CLI, console)
    MODEL = "model"  # a run wrote it from what its user said
    RECEIPT = "receipt"  # a run wrote it after reading a tool's output: data, never instruction


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """One long-term memory of a subject (storage/schema.py, `memories`)."""

    memory_id: str
    tenant: str
    subject: str
    type: str
    key: str
    text: str
    value: Any
    origin: MemoryOrigin
    confidence: float
    pinned: bool
    source: dict[str, Any] | None
    written_by: str
    mark: str
    embedding: bytes | None
    embedding_model: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> MemoryRow:
        fields = {name: row[name] for name in cls.__dataclass_fields__}
        return cls(**fields | {"origin": MemoryOrigin(row["origin"])})
