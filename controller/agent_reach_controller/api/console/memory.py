"""The console's memory pages: the tenant's subjects; one subject's memories with their sources,
searched, edited, confirmed and forgotten, each action one /v1/memory call.

A memory's text may be anything a user, a model or a tool's output said: it is only ever shown
as escaped text. Whether the edit and forget buttons show follows the policy; what an action
may do is the API's to say (a forced form gets its 403).
"""

from __future__ import annotations

import math
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter
from fastapi.responses import Response

from agent_reach_controller.api.console.actions import Form, checked_form, csrf_refused
from agent_reach_controller.api.console.query import (
    BadParameter,
    BadQueryError,
    at_most,
    one_of,
    reads,
)
from agent_reach_controller.api.console.render import SignedIn, Visit
from agent_reach_controller.api.console.v1 import Answer, segment
from agent_reach_controller.api.memory import MAX_QUERY
from agent_reach_controller.domain.subjects import MAX_SUBJECT
from agent_reach_controller.identity.policy import Action

router = APIRouter(prefix="/console", include_in_schema=False)

_SUBJECTS = 50  # subjects a page lists
_ENTRIES = 500  # the most of a subject's memories the API lists at once
_FOUND = 100  # the most a search answers
_DONE = {
    "saved": "Memory saved.",
    "unchanged": "Nothing was changed: the memory already says so.",
    "confirmed": "Memory confirmed: its origin is now user, and runs may recall it.",
    "forgotten": "Memory forgotten.",
    "subject_forgotten": "Every memory of the subject is forgotten.",
}


def a_subject(value: str) -> None:
    """A subject as /v1/memory takes one: 1-256 characters, no control characters."""
    at_most(MAX_SUBJECT)(value)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ValueError("holds a control character, which no subject does")


_done = one_of(tuple(_DONE))
Subjects = Annotated[dict[str, str], reads(after=a_subject, done=_done)]
Entries = Annotated[dict[str, str], reads(subject=a_subject, q=at_most(MAX_QUERY), done=_done)]


def _done_message(asked: dict[str, str]) -> str | None:
    """A fixed message after an action (never text echoed from the URL)."""
    return _DONE.get(asked.get("done", ""))


def subject_page(subject: str, *, done: str | None = None, memory_id: str | None = None) -> str:
    """Where a subject's memories are shown (at one of them)."""
    query = urlencode({"subject": subject} | ({"done": done} if done else {}))
    return f"/console/memory/subject?{query}" + (
        f"#memory-{segment(memory_id)}" if memory_id else ""
    )


@router.get("/memory")
async def subjects(found: SignedIn, asked: Subjects) -> Response:
    answer = await found.v1.get(
        "/v1/memory/subjects", {"limit": _SUBJECTS, "after": asked.get("after")}
    )
    if not answer.ok:
        return found.problem(answer, what="the memory's subjects")
    return found.page(
        "memory.html",
        subjects=answer.body.get("subjects", []),
        next_after=answer.body.get("next_after"),
        done=_done_message(asked),
    )


@router.get("/memory/subject")
async def entries(found: SignedIn, asked: Entries) -> Response:
    """A subject's memories, newest first, or those that match `q`, best first."""
    subject = asked.get("subject")
    if subject is None:
        needed = "is needed: the end user whose memories to show (follow a link on /console/memory)"
        raise BadQueryError(found, [BadParameter(name="subject", problem=needed)])
    q = asked.get("q")
    if q:
        ask = {"subject": subject, "q": q, "limit": _FOUND}
        answer = await found.v1.get("/v1/memory/search", ask)
    else:
        answer = await found.v1.get("/v1/memory", {"subject": subject, "limit": _ENTRIES})
    if not answer.ok:
        return found.problem(answer, what=f"the memories of {subject}")
    memories = answer.body.get("memories", [])
    roles = found.sign_in.principal.roles
    policy = found.deps.policy
    return found.page(
        "memory_subject.html",
        subject=subject,
        q=q or "",
        memories=memories,
        cut=not q and len(memories) == _ENTRIES,
        may_write=policy.allows(roles, Action.MEMORY_WRITE),
        may_forget=policy.allows(roles, Action.MEMORY_FORGET),
        done=_done_message(asked),
    )


@router.post("/memory/forget")
async def forget_subject(found: SignedIn) -> Response:
    """Every memory of a subject, once its name is typed again (nothing is deleted otherwise)."""
    form = await checked_form(found)
    if form is None:
        return csrf_refused(found)
    subject = form.get("subject", "")
    what = f"forgetting every memory of {subject}"
    if not subject or form.get("confirm", "") != subject:
        return found.problem(_unconfirmed(), what=what)
    answer = await found.v1.delete("/v1/memory", {"subject": subject})
    if not answer.ok:
        return found.problem(answer, what=what)
    return found.redirect("/console/memory?done=subject_forgotten")


@router.post("/memory/{memory_id}/edit")
async def edit(found: SignedIn, memory_id: str) -> Response:
    """Text, pin and confidence as the form has them, only those that differ, and only if the
    memory is still at the version the form showed (412 otherwise)."""
    form = await checked_form(found)
    if form is None:
        return csrf_refused(found)
    path = f"/v1/memory/{segment(memory_id)}"
    what = f"editing memory {memory_id}"
    now = await found.v1.get(path)
    if not now.ok:
        return found.problem(now, what=what)
    changes = _changes(now.body, form)
    if not changes:
        return found.redirect(
            subject_page(now.body["subject"], done="unchanged", memory_id=memory_id)
        )
    answer = await found.v1.patch(path, changes, if_match=_etag(form))
    return _back(found, answer, what=what, done="saved")


@router.post("/memory/{memory_id}/confirm")
async def confirm(found: SignedIn, memory_id: str) -> Response:
    """A person says an entry a tool's output planted is true: its origin becomes user."""
    form = await checked_form(found)
    if form is None:
        return csrf_refused(found)
    path = f"/v1/memory/{segment(memory_id)}"
    answer = await found.v1.patch(path, {"origin": "user"}, if_match=_etag(form))
    return _back(found, answer, what=f"confirming memory {memory_id}", done="confirmed")


@router.post("/memory/{memory_id}/forget")
async def forget(found: SignedIn, memory_id: str) -> Response:
    form = await checked_form(found)
    if form is None:
        return csrf_refused(found)
    answer = await found.v1.delete(f"/v1/memory/{segment(memory_id)}")
    if not answer.ok:
        return found.problem(answer, what=f"forgetting memory {memory_id}")
    subject = form.get("subject", "")
    try:
        a_subject(subject)
    except ValueError:
        subject = ""
    if not subject:
        return found.redirect("/console/memory?done=forgotten")
    return found.redirect(subject_page(subject, done="forgotten"))


def _back(found: Visit, answer: Answer, *, what: str, done: str) -> Response:
    if not answer.ok:
        return found.problem(answer, what=what)
    entry = answer.body
    return found.redirect(subject_page(entry["subject"], done=done, memory_id=entry["memory_id"]))


def _etag(form: Form) -> str:
    """The version the form showed, as an ETag; anything else matches no version (412)."""
    version = form.get("version", "")
    return f'"{version}"' if version.isascii() and version.isdigit() else '"none"'


def _changes(current: dict[str, Any], form: Form) -> dict[str, Any]:
    """The form's fields that differ from the memory as it is (a field left out: unchanged).
    A browser sends a textarea's lines with CRLF: read as LF, so an untouched text is no
    change. A value no field takes goes as typed, for the API to refuse with its pointer."""
    given: dict[str, Any] = {}
    if "text" in form:
        given["text"] = form["text"].replace("\r\n", "\n")
    if "pinned" in form:
        given["pinned"] = {"yes": True, "no": False}.get(form["pinned"], form["pinned"])
    if "confidence" in form:
        given["confidence"] = _number(form["confidence"])
    return {name: value for name, value in given.items() if value != current.get(name)}


def _number(value: str) -> float | str:
    """A finite number, or the text as typed, for the API to refuse with its pointer."""
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def _unconfirmed() -> Answer:
    detail = "type the subject's name exactly to forget all its memories: nothing was deleted"
    return Answer(
        status=422,
        body={
            "title": "Not confirmed",
            "code": "invalid_request",
            "detail": detail,
            "errors": [{"pointer": "/confirm", "code": "not_confirmed", "detail": detail}],
        },
    )
