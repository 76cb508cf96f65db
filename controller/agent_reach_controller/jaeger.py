"""A task's trace rebuilt from its event log, in the JSON Jaeger's UI loads ("Upload JSON").

No tracing backend is needed: the event log already says when each attempt became ready, was
leased by which executor, and how it ended. The spans get the ids the live spans had (see
`agent_reach.telemetry`), so this file and an OTLP export of the same task line up:

    submit_task                       the task, from acceptance to its end; step events as logs
      dispatch_step {tool}            one per attempt: queued (ready) → leased
        execute_tool {tool}           that attempt on its executor: leased → result

The format is Jaeger's query-API JSON, `{"data": [trace]}`, with times in microseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agent_reach import telemetry
from agent_reach.states import TERMINAL_TASK_STATES
from agent_reach_controller.domain.records import EventRow, StepRow, TaskRow

CONTROLLER = "agent-reach-controller"
EXECUTOR = "agent-reach-executor"
# Event data worth showing in a span's logs (never arguments or outputs).
_LOGGED_DATA = ("by", "reason", "executor_id", "error")


def _us(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000)


def _tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    return {"key": key, "type": "string", "value": str(value)}


def _tags(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [_tag(k, v) for k, v in values.items() if v is not None]


def _log(event: EventRow) -> dict[str, Any]:
    fields: dict[str, Any] = {"event": event.kind}
    if event.step_id:
        fields["step_id"] = event.step_id
    if event.attempt is not None:
        fields["attempt"] = event.attempt
    if event.to_status:
        fields["status"] = event.to_status
    for key in _LOGGED_DATA:
        value = (event.data or {}).get(key)
        if key == "error" and isinstance(value, dict):
            fields["error.code"] = value.get("code")
            fields["error.message"] = value.get("message")
        elif value not in (None, ""):
            fields[key] = value
    return {"timestamp": _us(event.created_at), "fields": _tags(fields)}


class _Builder:
    def __init__(self, task: TaskRow, now: datetime) -> None:
        self.task = task
        self.now = now
        self.spans: list[dict[str, Any]] = []
        self.processes: dict[str, dict[str, Any]] = {"p1": {"serviceName": CONTROLLER, "tags": []}}
        self._executors: dict[str, str] = {}

    def process_of(self, executor_id: str) -> str:
        if executor_id not in self._executors:
            pid = f"p{len(self.processes) + 1}"
            self._executors[executor_id] = pid
            self.processes[pid] = {
                "serviceName": EXECUTOR,
                "tags": _tags({"agent_reach.executor_id": executor_id}),
            }
        return self._executors[executor_id]

    def span(  # noqa: PLR0913 - one span's facts
        self,
        name: str,
        span_id: str,
        *,
        parent: str | None,
        start: datetime,
        end: datetime,
        process: str = "p1",
        tags: Mapping[str, Any] | None = None,
        logs: Sequence[dict[str, Any]] = (),
    ) -> None:
        trace_id = self.task.trace_id
        self.spans.append(
            {
                "traceID": trace_id,
                "spanID": span_id,
                "operationName": name,
                "references": (
                    [{"refType": "CHILD_OF", "traceID": trace_id, "spanID": parent}]
                    if parent
                    else []
                ),
                "startTime": _us(start),
                "duration": max(0, _us(end) - _us(start)),
                "tags": _tags(tags or {}),
                "logs": list(logs),
                "processID": process,
                "warnings": None,
            }
        )


def _attempts(builder: _Builder, step: StepRow, events: Sequence[EventRow], root: str) -> None:
    """A dispatch and an execute span for every lease of `step`."""
    task = builder.task
    ready_at: datetime | None = None
    for index, event in enumerate(events):
        if event.to_status == "ready":
            ready_at = event.created_at
        if event.kind != "lease" or event.attempt is None:
            continue
        attempt = event.attempt
        leased_at = event.created_at
        executor_id = str((event.data or {}).get("executor_id", "unknown"))
        dispatch = telemetry.dispatch_span_id(task.task_id, step.step_id, attempt)
        builder.span(
            f"{telemetry.DISPATCH} {step.tool}",
            dispatch,
            parent=root,
            start=ready_at or leased_at,
            end=leased_at,
            tags={
                "span.kind": "producer",
                telemetry.STEP_ID: step.step_id,
                telemetry.ATTEMPT: attempt,
                telemetry.EXECUTOR_ID: executor_id,
                telemetry.ENVIRONMENT: step.environment,
            },
        )
        # A step runs one attempt at a time: the next move out of `running` ends this one (its
        # event carries the attempt it moved to, e.g. a retry's next attempt).
        later = itertools.islice(events, index + 1, None)  # no copy: a step may retry for days
        ended = next((e for e in later if e.from_status == "running"), None)
        outcome = ended.kind if ended is not None else "running"
        error = (ended.data or {}).get("error") if ended is not None else None
        code = error.get("code") if isinstance(error, dict) else None
        builder.span(
            f"{telemetry.EXECUTE} {step.tool}",
            telemetry.execute_span_id(task.task_id, step.step_id, attempt),
            parent=dispatch,
            start=leased_at,
            end=ended.created_at if ended is not None else builder.now,
            process=builder.process_of(executor_id),
            tags={
                telemetry.GEN_AI_OPERATION: "execute_tool",
                telemetry.GEN_AI_TOOL_NAME: step.tool,
                telemetry.GEN_AI_TOOL_CALL_ID: step.step_id,
                telemetry.GEN_AI_TOOL_TYPE: "function",
                telemetry.ATTEMPT: attempt,
                telemetry.ENVIRONMENT: step.environment,
                telemetry.OUTCOME: outcome,
                telemetry.ERROR_TYPE: code,
                "error": True if outcome != "succeed" and ended is not None else None,
            },
        )


def jaeger_trace(
    task: TaskRow,
    steps: Iterable[StepRow],
    events: Sequence[EventRow],
    *,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The task's trace as Jaeger's UI reads it: `{"data": [{traceID, spans, processes}]}`."""
    now = now or datetime.now(UTC)
    builder = _Builder(task, now)
    root = telemetry.task_span_id(task.task_id)
    by_step: dict[str, list[EventRow]] = {}
    for event in events:
        if event.step_id is not None:
            by_step.setdefault(event.step_id, []).append(event)
    for step in steps:
        _attempts(builder, step, by_step.get(step.step_id, []), root)
    last = max((e.created_at for e in events), default=task.created_at)
    builder.span(
        telemetry.SUBMIT,
        root,
        parent=None,
        start=task.created_at,
        end=task.finished_at or (last if task.status in TERMINAL_TASK_STATES else now),
        tags={
            telemetry.TASK_ID: task.task_id,
            "agent_reach.goal": task.goal,
            "agent_reach.status": task.status.value,
            "agent_reach.source": task.source,
            "agent_reach.tenant": task.tenant,
            telemetry.ENVIRONMENT: task.environment,
            "agent_reach.principal": task.principal,
            "agent_reach.caller_parent_span_id": task.parent_span_id,
        },
        logs=[_log(e) for e in events if e.kind != "lease"],
    )
    builder.spans.sort(key=lambda s: (s["startTime"], s["operationName"]))
    return {
        "data": [
            {
                "traceID": task.trace_id,
                "spans": builder.spans,
                "processes": builder.processes,
                "warnings": None,
            }
        ]
    }
