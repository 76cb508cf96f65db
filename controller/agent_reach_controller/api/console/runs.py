"""The console's run pages: the tenant's agent runs; one run's conversation, rounds and waits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.responses import Response

from agent_reach_controller.api.console import conversation
from agent_reach_controller.api.console.pages import Done, done_message
from agent_reach_controller.api.console.query import a_run_id, reads
from agent_reach_controller.api.console.render import SignedIn, Visit
from agent_reach_controller.api.console.v1 import segment

router = APIRouter(prefix="/console", include_in_schema=False)

_LISTED = 50
# A run page reads the tasks of its latest rounds (one /v1 call each); older rounds are still
# shown and linked, without their steps' statuses.
_ROUNDS_READ = 50
# How far a run page looks through the approvals inbox for the steps its run waits on.
_APPROVAL_PAGES = 5
_APPROVAL_PAGE = 200
_ENDED = ("succeeded", "failed", "cancelled")

Older = Annotated[dict[str, str], reads(before=a_run_id)]


@router.get("/runs")
async def runs(found: SignedIn, asked: Older) -> Response:
    answer = await found.v1.get("/v1/runs", {"limit": _LISTED, "before": asked.get("before")})
    if not answer.ok:
        return found.problem(answer, what="the run list")
    listed = answer.body.get("runs", [])
    older = listed[-1]["run_id"] if len(listed) == _LISTED else None
    return found.page("runs.html", runs=listed, next_before=older)


@router.get("/runs/{run_id}")
async def run(found: SignedIn, run_id: str, asked: Done) -> Response:
    answer = await found.v1.get(f"/v1/runs/{segment(run_id)}")
    if not answer.ok:
        return found.problem(answer, what=f"run {run_id}")
    view: dict[str, Any] = answer.body
    kept = view.get("rounds") or []
    messages = view.get("messages") or []
    tasks, inbox = await asyncio.gather(_round_tasks(found, kept), _approvals(found, view))
    return found.page(
        "run.html",
        run=view,
        rounds=conversation.rounds(messages, kept, tasks),
        waiting=[_waiting(w, inbox) for w in view.get("waiting_for") or []],
        last_seq=max((int(m.get("seq") or 0) for m in messages), default=0),
        ended=view.get("status") in _ENDED,
        done=done_message(asked),
    )


async def _round_tasks(found: Visit, kept: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The latest rounds' tasks (their steps: each call's tool, status and receipt)."""
    ids = [str(r["task_id"]) for r in kept[-_ROUNDS_READ:]]
    answers = await asyncio.gather(*(found.v1.get(f"/v1/tasks/{segment(t)}") for t in ids))
    return {t: a.body for t, a in zip(ids, answers, strict=True) if a.ok}


async def _approvals(found: Visit, view: dict[str, Any]) -> dict[tuple[str, str], Any]:
    """The approvals inbox's entries for the steps the run waits on, as the inbox shows them
    (with whether this person may decide them: separation of duties is the API's)."""
    wanted = {
        (w["task_id"], w["step_id"])
        for w in view.get("waiting_for") or []
        if w.get("status") == "awaiting_approval"
    }
    got: dict[tuple[str, str], Any] = {}
    after = None
    for _ in range(_APPROVAL_PAGES if wanted else 0):
        answer = await found.v1.get("/v1/approvals", {"limit": _APPROVAL_PAGE, "after": after})
        if not answer.ok:
            break
        for a in answer.body.get("approvals", []):
            if (a["task_id"], a["step_id"]) in wanted:
                got[(a["task_id"], a["step_id"])] = a
        after = answer.body.get("next_after")
        if after is None or len(got) == len(wanted):
            break
    return got


def _waiting(wait: dict[str, Any], inbox: dict[tuple[str, str], Any]) -> dict[str, Any]:
    return {"wait": wait, "approval": inbox.get((wait["task_id"], wait["step_id"]))}
