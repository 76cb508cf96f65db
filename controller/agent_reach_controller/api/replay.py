"""Replay over HTTP: a task's timeline and dry run, and a live re-run in the same trace."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from agent_reach import telemetry
from agent_reach.ids import new_task_id
from agent_reach_controller.api import schemas
from agent_reach_controller.api.auth import Caller
from agent_reach_controller.api.problems import V1_PROBLEMS
from agent_reach_controller.api.tasks import (
    MAX_EVENTS,
    PROBLEMS,
    Acceptance,
    Deps,
    accept_plan,
    submit_span,
)
from agent_reach_controller.planning.dialects import dialect_named
from agent_reach_controller.replay import dry_run, timeline

router = APIRouter(prefix="/v1/tasks", tags=["replay"], responses=V1_PROBLEMS)


@router.get(
    "/{task_id}/replay",
    response_model=schemas.ReplayOut,
    responses=PROBLEMS,
    summary="The task's timeline, and a dry run of its plan on the recorded results",
)
async def replay(task_id: str, deps: Deps, who: Caller) -> schemas.ReplayOut:
    view, events = await deps.queries.history(task_id, tenant=who.tenant, up_to=MAX_EVENTS)
    await deps.registry.ensure((s.tool, s.tool_version) for s in view.steps)
    replayed = dry_run(
        view.task,
        view.steps,
        tool_of=deps.registry.get,
        budget=deps.settings.receipt_budget_chars,
    )
    return schemas.ReplayOut(
        task_id=task_id,
        trace_id=view.task.trace_id,
        request=view.task.request,
        timeline=[
            schemas.MomentOut.model_validate(m, from_attributes=True) for m in timeline(events)
        ],
        truncated=len(events) >= MAX_EVENTS,
        dry_run=schemas.DryRunOut(
            finished=replayed.finished,
            identical=replayed.identical,
            steps=[
                schemas.StepReplayOut.model_validate(s, from_attributes=True)
                for s in replayed.steps
            ],
        ),
    )


@router.post(
    "/{task_id}/rerun",
    status_code=202,
    response_model=schemas.TaskAccepted,
    responses=PROBLEMS,
    summary="Submit the task's request again, live, as a new task in the same trace",
)
async def rerun(task_id: str, deps: Deps, who: Caller) -> JSONResponse:
    """The same plan, validated against today's catalogue and the caller's grants, run anew.

    The new task joins the original's trace (its submit span is a child of the original's), so
    both runs read side by side in a trace viewer.
    """
    view = await deps.queries.get(task_id, tenant=who.tenant)
    new_id = new_task_id()
    original = telemetry.task_span_id(task_id)
    to = Acceptance(
        task_id=new_id,
        trace_id=view.task.trace_id,
        parent_span_id=original,
        dialect=dialect_named(view.task.source).name,
    )
    with submit_span(
        deps, who, to, parent_span_id=original, attributes={"agent_reach.rerun_of": task_id}
    ):
        submitted, _ = await accept_plan(deps, who, view.task.request, to)
    accepted = schemas.TaskAccepted(
        task_id=submitted.task_id, trace_id=submitted.trace_id, status=submitted.status
    )
    return JSONResponse(
        accepted.model_dump(mode="json"),
        status_code=202,
        headers={"Location": f"/v1/tasks/{submitted.task_id}"},
    )
