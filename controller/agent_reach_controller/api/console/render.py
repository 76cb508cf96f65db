"""The console's pages: templates (always autoescaped), security headers, and who is signed in."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader

from agent_reach_controller.api.auth import console_session
from agent_reach_controller.api.console.v1 import V1, Answer, segment
from agent_reach_controller.api.tasks import Deps
from agent_reach_controller.identity.sign_ins import COOKIE, SignIn
from agent_reach_controller.runtime import Components

# No inline script or style anywhere, nothing from another origin, no framing, forms post home.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: with it a browser sends `Origin: null` on form posts, which the sign-in
    # form checks.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_LOCAL_NEXT = re.compile(r"^/console(/[A-Za-z0-9._~%!$&'()*+,;=:@/?-]*)?$")


def _pretty(value: Any) -> str:
    """JSON for reading; the template escapes it like any other value."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _when(value: Any) -> str:
    if not value:
        return ""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def _cost(value: Any) -> str:
    """A cost in the price table's unit, to a millionth, without trailing zeros."""
    if not isinstance(value, int | float):
        return ""
    return f"{value:.6f}".rstrip("0").rstrip(".") or "0"


def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("agent_reach_controller.api.console", "templates"),
        autoescape=True,  # every value, whatever its file name: tool outputs are hostile
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pretty"] = _pretty
    env.filters["when"] = _when
    env.filters["cost"] = _cost
    env.filters["segment"] = lambda v: segment(str(v))
    return env


TEMPLATES = _templates()


def local_next(value: str | None, default: str = "/console/tasks") -> str:
    """A redirect target only inside the console: never an open redirect."""
    if value and _LOCAL_NEXT.match(value) and "//" not in value:
        return value
    return default


@dataclass(frozen=True, slots=True, kw_only=True)
class Visit:
    """A signed-in request: who, the /v1 API as them, and whether the session is new."""

    request: Request
    deps: Components
    sign_in: SignIn
    fresh: bool

    @property
    def v1(self) -> V1:
        return V1(self.request, self.sign_in)

    def page(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = TEMPLATES.get_template(template).render(
            me=self.sign_in.principal,
            csrf=self.sign_in.csrf,
            path=self.request.url.path,
            is_admin=self.deps.policy.is_admin(self.sign_in.principal.roles),
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
        if self.fresh:
            set_session_cookie(self.deps, self.request, response, self.sign_in)
        return response

    def problem(self, answer: Answer, *, what: str) -> HTMLResponse:
        """The API's refusal as a page, with the API's status (404 stays 404)."""
        problem = answer.problem
        return self.page(
            "problem.html",
            status=answer.status,
            what=what,
            title=str(problem.get("title") or "Refused"),
            detail=str(problem.get("detail") or ""),
            code=str(problem.get("code") or ""),
            errors=list(problem.get("errors") or []),
            http_status=answer.status,
        )

    def redirect(self, to: str) -> Response:
        response = RedirectResponse(to, status_code=303, headers=SECURITY_HEADERS)
        if self.fresh:
            set_session_cookie(self.deps, self.request, response, self.sign_in)
        return response


class NotSignedInError(Exception):
    """A console page was asked for without a session: the sign-in form answers."""


async def require_visit(request: Request, deps: Deps) -> Visit:
    found = await visit(request, deps)
    if found is None:
        raise NotSignedInError
    return found


async def visit(request: Request, deps: Components) -> Visit | None:
    """The signed-in visit, or None. Behind a trusted proxy a first visit signs in by itself."""
    found = await console_session(deps, request)
    if found is not None:
        return Visit(request=request, deps=deps, sign_in=found, fresh=False)
    proxy = deps.sign_ins.proxy
    if proxy is None:
        return None
    user = proxy.user_of(request.client.host if request.client else None, request.headers)
    principal = proxy.principal(user) if user else None
    if principal is None:
        return None
    made = await deps.sign_ins.start(principal, via_proxy=True)
    return Visit(request=request, deps=deps, sign_in=made, fresh=True)


def to_sign_in(request: Request) -> Response:
    """The sign-in form, then back to the page asked for (an action's form is not a page)."""
    asked = str(request.url.path) + _query(request) if request.method == "GET" else None
    target = quote(local_next(asked), safe="/")
    return RedirectResponse(
        f"/console/login?next={target}", status_code=303, headers=SECURITY_HEADERS
    )


def _query(request: Request) -> str:
    return f"?{request.url.query}" if request.url.query else ""


def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """A page for someone not signed in (the sign-in form)."""
    html = TEMPLATES.get_template(template).render(me=None, csrf="", path="", **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


def set_session_cookie(
    deps: Components, request: Request, response: Response, sign_in: SignIn
) -> None:
    mode = deps.settings.console_secure_cookie
    secure = mode == "always" or (mode == "auto" and request.url.scheme == "https")
    max_age = int((sign_in.expires_at - datetime.now(UTC)).total_seconds())
    response.set_cookie(
        COOKIE,
        sign_in.secret,
        max_age=max(max_age, 0),
        path="/",
        secure=secure,
        httponly=True,
        samesite="strict",
    )


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")


SignedIn = Annotated[Visit, Depends(require_visit)]
