"""The console's pages, each a view of /v1 answers: tasks, one task, approvals, tools, executors."""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from agent_reach_controller.api.console.query import (
    BadParameter,
    BadQueryError,
    a_task_id,
    a_time,
    a_tool_name,
    at_most,
    check_query,
    moment,
    one_of,
    reads,
    utc,
)
from agent_reach_controller.api.console.render import (
    SECURITY_HEADERS,
    SignedIn,
)
from agent_reach_controller.api.console.v1 import segment

router = APIRouter(prefix="/console", include_in_schema=False)

_STATIC = {"console.js": "text/javascript", "console.css": "text/css"}
_STATUSES = ("pending", "running", "succeeded", "failed", "cancelled")
_DONE = {
    "cancelled": "Cancel requested.",
    "approved": "Approved.",
    "rejected": "Rejected.",
    "enabled": "Tool enabled.",
    "disabled": "Tool disabled.",
}

# What each page reads from its address (anything else is a 400 page naming it).
Nothing = Annotated[dict[str, str], reads()]
Done = Annotated[dict[str, str], reads(done=one_of(tuple(_DONE)))]
TaskFilters = Annotated[
    dict[str, str],
    reads(
        status=one_of(_STATUSES),
        tool=a_tool_name,
        principal=at_most(128),
        since=a_time,
        until=a_time,
        before=a_task_id,
    ),
]


def done_message(asked: dict[str, str]) -> str | None:
    """A fixed message after an action (never text echoed from the URL)."""
    return _DONE.get(asked.get("done", ""))


@router.get("")
async def home(request: Request) -> Response:
    _, bad = check_query(request.query_params, {})
    if bad:
        raise BadQueryError(None, bad)
    return RedirectResponse("/console/tasks", status_code=303, headers=SECURITY_HEADERS)


@router.get("/static/{name}")
async def static(name: str) -> Response:
    media = _STATIC.get(name)
    if media is None:
        return Response(status_code=404, headers=SECURITY_HEADERS)
    body = resources.files(__package__).joinpath("static", name).read_bytes()
    headers = {**SECURITY_HEADERS, "Cache-Control": "no-cache"}
    return Response(body, media_type=media, headers=headers)


@router.get("/tasks")
async def tasks(found: SignedIn, asked: TaskFilters) -> Response:
    since, until = asked.get("since"), asked.get("until")
    if since and until and moment(until) <= moment(since):
        raise BadQueryError(found, [BadParameter(name="until", problem="must be later than since")])
    filters = {k: asked.get(k) for k in ("status", "tool", "principal", "since", "until")}
    ask = {**filters, "since": utc(since), "until": utc(until), "before": asked.get("before")}
    answer = await found.v1.get("/v1/tasks", {**ask, "limit": 50})
    if not answer.ok:
        return found.problem(answer, what="the task list")
    page = answer.body
    keep = {k: v for k, v in filters.items() if v}
    return found.page(
        "tasks.html",
        tasks=page["tasks"],
        next_before=page.get("next_before"),
        filters=filters,
        keep=keep,
        statuses=_STATUSES,
    )


@router.get("/tasks/{task_id}")
async def task(found: SignedIn, task_id: str, asked: Done) -> Response:
    path = f"/v1/tasks/{segment(task_id)}"
    answer = await found.v1.get(path)
    if not answer.ok:
        return found.problem(answer, what=f"task {task_id}")
    events, replay = await asyncio.gather(
        found.v1.get(f"{path}/events", {"limit": 5000}), found.v1.get(f"{path}/replay")
    )
    jaeger = found.deps.settings.jaeger_url
    view = answer.body
    timeline = events.body["events"] if events.ok else []
    return found.page(
        "task.html",
        task=view,
        steps=ordered_steps(view["steps"]),
        timeline=timeline,
        dry_run=replay.body["dry_run"] if replay.ok else None,
        last_event=max((e["id"] for e in timeline), default=0),
        jaeger=jaeger.replace("{trace_id}", view["trace_id"]) if jaeger else None,
        done=done_message(asked),
    )


@router.get("/tasks/{task_id}/steps")
async def task_steps(found: SignedIn, task_id: str, _: Nothing) -> Response:
    """The step tree alone, which the page's script swaps in as events arrive."""
    answer = await found.v1.get(f"/v1/tasks/{segment(task_id)}")
    if not answer.ok:
        return found.problem(answer, what=f"task {task_id}")
    return found.page("steps.html", task=answer.body, steps=ordered_steps(answer.body["steps"]))


@router.get("/approvals")
async def approvals(found: SignedIn, asked: Done) -> Response:
    answer = await found.v1.get("/v1/approvals", {"limit": 200})
    if not answer.ok:
        return found.problem(answer, what="the approvals inbox")
    return found.page(
        "approvals.html",
        approvals=answer.body.get("approvals", []),
        done=done_message(asked),
    )


@router.get("/tools")
async def tools(found: SignedIn, asked: Done) -> Response:
    listed = await found.v1.get("/v1/tools", {"include_disabled": "true"})
    if not listed.ok:
        return found.problem(listed, what="the tools")
    catalogue = listed.body.get("tools", [])
    usages = await asyncio.gather(
        *(found.v1.get(f"/v1/tools/{segment(t['name'])}/usage") for t in catalogue)
    )
    return found.page(
        "tools.html",
        tools=catalogue,
        usage={t["name"]: u.body for t, u in zip(catalogue, usages, strict=True) if u.ok},
        done=done_message(asked),
    )


@router.get("/tools/{name}")
async def tool(found: SignedIn, name: str, asked: Done) -> Response:
    path = f"/v1/tools/{segment(name)}"
    head, versions, usage = await asyncio.gather(
        found.v1.get(path), found.v1.get(f"{path}/versions"), found.v1.get(f"{path}/usage")
    )
    if not head.ok:
        return found.problem(head, what=f"tool {name}")
    return found.page(
        "tool.html",
        tool=head.body,
        history=versions.body if versions.ok else None,
        usage=usage.body if usage.ok else None,
        done=done_message(asked),
    )


@router.get("/executors")
async def executors(found: SignedIn, _: Nothing) -> Response:
    answer = await found.v1.get("/v1/executors")
    if not answer.ok:
        return found.problem(answer, what="the executors")
    return found.page("executors.html", executors=answer.body.get("executors", []))


def ordered_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps in plan order, each with its depth in the dependency tree (for indenting)."""
    depth: dict[str, int] = {}
    by_id = {s["step_id"]: s for s in steps}

    def depth_of(step_id: str, seen: frozenset[str] = frozenset()) -> int:
        if step_id in depth:
            return depth[step_id]
        parents = [p for p in by_id[step_id]["depends_on"] if p in by_id and p not in seen]
        found = 1 + max((depth_of(p, seen | {step_id}) for p in parents), default=-1)
        depth[step_id] = found
        return found

    return [{**s, "depth": min(depth_of(s["step_id"]), 6)} for s in steps]
