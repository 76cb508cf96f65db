"""Domain rows → response models, including the model-facing tool messages."""

from __future__ import annotations

from datetime import UTC, datetime

from agent_reach_controller.api import schemas
from agent_reach_controller.receipts import output_handle, render_receipt_dict
from agent_reach_controller.services.queries import TaskView


def task_out(view: TaskView, *, budget: int) -> schemas.TaskOut:
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
            not_before=s.not_before,
            started_at=s.started_at,
            finished_at=s.finished_at,
            receipt=s.receipt,
        )
        for s in view.steps
    ]
    messages = None
    if task.source == "openai":
        messages = [
            schemas.ToolMessage(
                tool_call_id=s.step_id,
                content=render_receipt_dict(
                    s.receipt,
                    budget=budget,
                    handle=output_handle(task.task_id, s.step_id),
                ),
            )
            for s in view.steps
            if s.receipt is not None
        ]
    return schemas.TaskOut(
        task_id=task.task_id,
        trace_id=task.trace_id,
        status=task.status,
        goal=task.goal,
        source=task.source,
        created_at=task.created_at,
        updated_at=task.updated_at,
        finished_at=task.finished_at,
        steps=steps,
        tool_messages=messages,
        caps=_caps(view),
        usage=_usage(view),
    )


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
