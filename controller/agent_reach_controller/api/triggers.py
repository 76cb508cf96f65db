"""Trigger routes: save, read and delete triggers (API keys), and run one (a signed event)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader
from pydantic import BaseModel, ConfigDict, Field

from agent_reach.ids import new_task_id, new_trace_id
from agent_reach.states import TaskStatus
from agent_reach_controller.api import schemas
from agent_reach_controller.api.auth import Caller, require
from agent_reach_controller.api.problems import problem_responses
from agent_reach_controller.api.tasks import (
    Acceptance,
    Deps,
    accept_plan,
    mark_submitted,
    parse_json,
    read_body,
    submit_span,
)
from agent_reach_controller.identity.policy import Action
from agent_reach_controller.planning import templates
from agent_reach_controller.planning.problems import PlanInvalidError, Problem
from agent_reach_controller.services.intake import request_hash
from agent_reach_controller.services.triggers import NAME_PATTERN, SaveInput, fingerprint
from agent_reach_controller.storage.triggers import TriggerRow

router = APIRouter(prefix="/v1/triggers", tags=["triggers"])

Name = Annotated[str, Path(pattern=NAME_PATTERN, description="The trigger's name")]
PROBLEMS = problem_responses(401, 403, 404, 422, 503)


class TriggerIn(BaseModel):
    """A trigger as saved: its template, whether it runs, and its signing secret."""

    model_config = ConfigDict(extra="forbid")

    template: dict[str, Any] = Field(
        description="A plan (`steps`, `context`, `goal`…) whose step arguments and context may "
        "hold `$event` or `$event.<path>` strings, filled from each event"
    )
    enabled: bool = True
    secret: str | None = Field(
        None,
        max_length=200,
        description="The signing secret, 'whsec_' + base64 of 24 to 64 bytes, or ${env:NAME} "
        "read on the controller; omitted: a new trigger gets one made (shown once), an existing "
        "one keeps its own",
    )
    rotate_secret: bool = Field(False, description="Make a new secret (shown once in the answer)")


class TriggerOut(BaseModel):
    name: str
    tenant: str
    version: int
    enabled: bool
    owner: str = Field(description="Whose rights a run has: the principal who saved it last")
    url: str = Field(description="Where to POST signed events")
    template_sha256: str
    secret_fingerprint: str = Field(description="Tells two secrets apart; never the secret")
    created_at: schemas.Instant
    updated_at: schemas.Instant
    updated_by: str
    template: dict[str, Any] | None = None
    secret: str | None = Field(
        None, description="The secret this request made: shown this once, never again"
    )

    @classmethod
    def of(cls, row: TriggerRow, *, template: bool = False, secret: str | None = None) -> Any:
        return cls(
            name=row.name,
            tenant=row.tenant,
            version=row.version,
            enabled=row.enabled,
            owner=row.owner,
            url=f"/v1/triggers/{row.name}",
            template_sha256=row.sha256,
            secret_fingerprint=fingerprint(row.secret),
            created_at=row.created_at,
            updated_at=row.updated_at,
            updated_by=row.updated_by,
            template=row.template if template else None,
            secret=secret,
        )


class TriggerSaved(TriggerOut):
    created: bool
    new_version: bool = Field(description="False when the template was already the live one")


class TriggerVersionOut(BaseModel):
    name: str
    version: int
    template: dict[str, Any]
    sha256: str
    created_by: str
    created_at: schemas.Instant


class TriggerList(BaseModel):
    triggers: list[TriggerOut]


class TriggerRun(BaseModel):
    """What an event started: a new task (202), or the one its event id already started (200)."""

    trigger: str
    version: int
    event_id: str
    task_id: str
    trace_id: str
    status: TaskStatus
    created: bool


# The signature is a run's credential (no API key): published as a security scheme, so that
# clients and checkers know the route is not open. `webhook-id` and `webhook-timestamp` are
# signed with the body.
_SIGNATURE = APIKeyHeader(
    name="webhook-signature",
    scheme_name="StandardWebhooks",
    auto_error=False,
    description="v1,<base64 HMAC-SHA256 of '<webhook-id>.<webhook-timestamp>.<body>'> with the "
    "trigger's secret (Standard Webhooks)",
)
RUN_OPENAPI: dict[str, Any] = {
    "parameters": [
        {"name": name, "in": "header", "required": True, "schema": {"type": "string"}}
        for name in ("webhook-id", "webhook-timestamp")
    ],
    "requestBody": {
        "required": True,
        "description": "The event: any JSON, signed as Standard Webhooks prescribe",
        "content": {"application/json": {"schema": {}}},
    },
}


@router.put(
    "/{name}",
    response_model=TriggerSaved,
    responses={**PROBLEMS, **problem_responses(400, 409, 415)},
    summary="Save a trigger: its template is checked as a plan, each change a new version",
)
async def save_trigger(name: Name, body: TriggerIn, deps: Deps, who: Caller) -> TriggerSaved:
    data = SaveInput(
        name=name,
        template=body.template,
        enabled=body.enabled,
        secret=body.secret,
        rotate_secret=body.rotate_secret,
    )

    def authorize(tool: str) -> None:  # a run has the saver's rights: they must cover it
        require(deps, who, Action.SUBMIT, tool)

    try:
        saved = await deps.triggers.save(data, who=who, catalog=deps.catalog, authorize=authorize)
    except PlanInvalidError as exc:  # pointers into the body: under /template
        raise PlanInvalidError([_under_template(p) for p in exc.problems]) from None
    out = TriggerOut.of(saved.trigger, template=True, secret=saved.secret)
    return TriggerSaved(**out.model_dump(), created=saved.created, new_version=saved.new_version)


def _under_template(problem: Problem) -> Problem:
    return Problem(pointer="/template" + problem.pointer, code=problem.code, detail=problem.detail)


@router.get("", response_model=TriggerList, responses=PROBLEMS, summary="Your tenant's triggers")
async def list_triggers(deps: Deps, who: Caller) -> TriggerList:
    rows = await deps.triggers.list(tenant=who.tenant)
    return TriggerList(triggers=[TriggerOut.of(r) for r in rows])


@router.get("/{name}", response_model=TriggerOut, responses=PROBLEMS, summary="One trigger")
async def get_trigger(name: Name, deps: Deps, who: Caller) -> TriggerOut:
    result: TriggerOut = TriggerOut.of(
        await deps.triggers.get(name, tenant=who.tenant), template=True
    )
    return result


@router.get(
    "/{name}/versions/{version}",
    response_model=TriggerVersionOut,
    responses=PROBLEMS,
    summary="One version of a trigger's template, as a task it started ran it",
)
async def get_trigger_version(
    name: Name, version: Annotated[int, Path(ge=1)], deps: Deps, who: Caller
) -> TriggerVersionOut:
    row = await deps.triggers.version(name, version, tenant=who.tenant)
    return TriggerVersionOut(
        name=row.name,
        version=row.version,
        template=row.template,
        sha256=row.sha256,
        created_by=row.created_by,
        created_at=row.created_at,
    )


@router.delete("/{name}", status_code=204, responses=PROBLEMS, summary="Delete a trigger")
async def delete_trigger(name: Name, deps: Deps, who: Caller) -> Response:
    await deps.triggers.delete(name, who=who, tenant=who.tenant)
    return Response(status_code=204)


@router.post(
    "/{name}",
    status_code=202,
    response_model=TriggerRun,
    responses={
        200: {"model": TriggerRun, "description": "This event id already started a task"},
        **problem_responses(400, 401, 403, 409, 413, 415, 422, 429, 503),
    },
    openapi_extra=RUN_OPENAPI,
    summary="Run a trigger: a signed event starts its template (no API key: the signature is)",
)
async def run_trigger(
    name: Name,
    request: Request,
    deps: Deps,
    _signature: Annotated[str | None, Depends(_SIGNATURE)],
) -> Response:
    body = await read_body(request, deps.settings.max_body_bytes)
    event = await deps.triggers.open(name, body, request.headers)
    payload = parse_json(body)
    trigger = event.trigger
    origin = {"name": trigger.name, "version": trigger.version, "event_id": event.event_id}
    plan = templates.fill(trigger.template, payload, origin)
    to = Acceptance(
        task_id=new_task_id(),
        trace_id=new_trace_id(),  # each run is its own trace
        parent_span_id=None,
        idempotency_key=event.event_id,
        dialect="plan",
        atomic=True,
        key_scope=f"trigger:{trigger.name}",
        fingerprint=request_hash(payload),
    )
    origin_attributes = {
        "agent_reach.trigger": trigger.name,
        "agent_reach.trigger_version": trigger.version,
        "agent_reach.event_id": event.event_id,
    }
    with submit_span(
        deps, event.owner, to, parent_span_id=None, attributes=origin_attributes
    ) as current:
        submitted, steps = await accept_plan(deps, event.owner, plan, to)
        mark_submitted(current, submitted, steps)
    run = TriggerRun(
        trigger=trigger.name,
        version=trigger.version,
        event_id=event.event_id,
        task_id=submitted.task_id,
        trace_id=submitted.trace_id,
        status=submitted.status,
        created=submitted.created,
    )
    return JSONResponse(
        run.model_dump(mode="json"),
        status_code=202 if submitted.created else 200,
        headers={"Location": f"/v1/tasks/{submitted.task_id}"},
    )
