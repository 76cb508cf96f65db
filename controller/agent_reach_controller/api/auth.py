"""Who is calling: every /v1 route needs an API key (`Authorization: Bearer ark_…`), or the
web console's session cookie (`identity/sign_ins.py`) with its CSRF token on every action.

A missing or wrong key is 401; a key whose roles do not allow the action on the tool is 403.
Another tenant's task answers 404, exactly as a task that does not exist.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyCookie, APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from agent_reach_controller.identity import keys
from agent_reach_controller.identity.policy import Action, Principal, memory_action
from agent_reach_controller.identity.service import BOOTSTRAP_KEY_ID
from agent_reach_controller.identity.sign_ins import COOKIE, CSRF_HEADER, SignIn, csrf_matches
from agent_reach_controller.runtime import Components
from agent_reach_controller.tools.catalog import ToolSpec

BOOTSTRAP = Principal(name="bootstrap", tenant="default", roles=("admin",), key_id=BOOTSTRAP_KEY_ID)


class UnauthenticatedError(Exception):
    """No usable API key on the request."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class CsrfError(Exception):
    """A console session acted without its CSRF token."""

    detail = f"a console action needs the page's CSRF token in {CSRF_HEADER}"


class ForbiddenError(Exception):
    """The caller's roles do not allow this action (on this tool)."""

    def __init__(self, principal: Principal, action: Action, tool: str | None = None) -> None:
        on = f" on tool {tool!r}" if tool else ""
        super().__init__(f"{principal.name} may not {action.value}{on}")
        self.detail = str(self)


def _token(request: Request) -> str | None:
    return token_of(request.headers.get("authorization", ""), request.headers.get("x-api-key"))


def token_of(authorization: str, api_key: str | None) -> str | None:
    """The API key a request sends: `Authorization: Bearer …`, else `X-API-Key`."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return api_key or None


# Declared so the OpenAPI publishes both ways of sending a key (alternatives); `_token` reads them.
_BEARER = HTTPBearer(auto_error=False, description="Authorization: Bearer ark_…")
_API_KEY = APIKeyHeader(name="X-API-Key", auto_error=False, description="The same key, as a header")
_COOKIE = APIKeyCookie(
    name=COOKIE,
    auto_error=False,
    description=f"The web console's session (POST /console/login); actions also need {CSRF_HEADER}",
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def caller(
    request: Request,
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    _api_key: Annotated[str | None, Depends(_API_KEY)],
    _cookie: Annotated[str | None, Depends(_COOKIE)],
) -> Principal:
    components: Components = request.app.state.components
    return await authenticate(components, request)


async def authenticate(app_components: Components, request: Request) -> Principal:
    """The principal of the request's API key; UnauthenticatedError without a valid one."""
    token = _token(request)
    if token is None:
        signed_in = await console_session(app_components, request)
        if signed_in is None:
            raise UnauthenticatedError("send an API key: Authorization: Bearer ark_…")
        if request.method not in SAFE_METHODS and not csrf_matches(
            signed_in.secret, request.headers.get(CSRF_HEADER)
        ):
            raise CsrfError
        return signed_in.principal
    return await key_principal(app_components, token)


async def key_principal(app_components: Components, token: str) -> Principal:
    """Whom an API key stands for; UnauthenticatedError if it stands for no one."""
    principal = await principal_of_key(app_components, token)
    if principal is None:
        raise UnauthenticatedError("the API key is not valid (unknown, revoked or malformed)")
    return principal


async def principal_of_key(app_components: Components, token: str) -> Principal | None:
    """Whom an API key stands for, or None (unknown, revoked or malformed)."""
    bootstrap = app_components.settings.bootstrap_key
    if bootstrap is not None and hmac.compare_digest(
        keys.hash_secret(token), keys.hash_secret(bootstrap.get_secret_value())
    ):
        return BOOTSTRAP
    return await app_components.keys.authenticate(token)


async def console_session(app_components: Components, request: Request) -> SignIn | None:
    """The live console session of the request's cookie, if it has one."""
    secret = request.cookies.get(COOKIE)
    if not secret:
        return None
    sign_ins = app_components.sign_ins
    proxy_user = None
    if sign_ins.proxy is not None:
        peer = request.client.host if request.client else None
        proxy_user = sign_ins.proxy.user_of(peer, request.headers)
    return await sign_ins.resolve(secret, proxy_user=proxy_user)


Caller = Annotated[Principal, Depends(caller)]


def require(components: Components, who: Principal, action: Action, tool: str = "*") -> None:
    """ForbiddenError unless `who` may take `action` on `tool`."""
    if not components.policy.allows(who.roles, action, tool):
        raise ForbiddenError(who, action, None if tool == "*" else tool)


def lacking(components: Components, who: Principal, tool: ToolSpec) -> Action | None:
    """The right `who` lacks to have a step of `tool` run (None: it has them): `submit` on the
    tool, and for memory's tools the memory right of what they do (`memory_action`)."""
    if not components.policy.allows(who.roles, Action.SUBMIT, tool.name):
        return Action.SUBMIT
    memory = memory_action(tool)
    if memory is not None and not components.policy.allows(who.roles, memory):
        return memory
    return None


def require_call(components: Components, who: Principal, tool: ToolSpec) -> None:
    """ForbiddenError, naming the action and the tool, unless `who` may have `tool` run."""
    missing = lacking(components, who, tool)
    if missing is not None:
        raise ForbiddenError(who, missing, tool.name)


def require_admin(components: Components, who: Principal) -> None:
    if not components.policy.is_admin(who.roles):
        raise ForbiddenError(who, Action.ADMIN)
