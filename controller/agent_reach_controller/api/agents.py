"""Agent profiles over HTTP: `PUT /v1/agents/{name}` and reading them.

A profile is stored as a catalogue tool of the `model` connector (tools/agents.py), so writing
one needs `admin` on its name, as writing a tool does, and each change is a new version with its
history and audit entry; `ETag` and `If-Match` work as they do for tools.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from agent_reach_controller.api.auth import Caller, require
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_responses
from agent_reach_controller.api.tasks import Deps
from agent_reach_controller.api.tools import IfMatch, revision_of
from agent_reach_controller.identity.policy import Action, Principal
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.registry import ToolExistsError, ToolHead
from agent_reach_controller.services.run_stats import AgentVersionStats, RunStatsService
from agent_reach_controller.services.runs import AgentNotFoundError
from agent_reach_controller.tools.agents import AgentProfile, is_agent, profile_of

router = APIRouter(prefix="/v1/agents", tags=["agents"], responses=V1_PROBLEMS)


class AgentOut(BaseModel):
    """An agent: its profile as stored (credentials only as references), and its version."""

    name: str
    version: str
    revision: int
    enabled: bool
    # As written (the PUT body's schema); typed loosely here so that the profile's duration and
    # rate fields keep one published schema (the input's), not an input and an output twin.
    profile: dict[str, Any] = Field(description="The profile, as PUT (an AgentProfile)")


class AgentList(BaseModel):
    agents: list[AgentOut]


def _out(head: ToolHead) -> dict[str, Any]:
    return AgentOut(
        name=head.spec.name,
        version=head.spec.version,
        revision=head.revision,
        enabled=head.spec.enabled,
        profile=profile_of(head.spec).model_dump(mode="json"),
    ).model_dump(mode="json")


def _etag(head: ToolHead) -> dict[str, str]:
    return {"ETag": f'"{head.revision}"'}


def _may_see(deps: Components, who: Principal, name: str) -> bool:
    return deps.policy.allows(who.roles, Action.SUBMIT, name) or deps.policy.allows(
        who.roles, Action.ADMIN, name
    )


async def _agent(deps: Components, who: Principal, name: str) -> ToolHead:
    await deps.registry.refresh()
    head = deps.registry.heads.get(name)
    if head is None or not is_agent(head.spec) or not _may_see(deps, who, name):
        raise AgentNotFoundError(name)
    return head


@router.get("", response_model=AgentList, summary="The agents the caller may run")
async def list_agents(deps: Deps, who: Caller) -> Response:
    await deps.registry.refresh()
    heads = [
        h
        for name, h in sorted(deps.registry.heads.items())
        if is_agent(h.spec) and _may_see(deps, who, name)
    ]
    return JSONResponse({"agents": [_out(h) for h in heads]})


@router.get(
    "/{name}", response_model=AgentOut, responses=problem_responses(404), summary="One agent"
)
async def get_agent(name: str, deps: Deps, who: Caller) -> Response:
    head = await _agent(deps, who, name)
    return JSONResponse(_out(head), headers=_etag(head))


@router.put(
    "/{name}",
    response_model=AgentOut,
    responses=problem_responses(400, 403, 409, 412, 413, 422),
    summary="Create or replace an agent profile (a new version; the same one changes nothing)",
)
async def put_agent(
    name: str, profile: AgentProfile, deps: Deps, who: Caller, if_match: IfMatch = None
) -> Response:
    require(deps, who, Action.ADMIN, name)
    spec = profile.as_tool(name)
    await deps.registry.refresh()
    existing = deps.registry.heads.get(name)
    if existing is None:
        head = await deps.registry.create(spec, principal=who.name, tenant=who.tenant)
        status = 201
    elif not is_agent(existing.spec):
        raise ToolExistsError(name)
    else:
        head = await deps.registry.update(
            spec, principal=who.name, tenant=who.tenant, if_revision=revision_of(if_match)
        )
        status = 200
    return JSONResponse(_out(head), status_code=status, headers=_etag(head))


@router.delete(
    "/{name}",
    status_code=204,
    responses=problem_responses(403, 404, 412),
    summary="Remove an agent (runs that started keep the version they pinned)",
)
async def delete_agent(name: str, deps: Deps, who: Caller, if_match: IfMatch = None) -> Response:
    await _agent(deps, who, name)
    require(deps, who, Action.ADMIN, name)
    await deps.registry.delete(
        name, principal=who.name, tenant=who.tenant, if_revision=revision_of(if_match)
    )
    return Response(status_code=204)


class TokensPerRunOut(BaseModel):
    input: float
    output: float


class VersionStatsOut(BaseModel):
    """One version's figures over the tenant's ended runs (a rate is null when nothing it divides
    by happened)."""

    version: str
    runs: int = Field(description="Ended runs (succeeded, failed or cancelled)")
    completed: int = Field(description="Of them, answered (succeeded)")
    completion_rate: float | None = Field(description="completed / runs")
    average_rounds: float | None
    tokens_per_run: TokensPerRunOut | None
    cost_per_run: float | None
    tool_steps: int = Field(description="The tool calls of the runs' rounds")
    tool_errors: int = Field(description="Of them, failed")
    tool_error_rate: float | None = Field(description="tool_errors / tool_steps")
    ungrounded: int = Field(description="Answered runs whose answer has ungrounded_claims")
    ungrounded_claim_rate: float | None = Field(description="ungrounded / completed")


class AgentStatsOut(BaseModel):
    agent: str
    versions: list[VersionStatsOut] = Field(description="Newest version first")


def _stats_out(s: AgentVersionStats) -> VersionStatsOut:
    per_run = (
        None
        if s.input_tokens_per_run is None or s.output_tokens_per_run is None
        else TokensPerRunOut(input=s.input_tokens_per_run, output=s.output_tokens_per_run)
    )
    return VersionStatsOut(
        version=s.version,
        runs=s.runs,
        completed=s.completed,
        completion_rate=s.completion_rate,
        average_rounds=s.average_rounds,
        tokens_per_run=per_run,
        cost_per_run=s.cost_per_run,
        tool_steps=s.tool_steps,
        tool_errors=s.tool_errors,
        tool_error_rate=s.tool_error_rate,
        ungrounded=s.ungrounded,
        ungrounded_claim_rate=s.ungrounded_claim_rate,
    )


@router.get(
    "/{name}/stats",
    response_model=AgentStatsOut,
    responses=problem_responses(404),
    summary="What an agent's ended runs got done, per version: completion, rounds, tokens, cost",
)
async def agent_stats(
    name: str,
    deps: Deps,
    who: Caller,
    version: Annotated[str | None, Query(max_length=16, description="Only this version")] = None,
) -> Response:
    await _agent(deps, who, name)
    found = await RunStatsService(deps.db).per_version(who.tenant, name, version=version)
    out = AgentStatsOut(agent=name, versions=[_stats_out(s) for s in found])
    return JSONResponse(out.model_dump(mode="json"))
