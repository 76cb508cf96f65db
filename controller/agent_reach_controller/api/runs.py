"""Agent runs over HTTP: start one, read it, continue it, cancel it.

Starting a run on an agent needs `submit` on the agent's name; the tools its model may call are
the profile's, cut to those the caller may submit itself (a tool the profile names outright that
the caller may not use is refused, 403). Runs are the tenant's, as tasks are.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import AsyncGenerator, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent_reach_controller.api.auth import Caller, ForbiddenError, lacking, require
from agent_reach_controller.api.events import HEARTBEAT, EventStream, TooManyStreamsError
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_responses
from agent_reach_controller.api.schemas import Instant
from agent_reach_controller.api.serving import ShuttingDownError
from agent_reach_controller.api.tasks import Deps, TooManyInFlightError
from agent_reach_controller.decide import run_memory
from agent_reach_controller.domain.records import (
    ENDED_RUN_STATES,
    RunMessage,
    RunRow,
    RunStatus,
    StepRow,
)
from agent_reach_controller.identity.policy import Action, Principal
from agent_reach_controller.planning import planner
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.feed import FollowInput
from agent_reach_controller.services.intake import request_hash
from agent_reach_controller.services.run_replay import RunReplayer
from agent_reach_controller.services.runs import (
    RunInputError,
    RunService,
    StartRun,
)
from agent_reach_controller.tools.agents import AgentProfile, is_agent
from agent_reach_controller.tools.catalog import ToolSpec

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=V1_PROBLEMS)

# The most messages a caller's input may hold, and the most characters of text in one.
MAX_INPUT_MESSAGES = 200
MAX_INPUT_CHARS = 200_000
Message = Annotated[dict[str, Any], Field(description="A message in the agent's endpoint's shape")]
Input = Annotated[
    str | list[Message],
    Field(
        description="Text (a user message), or messages in the shape of the agent's endpoint",
        max_length=MAX_INPUT_CHARS,
    ),
]


class LimitsIn(BaseModel):
    """A caller's limits for this run: each may only lower the profile's."""

    model_config = ConfigDict(extra="forbid")

    max_rounds: int | None = Field(default=None, ge=1, le=100)
    input_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    cost: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    deadline: float | None = Field(default=None, gt=0, le=86_400, description="Seconds")


class RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=128)
    input: Input
    subject: str | None = Field(
        None, min_length=1, max_length=256, description="The end user the run acts for"
    )
    context: dict[str, Any] = Field(default_factory=dict)
    limits: LimitsIn = LimitsIn()
    version: str | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="The agent's version to run (an earlier one, to compare); by default its "
        "current one",
    )


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: Input


class TokensOut(BaseModel):
    input: int
    output: int
    cached: int


class RoundOut(BaseModel):
    round: int
    task_id: str = Field(description="The round's task: its steps, receipts, events and trace")
    status: str


class WaitingOut(BaseModel):
    task_id: str
    step_id: str
    tool: str
    status: str = Field(description="awaiting_approval or outcome_unknown")


class RecalledOut(BaseModel):
    memory_id: str
    mark: str = Field(description="An HMAC of the entry's content when it was recalled")
    type: str
    key: str
    score: float = Field(description="How well it matched the input (0 for a pinned entry)")
    pinned: bool


class RunOut(BaseModel):
    run_id: str
    trace_id: str
    agent: str
    agent_version: str
    status: str = Field(
        description="running; waiting (a step of its round waits for an approval or a verdict: "
        "see waiting_for); succeeded, failed or cancelled"
    )
    waiting_for: list[WaitingOut] = Field(default_factory=list)
    end_reason: str | None = Field(
        None,
        description="answered, max_rounds, budget_exhausted, loop_detected, deadline_exceeded, "
        "model_failed, invalid_reply, cancelled",
    )
    round: int
    task_id: str | None = Field(None, description="The current (or last) round's task")
    subject: str | None = Field(
        description="The end user the run acts for; only a run with a subject recalls or "
        "extracts memories"
    )
    tokens: TokensOut
    cost: float
    answer: str | None
    ungrounded_claims: list[str] | None = Field(
        None,
        description="Numbers, dates, email addresses and URLs in the answer that neither the "
        "input nor any tool result showed",
    )
    error: dict[str, Any] | None
    limits: dict[str, Any]
    tools: list[str] = Field(description="What the model may call in this run")
    created_at: Instant
    finished_at: Instant | None
    messages: list[dict[str, Any]] | None = Field(
        None, description="The conversation, entry by entry (on GET of one run)"
    )
    route: dict[str, str] | None = Field(
        None,
        description="With a router (mode auto): how the caller's latest message is handled "
        "(answer, react or plan) and why (on GET of one run)",
    )
    category: dict[str, Any] | None = Field(
        None,
        description="With more tools than the profile's category_threshold: the category of "
        "tools the model chose for the caller's latest message, and why (on GET of one run)",
    )
    rounds: list[RoundOut] | None = Field(
        None, description="Each round's task, oldest first (on GET of one run)"
    )
    recalled: list[RecalledOut] | None = Field(
        None,
        description="The subject's memories the run started with, in its prompt as delimited "
        "data, never instructions (on GET of one run); null when it recalled nothing: a run "
        "without a subject, or a profile with memory.recall 0",
    )
    extraction: dict[str, Any] | None = Field(
        None,
        description="With a profile that extracts memories (on GET of one run): `state` asked "
        "(its round runs), skipped or failed with a `reason`, or done with what was `stored` "
        "(memory_id, type, key, origin, action) and what was `refused` (pointer, detail)",
    )


class RunList(BaseModel):
    runs: list[RunOut]


def _out(
    run: RunRow,
    messages: list[RunMessage] | None = None,
    waiting: Sequence[StepRow] = (),
    rounds: Sequence[tuple[int, str, str]] | None = None,
) -> dict[str, Any]:
    return RunOut(
        run_id=run.run_id,
        trace_id=run.trace_id,
        agent=run.agent,
        agent_version=run.agent_version,
        status=RunStatus.WAITING if waiting else run.status,
        waiting_for=[
            WaitingOut(task_id=s.task_id, step_id=s.step_id, tool=s.tool, status=s.status)
            for s in waiting
        ],
        end_reason=run.end_reason,
        round=run.round,
        task_id=run.task_id,
        subject=run.subject,
        tokens=TokensOut(
            input=run.input_tokens, output=run.output_tokens, cached=run.cached_tokens
        ),
        cost=run.cost,
        answer=run.answer,
        ungrounded_claims=run.ungrounded_claims,
        error=run.error,
        limits=run.limits,
        tools=run.tools,
        created_at=run.created_at,
        finished_at=run.finished_at,
        route=next((m.message for m in reversed(messages or []) if m.role == "route"), None),
        category=next((m.message for m in reversed(messages or []) if m.role == "category"), None),
        recalled=_recalled(messages),
        extraction=None if messages is None else run_memory.extraction_of(messages),
        rounds=None
        if rounds is None
        else [RoundOut(round=n, task_id=t, status=st) for n, t, st in rounds],
        messages=None
        if messages is None
        else [
            {"seq": m.seq, "round": m.round, "role": m.role, "message": m.message} for m in messages
        ],
    ).model_dump(mode="json")


def _recalled(messages: list[RunMessage] | None) -> list[RecalledOut] | None:
    found = None if messages is None else run_memory.recalled_of(messages)
    return None if found is None else [RecalledOut.model_validate(r) for r in found]


def _allowed(deps: Components, who: Principal, tool: str) -> Action | None:
    """The action the caller lacks to let a run's model call `tool` (None: it has them): what
    a memory tool does to the subject's memory, its caller must be allowed too."""
    spec = deps.catalog.get(tool)
    if spec is None:  # not in the catalogue: only `submit` can be asked of it
        return None if deps.policy.allows(who.roles, Action.SUBMIT, tool) else Action.SUBMIT
    return lacking(deps, who, spec)


def _tools(deps: Components, who: Principal, profile: AgentProfile) -> list[str]:
    """The tools the run's model may call: the profile's, those the caller may submit (and,
    for memory's tools, may read, write or forget memory)."""
    named = [p for p in profile.tools if not any(c in p for c in "*?[")]
    for name in named:
        missing = _allowed(deps, who, name)
        if missing is not None:
            raise ForbiddenError(who, missing, name)
    return sorted(
        spec.name
        for spec in deps.catalog.values()
        if spec.enabled
        and not is_agent(spec)
        and any(fnmatch.fnmatchcase(spec.name, p) for p in profile.tools)
        and _allowed(deps, who, spec.name) is None
    )


def _memory_rights(deps: Components, who: Principal, profile: AgentProfile) -> None:
    """A run with a subject reads its memory (recall) and writes it (extraction): its caller
    must be allowed to."""
    wanted = [(profile.memory.recall > 0, Action.MEMORY_READ)]
    wanted.append((profile.memory.extract, Action.MEMORY_WRITE))
    for asked, action in wanted:
        if asked and not deps.policy.allows(who.roles, action):
            raise ForbiddenError(who, action)


def _messages(runs: RunService, spec: ToolSpec, given: str | list[dict[str, Any]]) -> list[Any]:
    """The caller's input as the agent's endpoint takes it."""
    if isinstance(given, str):
        return [runs.endpoint(spec).user(given)]
    if not given or len(given) > MAX_INPUT_MESSAGES:
        raise RunInputError("/body/input", f"give 1 to {MAX_INPUT_MESSAGES} messages")
    return given


async def _waited(deps: Components, run: RunRow, wait: float) -> RunRow:
    """The run once it ended, or as it is when `wait` seconds have passed."""
    loop = asyncio.get_running_loop()
    until = loop.time() + min(wait, deps.settings.max_wait_seconds)
    while run.status not in ENDED_RUN_STATES and run.task_id is not None:
        left = until - loop.time()
        if left <= 0:
            break
        await deps.queries.wait(run.task_id, within=left)
        run, _ = await deps.runs.read(run.run_id, run.tenant)
    return run


WaitQuery = Annotated[float, Query(ge=0, le=3600, description="Seconds to wait for the run to end")]


@router.post(
    "",
    status_code=202,
    response_model=RunOut,
    responses=problem_responses(400, 403, 404, 409, 413, 422, 429),
    summary="Start an agent run (202; 200 when it ended within ?wait)",
)
async def start_run(
    body: RunIn,
    deps: Deps,
    who: Caller,
    wait: WaitQuery = 0,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="One run per key (per caller): a repeat answers the first start's run",
        ),
    ] = None,
) -> Response:
    require(deps, who, Action.SUBMIT, body.agent)
    await deps.registry.refresh()
    spec, profile = await deps.runs.agent(body.agent, body.version)
    if body.subject is not None:
        _memory_rights(deps, who, profile)
    try:
        limits = profile.limits.overridden(body.limits.model_dump(exclude_none=True))
    except (ValueError, ValidationError) as exc:
        raise RunInputError("/body/limits", _said(exc)) from exc
    start = StartRun(
        agent=body.agent,
        input=_messages(deps.runs, spec, body.input),
        principal=who.name,
        tenant=who.tenant,
        key_id=who.key_id,
        subject=body.subject,
        context=body.context,
        limits=limits.model_dump(),
        tools=_tools(deps, who, profile),
        version=body.version,
        idempotency_key=idempotency_key,
        fingerprint=request_hash(body.model_dump(mode="json")),
    )
    # A run's first round is a task of its caller's: the same guards as a submit's.
    per_caller = deps.settings.max_tasks_in_flight_per_principal
    if per_caller is not None:
        in_flight = await deps.queries.in_flight(who.tenant, who.name, up_to=per_caller)
        if in_flight >= per_caller:
            raise TooManyInFlightError(who.name, in_flight, per_caller)
    with deps.admission.admit(1, limit=deps.settings.max_queued_steps):
        run = await deps.runs.start(start)
    if wait > 0:
        run = await _waited(deps, run, wait)
    status = 200 if run.status in ENDED_RUN_STATES else 202
    return JSONResponse(
        _out(run), status_code=status, headers={"Location": f"/v1/runs/{run.run_id}"}
    )


def _said(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]) for e in exc.errors(include_url=False)[:3])
    return str(exc)


@router.get(
    "/plan-schema",
    summary="The JSON Schema of the plan a model writes in planner mode (its response format)",
)
async def plan_schema(who: Caller) -> dict[str, Any]:
    return planner.PLAN_SCHEMA


@router.get(
    "/memory-schema",
    summary="The JSON Schema of the memories a run's extraction proposes (its response format; "
    "a profile's memory.extract_types narrow the type)",
)
async def memory_schema(who: Caller) -> dict[str, Any]:
    return run_memory.MEMORY_SCHEMA


@router.get("", response_model=RunList, summary="The tenant's runs, newest first")
async def list_runs(
    deps: Deps,
    who: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[str | None, Query(max_length=36)] = None,
) -> Response:
    runs = await deps.runs.listed(who.tenant, limit=limit, before=before)
    waiting = await deps.runs.waiting(runs)
    return JSONResponse({"runs": [_out(r, waiting=waiting.get(r.run_id, ())) for r in runs]})


@router.get(
    "/{run_id}",
    response_model=RunOut,
    responses=problem_responses(404),
    summary="A run: where it is, its conversation, tokens, cost and answer",
)
async def get_run(run_id: str, deps: Deps, who: Caller, wait: WaitQuery = 0) -> Response:
    run, messages = await deps.runs.read(run_id, who.tenant)
    if wait > 0:
        run = await _waited(deps, run, wait)
        run, messages = await deps.runs.read(run_id, who.tenant)
    waiting, rounds = await deps.runs.waiting_for(run), await deps.runs.rounds(run)
    return JSONResponse(_out(run, messages, waiting, rounds))


RUN_EVENTS_OK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-Sent Events: `event: message` (`id` = the entry's seq, `data` = "
        "{seq, round, role, message}) for each conversation entry, `event: status` when the "
        "run's status, round or task changes, and last `event: end` with the run",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@router.get(
    "/{run_id}/events",
    responses=problem_responses(404, 429, 503) | RUN_EVENTS_OK,
    response_class=Response,
    summary="A run as it moves: its conversation entry by entry, its status, its end (SSE)",
)
async def run_events(
    run_id: str,
    deps: Deps,
    who: Caller,
    last_event_id: Annotated[
        int | None,
        Header(alias="Last-Event-ID", ge=-1, le=2**31, description="Resume after this entry"),
    ] = None,
) -> Response:
    await deps.runs.read(run_id, who.tenant)  # 404 before the stream starts
    settings = deps.settings
    if deps.feed.closing:
        raise ShuttingDownError(
            "it serves no new event streams; retry (another replica will answer)", retry_after=1
        )
    if not deps.feed.reserve(settings.max_event_streams):
        raise TooManyStreamsError(deps.feed.followers, settings.max_event_streams)
    after = -1 if last_event_id is None else last_event_id
    return EventStream(_run_stream(deps, run_id, who.tenant, after=after), feed=deps.feed)


async def _run_stream(
    deps: Components, run_id: str, tenant: str, *, after: int
) -> AsyncGenerator[bytes, None]:
    """The run's entries after `after`, its status changes and its end, as they commit: each
    wait follows the current round's task events (which every move of the run comes with)."""
    settings = deps.settings
    loop = asyncio.get_running_loop()
    until = loop.time() + settings.event_stream_max_seconds
    shown: tuple[Any, ...] | None = None
    cursors: dict[str, int] = {}
    while loop.time() < until and not deps.feed.closing:
        run, messages = await deps.runs.read(run_id, tenant)
        fresh = [m for m in messages if m.seq > after]
        for m in fresh:
            data = {"seq": m.seq, "round": m.round, "role": m.role, "message": m.message}
            yield _sse("message", data, event_id=m.seq)
        after = fresh[-1].seq if fresh else after
        waiting = (await deps.runs.waiting([run])).get(run.run_id, [])
        status = RunStatus.WAITING if waiting else run.status
        state = (status, run.round, run.task_id, tuple(s.step_id for s in waiting))
        if state != shown:
            shown = state
            said = {"status": status, "round": run.round, "task_id": run.task_id}
            yield _sse("status", said | {"waiting_for": [s.step_id for s in waiting]})
        if run.status in ENDED_RUN_STATES or run.task_id is None:
            yield _sse("end", _out(run))
            return
        follow = FollowInput(
            task_id=run.task_id,
            after=cursors.get(run.task_id, 0),
            idle=settings.event_stream_heartbeat_seconds,
            duration=settings.event_stream_heartbeat_seconds,
        )
        async for batch in deps.feed.follow(follow):
            if batch.events:
                cursors[run.task_id] = batch.events[-1].id
            elif batch.ended is None:
                yield HEARTBEAT
            break


def _sse(kind: str, data: Any, *, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"{head}event: {kind}\ndata: {body}\n\n".encode()


class RoundReplayOut(BaseModel):
    round: int
    task_id: str | None
    request: dict[str, Any] | None = Field(
        None, description="The model request, rebuilt from what the run stored (no key in it)"
    )
    reply: list[dict[str, Any]] = Field(description="The model's reply, as the run kept it")
    calls: list[dict[str, Any]] = Field(
        description="Each call: id, tool and version, status, and what the model read of it"
    )
    differences: list[str] = Field(
        description="Where today's rules and tools would decide otherwise (empty: the same)"
    )


class RunReplayOut(BaseModel):
    run_id: str
    agent: str
    agent_version: str
    status: str
    end_reason: str | None
    identical: bool = Field(description="Whether today's rules and tools reach every decision")
    rounds: list[RoundReplayOut]


@router.get(
    "/{run_id}/replay",
    response_model=RunReplayOut,
    responses=problem_responses(404),
    summary="A run's rounds (each model request and reply beside its receipts), and a dry "
    "run of its recorded replies with today's rules and tools",
)
async def replay_run(run_id: str, deps: Deps, who: Caller) -> RunReplayOut:
    replayer = RunReplayer(db=deps.db, registry=deps.registry, runs=deps.runs)
    replayed = await replayer.replay(run_id, who.tenant, budget=deps.settings.receipt_budget_chars)
    run = replayed.run
    return RunReplayOut(
        run_id=run.run_id,
        agent=run.agent,
        agent_version=run.agent_version,
        status=run.status,
        end_reason=run.end_reason,
        identical=replayed.identical,
        rounds=[RoundReplayOut.model_validate(r, from_attributes=True) for r in replayed.rounds],
    )


@router.post(
    "/{run_id}/messages",
    status_code=202,
    response_model=RunOut,
    responses=problem_responses(400, 404, 409, 413, 422),
    summary="Continue a run that ended: the caller's next message starts a new turn",
)
async def continue_run(
    run_id: str, body: MessageIn, deps: Deps, who: Caller, wait: WaitQuery = 0
) -> Response:
    run, _ = await deps.runs.read(run_id, who.tenant)
    require(deps, who, Action.SUBMIT, run.agent)
    await deps.registry.refresh()
    spec, _ = await deps.runs.agent(run.agent, run.agent_version)  # the version it pinned
    run = await deps.runs.continue_run(
        run_id, who.tenant, _messages(deps.runs, spec, body.input), actor=who.name
    )
    if wait > 0:
        run = await _waited(deps, run, wait)
    return JSONResponse(_out(run), status_code=200 if run.status in ENDED_RUN_STATES else 202)


@router.post(
    "/{run_id}/cancel",
    response_model=RunOut,
    responses=problem_responses(404),
    summary="Cancel a run (what its round runs now ends as cancelled)",
)
async def cancel_run(run_id: str, deps: Deps, who: Caller) -> Response:
    run, _ = await deps.runs.read(run_id, who.tenant)
    require(deps, who, Action.SUBMIT, run.agent)
    return JSONResponse(_out(await deps.runs.cancel(run_id, who.tenant, actor=who.name)))
