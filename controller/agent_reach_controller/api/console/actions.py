"""What the console's forms do: sign in and out, and the actions, each one /v1 call.

Every action form carries the session's CSRF token; it is checked here, and again by the /v1
route the action calls (which sees it as the X-CSRF-Token header). A refused action shows the
API's problem with the API's status.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from agent_reach_controller.api.auth import principal_of_key
from agent_reach_controller.api.console.query import BadQueryError, a_console_page, check_query
from agent_reach_controller.api.console.render import (
    SECURITY_HEADERS,
    SignedIn,
    Visit,
    clear_session_cookie,
    local_next,
    page,
    set_session_cookie,
)
from agent_reach_controller.api.console.v1 import Answer, segment
from agent_reach_controller.api.tasks import Deps, read_body
from agent_reach_controller.identity.sign_ins import COOKIE, csrf_matches

router = APIRouter(prefix="/console", include_in_schema=False)

_MAX_FIELDS = 8
_MAX_FORM_BYTES = 256 * 1024
_URLENCODED = "application/x-www-form-urlencoded"

Form = dict[str, str]


async def _form(request: Request) -> Form:
    """The posted form (urlencoded, as the pages send it): at most 256 KiB (413 beyond, before
    buffering) and 8 fields; anything else reads as an empty form, which no action accepts."""
    cached: Form | None = getattr(request.state, "console_form", None)
    if cached is not None:
        return cached
    body = await read_body(request, _MAX_FORM_BYTES)
    form: Form = {}
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind == _URLENCODED:
        try:
            pairs = parse_qsl(
                body.decode("utf-8"), keep_blank_values=True, max_num_fields=_MAX_FIELDS
            )
        except (UnicodeDecodeError, ValueError):
            pairs = []
        form = dict(pairs)
    request.state.console_form = form
    return form


def _text(form: Form, name: str) -> str:
    return form.get(name, "")


async def checked_form(found: Visit) -> Form | None:
    """The action's form when it carries this session's CSRF token; None otherwise."""
    form = await _form(found.request)
    return form if csrf_matches(found.sign_in.secret, _text(form, "csrf")) else None


def csrf_refused(found: Visit) -> Response:
    refused = Answer(
        status=403,
        body={
            "title": "Not allowed",
            "code": "csrf_failed",
            "detail": "the form is stale or came from elsewhere: reload the page and try again",
        },
    )
    return found.problem(refused, what="this action")


@router.get("/login")
async def login_form(request: Request) -> Response:
    asked, bad = check_query(request.query_params, {"next": a_console_page})
    if bad:
        raise BadQueryError(None, bad)
    return page("login.html", next=asked.get("next", "/console/tasks"), error=None)


@router.post("/login")
async def login(request: Request, deps: Deps) -> Response:
    """An API key for a session cookie; the key itself is never stored by the browser."""
    if not _same_origin(request):
        return page("login.html", status=403, next="/console/tasks", error=_CROSS_SITE)
    form = await _form(request)
    target = local_next(_text(form, "next"))
    principal = await principal_of_key(deps, _text(form, "api_key").strip())
    if principal is None:
        error = "That API key is not valid (unknown, revoked or mistyped)."
        return page("login.html", status=401, next=target, error=error)
    sign_in = await deps.sign_ins.start(principal)
    response = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    set_session_cookie(deps, request, response, sign_in)
    return response


@router.post("/logout")
async def logout(found: SignedIn) -> Response:
    if await checked_form(found) is None:
        return csrf_refused(found)
    secret = found.request.cookies.get(COOKIE)
    if secret:
        await found.deps.sign_ins.end(secret)
    response = RedirectResponse("/console/login", status_code=303, headers=SECURITY_HEADERS)
    clear_session_cookie(response)
    return response


async def _act(found: Visit, path: str, *, what: str, body: Any = None) -> Answer | Response:
    """One action: the form's CSRF token checked, then its /v1 call; a refusal as a page."""
    if await checked_form(found) is None:
        return csrf_refused(found)
    answer = await found.v1.post(path, body)
    return answer if answer.ok else found.problem(answer, what=what)


@router.post("/tasks/{task_id}/cancel")
async def cancel(found: SignedIn, task_id: str) -> Response:
    task = segment(task_id)
    done = await _act(found, f"/v1/tasks/{task}/cancel", what=f"cancelling task {task_id}")
    if isinstance(done, Response):
        return done
    return found.redirect(f"/console/tasks/{task}?done=cancelled")


@router.post("/runs/{run_id}/cancel")
async def cancel_run(found: SignedIn, run_id: str) -> Response:
    run = segment(run_id)
    done = await _act(found, f"/v1/runs/{run}/cancel", what=f"cancelling run {run_id}")
    if isinstance(done, Response):
        return done
    return found.redirect(f"/console/runs/{run}?done=cancelled")


@router.post("/tasks/{task_id}/rerun")
async def rerun(found: SignedIn, task_id: str) -> Response:
    path = f"/v1/tasks/{segment(task_id)}/rerun"
    done = await _act(found, path, what=f"running task {task_id} again")
    if isinstance(done, Response):
        return done
    return found.redirect(f"/console/tasks/{segment(done.body['task_id'])}")


@router.post("/tasks/{task_id}/steps/{step_id}/approval")
async def decide(found: SignedIn, task_id: str, step_id: str) -> Response:
    """Approve (with the arguments as shown, or as edited) or reject with a reason."""
    form = await checked_form(found)
    if form is None:
        return csrf_refused(found)
    decision = _text(form, "decision")
    body: dict[str, Any] = {"decision": decision, "reason": _text(form, "reason").strip()}
    edited = _text(form, "args").strip()
    if decision == "approve" and edited:
        try:
            args = json.loads(edited)
        except ValueError as exc:
            return found.problem(_not_json(exc), what=f"deciding step {step_id}")
        if args != _shown_args(form):  # reformatted but equal is no edit
            body["args"] = args
    path = f"/v1/tasks/{segment(task_id)}/steps/{segment(step_id)}/approval"
    answer = await found.v1.post(path, body)
    if not answer.ok:
        return found.problem(answer, what=f"deciding step {step_id}")
    done = "approved" if decision == "approve" else "rejected"
    back = local_next(_text(form, "next"), default="/console/approvals")
    return found.redirect(f"{back}{'&' if '?' in back else '?'}done={done}")


@router.post("/tools/{name}/{action}")
async def switch_tool(found: SignedIn, name: str, action: str) -> Response:
    if action not in ("enable", "disable"):
        return Response(status_code=404, headers=SECURITY_HEADERS)
    done = await _act(found, f"/v1/tools/{segment(name)}:{action}", what=f"{action} tool {name}")
    if isinstance(done, Response):
        return done
    back = local_next(_text(await _form(found.request), "next"), default="/console/tools")
    return found.redirect(f"{back}?done={action}d")


def _shown_args(form: Form) -> Any:
    """The arguments the page showed (to tell an edit from the same JSON laid out anew)."""
    try:
        return json.loads(_text(form, "original_args"))
    except ValueError:
        return None


_CROSS_SITE = "Sign in from this console's own page: the form came from another site."


def _same_origin(request: Request) -> bool:
    """A browser names where a form came from; a sign-in posted by another site is refused."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def _not_json(exc: ValueError) -> Answer:
    detail = f"the edited arguments are not JSON: {exc}"
    return Answer(
        status=422,
        body={
            "title": "Invalid request",
            "code": "invalid_request",
            "detail": detail,
            "errors": [{"pointer": "/args", "code": "not_json", "detail": detail}],
        },
    )
