"""Task routes: submit (plans or OpenAI tool calls), read, list, cancel, events."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agent_reach import telemetry
from agent_reach.ids import new_task_id, new_trace_id, parse_traceparent
from agent_reach.states import TERMINAL_TASK_STATES
from agent_reach_controller.api import events, openapi, schemas
from agent_reach_controller.api.auth import Caller, lacking, require, require_call
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_response, problem_responses
from agent_reach_controller.api.views import Approvers, task_out, turn_replies
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.identity.policy import Action, Principal
from agent_reach_controller.jaeger import jaeger_trace
from agent_reach_controller.planning import schedule
from agent_reach_controller.planning.dialects import DialectName
from agent_reach_controller.planning.plan import Plan, parse_plan
from agent_reach_controller.planning.problems import PlanInvalidError, Problem, ProblemCode
from agent_reach_controller.receipts import redact_output
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput, Submitted
from agent_reach_controller.services.operator import (
    ApprovalInput,
    RescheduleInput,
    ResolveInput,
)
from agent_reach_controller.storage.catalog import CatalogChangedError
from agent_reach_controller.storage.listings import TaskFilter

# Every route here that reads a body reads JSON: any other media type is a 415, by the app's
# own dependency (api/media.py, declared once in api/app.py for every route).
router = APIRouter(prefix="/v1/tasks", tags=["tasks"], responses=V1_PROBLEMS)


async def components(request: Request) -> Components:
    app_components: Components = request.app.state.components
    return app_components


Deps = Annotated[Components, Depends(components)]

SUBMIT_BODY = {"requestBody": openapi.submit_body()}
# The longest Idempotency-Key a submit takes (a longer one is a 422).
IDEMPOTENCY_KEY_MAX = 255
PROBLEMS = problem_responses(400, 404, 409, 413, 429)
# Routes with a JSON body: also 415 for a body of another media type.
BODY_PROBLEMS = {**PROBLEMS, **problem_responses(415)}
# A trace or a replay is built from at most this many events (a task that retried for days
# stays bounded).
MAX_EVENTS = 50_000
# With ?wait=…, a task that ended in time is 200 with its receipts; otherwise 202 as without.
SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": schemas.TaskOut, "description": "The task ended within ?wait"},
    **BODY_PROBLEMS,
}


async def _validate(
    deps: Components, who: Principal, body: Any, to: Acceptance, environment: str
) -> tuple[Plan, int]:
    """The plan checked against the catalogue this replica holds, and that catalogue's revision
    (the submit transaction checks it is still current), for the caller's tenant's environment
    (in `sandbox`, a tool that writes there without a sandbox target is refused);
    PlanInvalidError → 422, every problem.

    A refused plan, or a turn with a refused call, is checked once more if the catalogue moved
    meanwhile: it may name a tool another replica has just created, enabled or changed.
    """

    def permits(tool: str) -> bool:
        spec = deps.catalog.get(tool)
        return spec is not None and lacking(deps, who, spec) is None

    def parse() -> Plan:
        return parse_plan(
            body,
            deps.catalog,
            dialect=to.dialect,
            atomic=to.atomic,
            permits=permits,
            environment=environment,
            outside_run=True,
        )

    revision = deps.registry.revision
    try:
        plan = parse()
    except PlanInvalidError:
        await deps.registry.refresh()
        if deps.registry.revision == revision:
            raise
        revision = deps.registry.revision
        plan = parse()
    if plan.refused:
        await deps.registry.refresh()
        if deps.registry.revision != revision:
            revision = deps.registry.revision
            plan = parse()
    for tool, version in sorted({(s.tool, s.tool_version) for s in plan.steps}):
        require_call(deps, who, deps.registry.get(tool, version))
    if plan.webhook_url is not None:
        _check_webhook(deps, plan.webhook_url)
    return plan, revision


def _check_webhook(deps: Components, url: str) -> None:
    """A task webhook's URL must name a host the operator allows (the controller POSTs there)."""
    allowed = deps.settings.task_webhook_hosts
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not allowed:
        detail = "this controller sends no task webhooks (task_webhook_hosts is empty)"
    elif parts.username is not None or parts.password is not None:
        detail = "a webhook URL may not carry credentials before its host"
    elif not any(fnmatchcase(host, pattern.lower()) for pattern in allowed):
        detail = f"host {host!r} is not one this controller may call"
    else:
        return
    raise PlanInvalidError(
        [Problem(pointer="/webhook/url", code=ProblemCode.FORBIDDEN, detail=detail)]
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Acceptance:
    """Where a plan being accepted goes: its task id, trace, and the span that parents it."""

    task_id: str
    trace_id: str
    parent_span_id: str | None  # stored with the task (the caller's span, or the original run's)
    idempotency_key: str | None = None
    dialect: str | None = None  # None: recognised from the body
    atomic: bool = False  # a model's turn refused whole for one bad call, as a plan is
    key_scope: str | None = None  # see SubmitInput: a trigger's events have their own scope
    fingerprint: str | None = None


async def accept_plan(
    deps: Components, who: Principal, body: Any, to: Acceptance
) -> tuple[Submitted, int]:
    """Validate `body` for `who`, admit it and store it as a task; (what was stored, its steps).

    Runs inside the task's submit span (`telemetry.task_span_id(to.task_id)`) and adds the
    validate and store spans under it.
    """
    root = telemetry.task_span_id(to.task_id)
    environment = deps.environment_of(who.tenant)
    with telemetry.span(
        telemetry.VALIDATE,
        trace_id=to.trace_id,
        parent_span_id=root,
        attributes={telemetry.ENVIRONMENT: environment},
    ) as span:
        plan, revision = await _validate(deps, who, body, to, environment)
        span.set_attribute("agent_reach.dialect", plan.source)
        for call in plan.refused:  # each stored as a failed step, its reply an error
            span.add_event(
                "call_refused",
                {"agent_reach.step_id": call.step_id, "agent_reach.error_code": call.code.value},
            )
        per_caller = deps.settings.max_tasks_in_flight_per_principal
        if per_caller is not None:
            in_flight = await deps.queries.in_flight(who.tenant, who.name, up_to=per_caller)
            if in_flight >= per_caller:
                raise TooManyInFlightError(who.name, in_flight, per_caller)
    with (
        telemetry.span(
            telemetry.STORE,
            trace_id=to.trace_id,
            parent_span_id=root,
            attributes={telemetry.ENVIRONMENT: environment},
        ),
        deps.admission.admit(len(plan.steps), limit=deps.settings.max_queued_steps) as admitted,
    ):
        submit = SubmitInput(
            plan=plan,
            request=body,
            idempotency_key=to.idempotency_key,
            principal=who.name,
            tenant=who.tenant,
            key_id=who.key_id,
            task_id=to.task_id,
            trace_id=to.trace_id,
            parent_span_id=to.parent_span_id,
            catalog_revision=revision,
            environment=environment,
            key_scope=to.key_scope,
            fingerprint=to.fingerprint,
        )
        try:
            submitted = await deps.intake.submit(submit)
        except CatalogChangedError:  # another replica changed a tool: validate again
            await deps.registry.refresh()
            plan, _ = await _validate(deps, who, body, to, environment)  # as many steps
            submitted = await deps.intake.submit(replace(submit, plan=plan, catalog_revision=None))
        admitted.keep = submitted.created
    return submitted, len(plan.steps)


@contextlib.contextmanager
def submit_span(
    deps: Components,
    who: Principal,
    to: Acceptance,
    *,
    parent_span_id: str | None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """The task's submit span, the root `accept_plan` runs in: its id is derived from the
    task's, and it says the task and where it runs (and any `attributes` of the entry)."""
    with telemetry.span(
        telemetry.SUBMIT,
        trace_id=to.trace_id,
        span_id=telemetry.task_span_id(to.task_id),
        parent_span_id=parent_span_id,
        attributes={
            telemetry.TASK_ID: to.task_id,
            telemetry.ENVIRONMENT: deps.environment_of(who.tenant),
            **(attributes or {}),
        },
    ) as span:
        yield span


@contextlib.contextmanager
def operator_span(
    name: str,
    who: Principal,
    *,
    step: StepRow | None = None,
    trace_id: str | None = None,
    task_id: str | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Any]:
    """A person's action on a task (cancel, approve, resolve, reschedule), in the task's own
    trace under its submit span, naming who acted: from the API or the console alike."""
    task = step.task_id if step is not None else task_id or ""
    facts: dict[str, Any] = {telemetry.TASK_ID: task, telemetry.PRINCIPAL: who.name}
    if step is not None:
        facts[telemetry.STEP_ID] = step.step_id
    with telemetry.span(
        name,
        trace_id=step.trace_id if step is not None else trace_id or "",
        parent_span_id=telemetry.task_span_id(task),
        attributes={**facts, **(attributes or {})},
    ) as span:
        yield span


def mark_submitted(span: Any, submitted: Submitted, steps: int) -> None:
    """What a submit span says once the task is stored (or found, for a repeated key)."""
    span.set_attribute(telemetry.TASK_ID, submitted.task_id)
    span.set_attribute("agent_reach.steps", steps)
    if not submitted.created:
        span.set_attribute("agent_reach.idempotent_replay", True)


async def _read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing more than `limit` bytes before buffering them."""
    return parse_json(await read_body(request, limit))


def parse_json(body: bytes) -> Any:
    """A body as JSON (NaN and Infinity refused); BadJsonError otherwise."""
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise BadJsonError(str(exc)) from None


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refusing more than `limit` bytes before buffering them (413)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLargeError(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class BodyTooLargeError(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


class TooManyInFlightError(Exception):
    """The caller already has as many unfinished tasks as it may."""

    def __init__(self, who: str, in_flight: int, limit: int) -> None:
        super().__init__(
            f"{who} has {in_flight:,} unfinished tasks; the limit per caller is {limit:,}"
        )


class BadJsonError(Exception):
    """The body is not JSON."""


class NotATurnError(Exception):
    """Replies were asked of a task submitted as a plan."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id} was submitted as a plan: read its receipts in its steps")


class SubmitQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    wait: float = Field(0, ge=0, le=3600, description="Seconds to wait for the end")
    dialect: DialectName | None = Field(
        None, description="The body's dialect, when it cannot be told from the body"
    )
    atomic: bool = Field(
        False,
        description="A model's turn: refuse it whole (422) for one bad call, as a plan is, "
        "instead of answering that call with an error reply",
    )


@router.post(
    "",
    status_code=202,
    response_model=schemas.TaskAccepted | schemas.TaskOut,
    responses=SUBMIT_RESPONSES,
    openapi_extra=SUBMIT_BODY,
    summary="Submit a plan, or a model's turn (OpenAI Chat or Responses, Anthropic)",
)
async def submit_task(
    request: Request,
    deps: Deps,
    who: Caller,
    ask: Annotated[SubmitQuery, Query()],
    idempotency_key: Annotated[str | None, Header(max_length=IDEMPOTENCY_KEY_MAX)] = None,
    traceparent: Annotated[str | None, Header()] = None,
) -> Response:
    submitted = await take_submit(
        deps,
        who,
        request,
        idempotency_key=idempotency_key,
        traceparent=traceparent,
        ask=ask,
    )
    if ask.wait > 0:
        view = await deps.queries.wait(
            submitted.task_id, within=min(ask.wait, deps.settings.max_wait_seconds)
        )
        status = 200 if view.task.status in TERMINAL_TASK_STATES else 202
        out = task_out(view, budget=deps.settings.receipt_budget_chars, approvers=approvers(deps))
        return JSONResponse(
            out.model_dump(mode="json"), status_code=status, headers=_location(submitted)
        )
    return accepted_response(submitted)


async def take_submit(
    deps: Components,
    who: Principal,
    request: Request,
    *,
    idempotency_key: str | None,
    traceparent: str | None,
    ask: SubmitQuery | None = None,
) -> Submitted:
    """A submit once its caller is known: the body read, validated and stored as a task in its
    submit span. The route and its short way in (api/lean_submit.py) both come here."""
    parent = parse_traceparent(traceparent)
    # The request's server span (FastAPI's, when tracing is on) has already continued a caller's
    # traceparent; without one, the caller's header is the parent; else a new trace starts.
    http_span = telemetry.current_ids() or parent
    trace_id = http_span[0] if http_span else new_trace_id()
    to = Acceptance(
        task_id=new_task_id(),
        trace_id=trace_id,
        parent_span_id=parent[1] if parent else None,
        idempotency_key=idempotency_key,
        dialect=ask.dialect if ask else None,
        atomic=ask.atomic if ask else False,
    )
    with submit_span(deps, who, to, parent_span_id=http_span[1] if http_span else None) as current:
        body = await _read_json(request, deps.settings.max_body_bytes)
        submitted, steps = await accept_plan(deps, who, body, to)
        mark_submitted(current, submitted, steps)
    return submitted


def accepted_response(submitted: Submitted) -> Response:
    """202: the task is stored (or was, for a repeated Idempotency-Key); where to read it."""
    accepted = schemas.TaskAccepted(
        task_id=submitted.task_id, trace_id=submitted.trace_id, status=submitted.status
    )
    return JSONResponse(
        accepted.model_dump(mode="json"), status_code=202, headers=_location(submitted)
    )


def _location(submitted: Submitted) -> dict[str, str]:
    return {"Location": f"/v1/tasks/{submitted.task_id}"}


@router.get("/{task_id}", response_model=schemas.TaskOut, responses=PROBLEMS)
async def get_task(task_id: str, deps: Deps, who: Caller) -> schemas.TaskOut:
    view = await deps.queries.get(task_id, tenant=who.tenant)
    return task_out(view, budget=deps.settings.receipt_budget_chars, approvers=approvers(deps))


def approvers(deps: Components) -> Approvers:
    """Who may decide on a tool's steps, as a pending call says."""
    return lambda tool: deps.policy.roles_allowed(Action.APPROVE, tool)


@router.get(
    "/{task_id}/replies",
    response_model=schemas.TurnReplies,
    responses=PROBLEMS,
    summary="A model's turn answered in its own dialect (after a 202, until nothing is pending)",
)
async def get_turn_replies(
    task_id: str,
    deps: Deps,
    who: Caller,
    wait: Annotated[float, Query(ge=0, le=3600, description="Seconds to wait for the end")] = 0,
) -> schemas.TurnReplies:
    await deps.queries.check_tenant(task_id, who.tenant)
    if wait > 0:
        view = await deps.queries.wait(task_id, within=min(wait, deps.settings.max_wait_seconds))
    else:
        view = await deps.queries.get(task_id, tenant=who.tenant)
    turn = turn_replies(view, budget=deps.settings.receipt_budget_chars, approvers=approvers(deps))
    if turn is None:
        raise NotATurnError(task_id)
    return turn


@router.get(
    "",
    response_model=schemas.TaskPage,
    responses=PROBLEMS,
    summary="Your tenant's tasks, newest first, by status, tool, principal and time",
)
async def list_tasks(
    deps: Deps, who: Caller, ask: Annotated[schemas.TaskListQuery, Query()]
) -> schemas.TaskPage:
    """Every filter combines with the others and with keyset paging (`before`, newest first)."""
    limit = ask.limit
    rows = await deps.queries.find_tasks(
        TaskFilter(
            tenant=who.tenant,
            status=ask.status,
            principal=ask.principal,
            tool=ask.tool,
            since=ask.since,
            until=ask.until,
            before=ask.before,
            limit=limit,
        )
    )
    return schemas.TaskPage(
        tasks=[schemas.TaskSummary.model_validate(t) for t in rows],
        next_before=rows[-1].task_id if len(rows) == limit else None,
    )


@router.post("/{task_id}/cancel", response_model=schemas.TaskOut, responses=PROBLEMS)
async def cancel_task(task_id: str, deps: Deps, who: Caller) -> schemas.TaskOut:
    trace_id = await deps.queries.check_tenant(task_id, who.tenant)
    with operator_span(telemetry.CANCEL, who, trace_id=trace_id, task_id=task_id):
        view = await deps.operator.cancel(
            task_id, reason=f"cancelled by {who.name}", by=(who.name, who.tenant)
        )
    return task_out(view, budget=deps.settings.receipt_budget_chars)


@router.post(
    "/{task_id}/steps/{step_id}/resolve",
    response_model=schemas.TaskOut,
    responses=BODY_PROBLEMS,
    summary="Resolve a step whose outcome is unknown (operators)",
)
async def resolve_step(
    task_id: str, step_id: str, verdict: schemas.ResolveIn, deps: Deps, who: Caller
) -> schemas.TaskOut:
    step = await _require_approver(deps, who, task_id, step_id)
    attributes = {telemetry.DECISION: verdict.action}
    with operator_span(telemetry.RESOLVE, who, step=step, attributes=attributes):
        view = await deps.operator.resolve(
            ResolveInput(
                task_id=task_id,
                step_id=step_id,
                action=verdict.action,
                by=who.name if verdict.by in (None, who.name) else f"{who.name} for {verdict.by}",
                reason=verdict.reason,
                output=verdict.output,
                tenant=who.tenant,
            )
        )
    return task_out(view, budget=deps.settings.receipt_budget_chars)


@router.post(
    "/{task_id}/steps/{step_id}/schedule",
    response_model=schemas.RescheduleOut,
    responses=BODY_PROBLEMS,
    summary="Move a step that has not started to another time (those who may submit its tool)",
)
async def reschedule_step(
    task_id: str, step_id: str, when: schemas.ScheduleIn, deps: Deps, who: Caller
) -> schemas.RescheduleOut:
    """A fan-out or verified step moves each of its children that has not started; the answer
    lists what moved and what kept its time (409 when nothing could move)."""
    step = await deps.queries.step(task_id, step_id, tenant=who.tenant)
    require(deps, who, Action.SUBMIT, step.tool)
    try:
        if (when.run_at is None) == (when.delay is None):
            raise schedule.ScheduleError("give 'run_at' or 'delay'")
        now = datetime.now(UTC)
        if when.run_at is not None:
            zone = schedule.zone(when.timezone) if when.timezone else None
            run_at = schedule.run_at(when.run_at, zone)
        else:
            run_at = now + timedelta(seconds=schedule.delay(when.delay))
        schedule.check_ahead(run_at, now)
    except schedule.ScheduleError as exc:
        field = "/delay" if when.run_at is None and when.delay is not None else "/run_at"
        problem = Problem(pointer=field, code=ProblemCode.INVALID_TYPE, detail=str(exc))
        raise PlanInvalidError([problem]) from None
    with operator_span(telemetry.RESCHEDULE, who, step=step):
        done = await deps.operator.reschedule(
            RescheduleInput(
                task_id=task_id, step_id=step_id, run_at=run_at, by=who.name, tenant=who.tenant
            )
        )
    out = task_out(done.view, budget=deps.settings.receipt_budget_chars, approvers=approvers(deps))
    return schemas.RescheduleOut(
        **dict(out),
        moved=done.moved,
        not_moved=[schemas.NotMovedOut(**asdict(n)) for n in done.not_moved],
    )


@router.post(
    "/{task_id}/steps/{step_id}/approval",
    response_model=schemas.TaskOut,
    responses=BODY_PROBLEMS,
    summary="Approve or reject a step waiting for approval (approvers of its tool)",
)
async def decide_step(
    task_id: str, step_id: str, decision: schemas.ApprovalIn, deps: Deps, who: Caller
) -> schemas.TaskOut:
    await _require_approver(deps, who, task_id, step_id)
    # A fan-out or verified step is decided through its one child waiting for a decision: the
    # caller's right is checked on that child's tool too (a verified write's check is another),
    # and that child is the one decided.
    step = await deps.queries.decided_step(task_id, step_id, tenant=who.tenant)
    require(deps, who, Action.APPROVE, step.tool)
    attributes = {telemetry.DECISION: decision.decision, "agent_reach.edited": bool(decision.args)}
    with operator_span(telemetry.DECIDE, who, step=step, attributes=attributes):
        view = await deps.operator.decide(
            ApprovalInput(
                task_id=task_id,
                step_id=step.step_id,
                approve=decision.decision == "approve",
                by=who.name,
                tenant=who.tenant,
                reason=decision.reason,
                args=decision.args,
                separation_of_duties=deps.settings.separation_of_duties,
            )
        )
    return task_out(view, budget=deps.settings.receipt_budget_chars)


async def _require_approver(
    deps: Components, who: Principal, task_id: str, step_id: str
) -> StepRow:
    """The step; 404 unless it is in the caller's tenant, 403 unless it may approve its tool."""
    step = await deps.queries.step(task_id, step_id, tenant=who.tenant)
    require(deps, who, Action.APPROVE, step.tool)
    return step


@router.get(
    "/{task_id}/events",
    response_model=schemas.EventPage,
    responses={**PROBLEMS, **events.EVENTS_OK},
    summary="A task's events: a page of JSON, or live as Server-Sent Events",
)
async def task_events(
    task_id: str,
    deps: Deps,
    who: Caller,
    stream: events.StreamAsked,
    after: Annotated[int, Query(ge=0, description="Return events with a larger id")] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> Response:
    await deps.queries.check_tenant(task_id, who.tenant)
    if stream is not None:
        resume = stream.last_event_id
        return events.stream_events(deps, task_id, after=after if resume is None else resume)
    rows = await deps.queries.events(task_id, after=after, limit=limit)
    page = schemas.EventPage(events=[schemas.EventOut.model_validate(e) for e in rows])
    return JSONResponse(page.model_dump(mode="json"))


@router.post(
    "/{task_id}/usage",
    response_model=schemas.TaskOut,
    responses=BODY_PROBLEMS,
    summary="Report model tokens spent on the task (they add up; shown in its usage)",
)
async def report_usage(
    task_id: str, tokens: schemas.TokensIn, deps: Deps, who: Caller
) -> schemas.TaskOut:
    view = await deps.operator.report_tokens(
        task_id,
        input_tokens=tokens.input_tokens,
        output_tokens=tokens.output_tokens,
        actor=who.name,
        tenant=who.tenant,
    )
    return task_out(view, budget=deps.settings.receipt_budget_chars)


@router.get(
    "/{task_id}/steps/{step_id}/output",
    response_model=schemas.StepOutput,
    responses=PROBLEMS,
    summary="A step's whole output (receipts show a bounded view and point here)",
)
async def step_output(task_id: str, step_id: str, deps: Deps, who: Caller) -> schemas.StepOutput:
    step = await deps.queries.step(task_id, step_id, tenant=who.tenant)
    await deps.registry.ensure([(step.tool, step.tool_version)])
    tool = deps.registry.get(step.tool, step.tool_version)
    return schemas.StepOutput(
        task_id=task_id,
        step_id=step_id,
        status=step.status,
        output=redact_output(step.output, tool.redact),
    )


@router.get(
    "/{task_id}/trace",
    responses=PROBLEMS,
    summary="The task's trace in Jaeger's JSON (the UI's \"Upload JSON\"), from the event log",
)
async def task_trace(task_id: str, deps: Deps, who: Caller) -> dict[str, Any]:
    view, events = await deps.queries.history(task_id, tenant=who.tenant, up_to=MAX_EVENTS)
    return jaeger_trace(view.task, view.steps, events)


__all__ = [
    "BadJsonError",
    "BodyTooLargeError",
    "NotATurnError",
    "TooManyInFlightError",
    "problem_response",
    "router",
]
