"""Domain rows → response models, including the model-facing tool messages."""

from __future__ import annotations

from agent_reach_controller.api import schemas
from agent_reach_controller.receipts import render_receipt_dict
from agent_reach_controller.state.tasks import TaskView


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
                tool_call_id=s.step_id, content=render_receipt_dict(s.receipt, budget=budget)
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
    )
