"""The approvals inbox: steps waiting for a decision the caller may give, soonest deadline first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError

from agent_reach_controller.api import schemas
from agent_reach_controller.api.auth import Caller
from agent_reach_controller.api.problems import V1_PROBLEMS
from agent_reach_controller.api.tasks import Deps
from agent_reach_controller.identity.policy import Action, Principal
from agent_reach_controller.runtime import Components
from agent_reach_controller.storage.listings import Awaiting

router = APIRouter(prefix="/v1/approvals", tags=["approvals"], responses=V1_PROBLEMS)

# A page's cursor: the last step's `decide_by` (microseconds since 1970) and its key.
CURSOR = r"^[0-9]{1,18}-[0-9]{1,18}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@router.get(
    "",
    response_model=schemas.ApprovalPage,
    summary="Steps waiting for a decision you may give, soonest deadline first",
)
async def list_approvals(
    deps: Deps,
    who: Caller,
    after: Annotated[
        str | None,
        Query(pattern=CURSOR, description="`next_after` of the previous page"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> schemas.ApprovalPage:
    """Your tenant's steps whose tool your roles may approve, each with exactly the arguments
    the approval is for and whether you may decide on it now (separation of duties)."""
    found, last = await deps.queries.approvals(
        tenant=who.tenant,
        may_approve=lambda tool: deps.policy.allows(who.roles, Action.APPROVE, tool),
        after=_cursor(after),
        limit=limit,
    )
    await deps.registry.ensure([(w.step.tool, w.step.tool_version) for w in found])
    now = datetime.now(UTC)
    return schemas.ApprovalPage(
        approvals=[_approval_out(deps, who, w, now) for w in found],
        next_after=None if last is None else f"{(last[0] - _EPOCH) // _MICROSECOND}-{last[1]}",
    )


def _cursor(after: str | None) -> tuple[datetime, int] | None:
    if after is None:
        return None
    micros, key = after.split("-")
    try:
        return _EPOCH + int(micros) * _MICROSECOND, int(key)
    except OverflowError:
        raise RequestValidationError(
            [{"loc": ("query", "after"), "type": "value_error", "msg": "not a page of this list"}]
        ) from None


def _approval_out(
    deps: Components, who: Principal, waiting: Awaiting, now: datetime
) -> schemas.ApprovalOut:
    step = waiting.step
    tool = deps.registry.get(step.tool, step.tool_version)
    asked_at = (step.approval or {}).get("requested_at")
    return schemas.ApprovalOut(
        task_id=step.task_id,
        step_id=step.step_id,
        tool=step.tool,
        tool_version=step.tool_version,
        risk=tool.risk,
        environment=step.environment,
        # What `decide.approvals` hashed when it asked: the resolved arguments once resolved.
        args=step.resolved_args if step.resolved_args is not None else step.args,
        input_schema=tool.input_schema,
        asked_by=waiting.asked_by,
        asked_at=None if asked_at is None else datetime.fromisoformat(asked_at),
        decide_by=waiting.decide_by,
        may_decide=(why := _why_not(deps, who, waiting, now)) is None,
        why_not=why,
    )


def _why_not(
    deps: Components, who: Principal, waiting: Awaiting, now: datetime
) -> schemas.NotDecidable | None:
    """What `OperatorService.decide` would refuse this caller for (its rules, in its order)."""
    if deps.settings.separation_of_duties and waiting.asked_by == who.name:
        return schemas.NotDecidable(
            code="separation_of_duties",
            detail=f"{who.name} submitted this task and may not also approve its steps",
        )
    if waiting.decide_by < now:
        return schemas.NotDecidable(
            code="expired",
            detail=f"the approval of step {waiting.step.step_id!r} has expired",
        )
    return None
