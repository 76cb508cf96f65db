"""The executor fleet (admins): pool tokens (created, listed, revoked) and live sessions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from agent_reach_controller.api import schemas
from agent_reach_controller.api.auth import Caller, require_admin
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_responses
from agent_reach_controller.identity.pools import NAME_PATTERN, PoolToken
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.sessions import SessionInfo

tokens_router = APIRouter(prefix="/v1/executor-tokens", tags=["executors"], responses=V1_PROBLEMS)
fleet_router = APIRouter(prefix="/v1/executors", tags=["executors"], responses=V1_PROBLEMS)

_CONNECTOR = r"^[a-z][a-z0-9_.-]{0,63}$"
_TOOL_PATTERN = r"^[A-Za-z0-9_.*?\[\]-]{1,128}$"


class PoolTokenNotFoundError(LookupError):
    """No live database token has this id."""


class PoolNotFoundError(LookupError):
    """No executor token or session names this pool."""


class PoolTokenIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="The pool the token admits executors to")
    connectors: list[str] | None = Field(
        None, max_length=50, description="Connectors its executors may run; any when omitted"
    )
    tools: list[str] | None = Field(
        None,
        max_length=100,
        description="Tool name patterns (shell-style, e.g. 'orders.*') its executors may run; "
        "any when omitted",
    )
    tenant: str | None = Field(
        None, pattern=NAME_PATTERN, description="The one tenant whose steps it may run"
    )


class PoolTokenOut(BaseModel):
    token_id: str
    name: str
    connectors: list[str] | None
    tools: list[str] | None
    tenant: str | None
    created_at: schemas.Instant | None
    created_by: str
    revoked_at: schemas.Instant | None
    source: str = Field(description="'database', or 'file' (provisioned; revoke by editing it)")

    @classmethod
    def of(cls, token: PoolToken) -> PoolTokenOut:
        return cls(
            token_id=token.token_id,
            name=token.name,
            connectors=list(token.connectors) if token.connectors is not None else None,
            tools=list(token.tools) if token.tools is not None else None,
            tenant=token.tenant,
            created_at=token.created_at,
            created_by=token.created_by,
            revoked_at=token.revoked_at,
            source=token.source,
        )


class PoolTokenCreated(PoolTokenOut):
    token: str = Field(description="The token itself: shown this once, stored only as a hash")


class PoolTokenPage(BaseModel):
    tokens: list[PoolTokenOut]


class ExecutorOut(BaseModel):
    session_id: str
    pool: str
    executor_id: str
    scope: dict[str, Any]
    connectors: list[str]
    slots: int
    leases: int = Field(description="Steps it is running now")
    version: str
    registered_at: schemas.Instant
    last_seen_at: schemas.Instant
    expires_at: schemas.Instant = Field(
        description="When its leases go back to the queue unless it beats"
    )
    ended_at: schemas.Instant | None
    end_reason: str | None

    @classmethod
    def of(cls, info: SessionInfo) -> ExecutorOut:
        return cls(
            session_id=info.id,
            pool=info.pool,
            executor_id=info.executor_id,
            scope=info.scope,
            connectors=info.connectors,
            slots=info.slots,
            leases=info.leases,
            version=info.version,
            registered_at=info.registered_at,
            last_seen_at=info.last_seen_at,
            expires_at=info.expires_at,
            ended_at=info.ended_at,
            end_reason=info.end_reason,
        )


class ExecutorPage(BaseModel):
    executors: list[ExecutorOut]


def _components(request: Request) -> Components:
    found: Components = request.app.state.components
    return found


@tokens_router.post(
    "",
    status_code=201,
    response_model=PoolTokenCreated,
    responses=problem_responses(400),
)
async def create_token(body: PoolTokenIn, request: Request, who: Caller) -> PoolTokenCreated:
    deps = _components(request)
    require_admin(deps, who)
    info, token = await deps.pools.create(
        name=body.name,
        connectors=body.connectors,
        tools=body.tools,
        tenant=body.tenant,
        created_by=who.name,
    )
    return PoolTokenCreated(**PoolTokenOut.of(info).model_dump(), token=token)


@tokens_router.get("", response_model=PoolTokenPage)
async def list_tokens(request: Request, who: Caller) -> PoolTokenPage:
    deps = _components(request)
    require_admin(deps, who)
    return PoolTokenPage(tokens=[PoolTokenOut.of(t) for t in await deps.pools.list()])


@tokens_router.delete(
    "/{token_id}",
    status_code=204,
    responses=problem_responses(404),
)
async def revoke_token(token_id: str, request: Request, who: Caller) -> Response:
    """Revoke a token: its sessions end and what they run goes back to the queue at once."""
    deps = _components(request)
    require_admin(deps, who)
    if not await deps.pools.revoke(token_id, by=who.name):
        raise PoolTokenNotFoundError(token_id)
    await deps.leases.reap_sessions()
    return Response(status_code=204)


@fleet_router.get("", response_model=ExecutorPage)
async def list_executors(request: Request, who: Caller, ended: bool = False) -> ExecutorPage:
    """Executor sessions (live ones; `?ended=true` adds those that ended lately)."""
    deps = _components(request)
    require_admin(deps, who)
    found = await deps.sessions.list(live_only=not ended)
    return ExecutorPage(executors=[ExecutorOut.of(s) for s in found])
