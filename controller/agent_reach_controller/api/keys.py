"""API key routes (admins): create (the key is shown once), list, revoke."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from agent_reach_controller.api import schemas
from agent_reach_controller.api.auth import Caller, require_admin
from agent_reach_controller.api.problems import V1_PROBLEMS, problem_responses
from agent_reach_controller.identity.service import NAME_PATTERN, KeyInfo
from agent_reach_controller.runtime import Components

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=V1_PROBLEMS)


class KeyIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="The principal the key stands for")
    tenant: str | None = Field(
        None, pattern=NAME_PATTERN, description="Its tenant; default the caller's"
    )
    roles: list[str] = Field(min_length=1, max_length=20, description="Roles of the policy")


class KeyOut(BaseModel):
    key_id: str
    name: str
    tenant: str
    roles: list[str]
    created_at: schemas.Instant
    created_by: str
    revoked_at: schemas.Instant | None

    @classmethod
    def of(cls, info: KeyInfo) -> KeyOut:
        return cls(
            key_id=info.key_id,
            name=info.name,
            tenant=info.tenant,
            roles=list(info.roles),
            created_at=info.created_at,
            created_by=info.created_by,
            revoked_at=info.revoked_at,
        )


class KeyCreated(KeyOut):
    token: str = Field(description="The key itself: shown this once, stored only as a hash")


class KeyPage(BaseModel):
    keys: list[KeyOut]


class UnknownRoleError(ValueError):
    pass


def _components(request: Request) -> Components:
    found: Components = request.app.state.components
    return found


@router.post("", status_code=201, response_model=KeyCreated, responses=problem_responses(400))
async def create_key(body: KeyIn, request: Request, who: Caller) -> KeyCreated:
    deps = _components(request)
    require_admin(deps, who)
    unknown = sorted(set(body.roles) - set(deps.policy.roles))
    if unknown:
        raise UnknownRoleError(f"unknown roles: {', '.join(unknown)}")
    info, token = await deps.keys.create(
        name=body.name, tenant=body.tenant or who.tenant, roles=body.roles, created_by=who.name
    )
    return KeyCreated(**KeyOut.of(info).model_dump(), token=token)


@router.get("", response_model=KeyPage)
async def list_keys(request: Request, who: Caller) -> KeyPage:
    deps = _components(request)
    require_admin(deps, who)
    return KeyPage(keys=[KeyOut.of(k) for k in await deps.keys.list()])


@router.post("/{key_id}/revoke", response_model=KeyOut, responses=problem_responses(404))
async def revoke_key(key_id: str, request: Request, who: Caller) -> KeyOut:
    deps = _components(request)
    require_admin(deps, who)
    await deps.keys.revoke(key_id, by=who.name)
    info = await deps.keys.get(key_id)
    if info is None:
        raise KeyNotFoundError(key_id)
    return KeyOut.of(info)


class KeyNotFoundError(LookupError):
    pass
