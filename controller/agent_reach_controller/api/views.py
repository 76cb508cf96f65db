"""Domain rows → response models, including the model-facing tool messages."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agent_reach.states import TERMINAL_STEP_STATES, StepStatus
from agent_reach_controller.api import schemas
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning import fanout
from agent_reach_controller.planning.dialects import Answer, dialect_named
from agent_reach_controller.receipts import output_handle, render_receipt_dict
from agent_reach_controller.services.queries import TaskView

# The roles that may approve a tool's steps (to say who must decide on a pending call).
Approvers = Callable[[str], list[str]]


def task_out(view: TaskView, *, budget: int, approvers: Approvers | None = None) -> schemas.TaskOut:
    task = view.task
    steps = [
        schemas.StepOut(
            step_id=s.step_id,
            tool=s.tool,
            tool_version=s.tool_version,
            status=s.status,
            attempt=s.attempt,
            max_attempts=s.max_attempts,
            depends_on=list(s.depends_on),
            when=s.when_expr,
            args=s.args,
            resolved_args=s.resolved_args,
            idempotency_key=s.idempotency_key,
            run_at=s.run_at,
            not_before=s.not_before,
            started_at=s.started_at,
            finished_at=s.finished_at,
            receipt=s.receipt,
        )
        for s in view.steps
    ]
    turn = turn_replies(view, budget=budget, approvers=approvers)
    messages = None
    if turn is not None and turn.dialect == "openai_chat":
        messages = [schemas.ToolMessage.model_validate(r) for r in turn.replies]
    return schemas.TaskOut(
        task_id=task.task_id,
        trace_id=task.trace_id,
        status=task.status,
        error=_error(view),
        goal=task.goal,
        source=task.source,
        run_id=task.run_id,
        subject=task.subject,
        environment=task.environment,
        created_at=task.created_at,
        updated_at=task.updated_at,
        finished_at=task.finished_at,
        steps=steps,
        tool_messages=messages,
        turn=turn,
        caps=_caps(view),
        usage=_usage(view),
    )


def _error(view: TaskView) -> schemas.TaskErrorOut | None:
    error = view.error
    if error is None:
        return None
    return schemas.TaskErrorOut(code=error.code, message=error.message, step_id=error.step_id)


def _caps(view: TaskView) -> dict[str, schemas.CapUse] | None:
    limits = view.task.caps or {}
    used = view.usage or {}
    if not limits and not used:
        return None
    return {
        name: schemas.CapUse(limit=limits.get(name), used=used.get(name, 0.0))
        for name in sorted({*limits, *used})
    }


def _usage(view: TaskView) -> schemas.TaskUsage:
    task = view.task
    end = task.finished_at or datetime.now(UTC)
    return schemas.TaskUsage(
        input_tokens=task.input_tokens,
        output_tokens=task.output_tokens,
        tool_calls=view.tool_calls,
        duration_ms=max(0, int((end - task.created_at).total_seconds() * 1000)),
    )


# Which of a fan-out step's children says best what it waits on: a person first.
_WAIT_ORDER = (
    StepStatus.AWAITING_APPROVAL,
    StepStatus.OUTCOME_UNKNOWN,
    StepStatus.RUNNING,
    StepStatus.READY,
    StepStatus.BLOCKED,
)


def _most_waited_on(step: StepRow) -> int:
    return _WAIT_ORDER.index(step.status) if step.status in _WAIT_ORDER else len(_WAIT_ORDER)


def turn_replies(
    view: TaskView, *, budget: int, approvers: Approvers | None = None
) -> schemas.TurnReplies | None:
    """A model's turn answered in its dialect: a reply per ended call (its receipt as the model
    reads it), the others pending. None for a plan."""
    task = view.task
    dialect = dialect_named(task.source)
    if not dialect.per_call:
        return None
    url = f"/v1/tasks/{task.task_id}/replies"
    now = datetime.now(UTC)
    answers, pending = [], []
    children: dict[str, list[StepRow]] = {}
    for s in view.steps:
        if (parent := fanout.parent_of(s.step_id)) is not None:
            children.setdefault(parent, []).append(s)
    for s in sorted(view.steps, key=lambda s: s.position):
        if s.step_id not in children and fanout.parent_of(s.step_id) is not None:
            continue  # a fan-out step's child: its call is answered by the step
        if s.status in TERMINAL_STEP_STATES and s.receipt is not None:
            text = render_receipt_dict(
                s.receipt, budget=budget, handle=output_handle(task.task_id, s.step_id)
            )
            answers.append(
                Answer(call_id=s.step_id, text=text, is_error=s.status != StepStatus.SUCCEEDED)
            )
            continue
        # A fan-out step waits on what its children wait on.
        w = min(children[s.step_id], key=_most_waited_on) if s.step_id in children else s
        asking = w.status == StepStatus.AWAITING_APPROVAL
        held = w.status == StepStatus.READY and w.not_before is not None and w.not_before > now
        pending.append(
            schemas.PendingCall(
                call_id=s.step_id,
                status=w.status,
                waiting_for="start" if held else _WAITING_FOR.get(w.status, "executor"),
                approvers=approvers(w.tool) if asking and approvers is not None else None,
                decide_by=w.decide_by if asking else None,
                replies_url=url,
            )
        )
    return schemas.TurnReplies(
        task_id=task.task_id,
        status=task.status,
        dialect=dialect.name,
        replies=dialect.replies(answers),
        pending=pending,
    )


_WAITING_FOR: dict[StepStatus, Any] = {
    StepStatus.AWAITING_APPROVAL: "approval",
    StepStatus.BLOCKED: "dependencies",
    StepStatus.OUTCOME_UNKNOWN: "operator",
}
