"""Approvals of steps that wait for a person: bound to the tool version and a hash of the exact
arguments.

Which steps wait is one rule, `tools.environments.needs_approval`: a `dangerous` tool's, and in
the `prod` environment a `write` tool's unless it is exempted. An approval is asked for when
such a step becomes ready; it says which tool version and which arguments (a SHA-256 of their
canonical JSON) it is about, and until when it may be given. It is checked again when the step
is leased, so an approval can never be spent on other arguments, another step or another
version of the tool.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach.states import StepStatus, Transition
from agent_reach.times import rfc3339
from agent_reach_controller.decide.outcomes import Decision, terminal_values
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.planning.fanout import parent_of
from agent_reach_controller.tools.catalog import ToolSpec
from agent_reach_controller.tools.environments import needs_approval


class SeveralAwaitingError(Exception):
    """A decision was asked of a step whose children wait for several decisions: each is
    decided on its own (`awaiting` lists them)."""

    def __init__(self, step_id: str, awaiting: Sequence[str]) -> None:
        listed = ", ".join(repr(a) for a in awaiting)
        super().__init__(
            f"step {step_id!r} waits on {len(awaiting)} decisions; decide each of {listed}"
        )
        self.awaiting = list(awaiting)


def decided_step(step: StepRow, steps: Iterable[StepRow]) -> StepRow:
    """The step a decision asked of `step` is for: `step` itself, or, when it waits on children
    (a fan-out or verified step never waits for approval itself) and exactly one of them waits
    for a decision, that child. SeveralAwaitingError when more than one does; a step with none
    is returned for the caller to refuse as not waiting."""
    if step.status is StepStatus.AWAITING_APPROVAL:
        return step
    waiting = sorted(
        (
            s
            for s in steps
            if parent_of(s.step_id) == step.step_id and s.status is StepStatus.AWAITING_APPROVAL
        ),
        key=lambda s: s.position,
    )
    if len(waiting) > 1:
        raise SeveralAwaitingError(step.step_id, [s.step_id for s in waiting])
    return waiting[0] if waiting else step


def args_hash(args: Any) -> str:
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def request_values(
    step: StepRow, resolved: Any, *, now: datetime, ttl: timedelta, due: datetime | None = None
) -> dict[str, Any]:
    """The columns of a step that starts waiting for approval; its time to decide counts from
    when it is `due` to run, if that is later (a scheduled step)."""
    return {
        "approval": {
            "step": f"{step.task_id}/{step.step_id}",
            "tool": step.tool,
            "tool_version": step.tool_version,
            "args_hash": args_hash(resolved),
            "requested_at": rfc3339(now),
        },
        "decide_by": max(now, due or now) + ttl,
    }


def requests(
    unblocked: Iterable[StepChange],
    *,
    tool_of: Callable[[str, str], ToolSpec],
    now: datetime,
    ttl: timedelta,
) -> list[StepChange]:
    """The second move of each step just made ready that needs an approval in its environment
    (`needs_approval`): it waits for a person instead, and is never offered to an executor until
    approved (`unblocked`: changes applied)."""
    return [
        StepChange(
            step=replace(c.step, status=StepStatus.READY, **c.values),
            transition=Transition.REQUIRE_APPROVAL,
            values=request_values(
                c.step,
                c.values["resolved_args"],
                now=now,
                ttl=ttl,
                due=c.values.get("not_before"),
            ),
        )
        for c in unblocked
        if c.transition is Transition.UNBLOCK
        and needs_approval(tool_of(c.step.tool, c.step.tool_version), c.step.environment)
    ]


def mismatch(step: StepRow) -> str | None:
    """Why a leased step that needs an approval may not run on the one it has; None when the
    approval holds."""
    approval = step.approval or {}
    if approval.get("decision") != "approved":
        return "not run: it has no approval"
    if approval.get("step") != f"{step.task_id}/{step.step_id}":
        return "not run: its approval is for another step"
    if approval.get("tool") != step.tool or approval.get("tool_version") != step.tool_version:
        return "not run: its approval is for another version of the tool"
    args = step.resolved_args if step.resolved_args is not None else step.args
    if approval.get("args_hash") != args_hash(args):
        return "not run: its arguments are not the ones that were approved"
    return None


def decided(  # noqa: PLR0913 - one decision's facts, all by keyword
    step: StepRow,
    tool: ToolSpec,
    *,
    approve: bool,
    by: str,
    reason: str,
    now: datetime,
    args: dict[str, Any] | None = None,
) -> StepChange:
    """A person's decision on a waiting step: approved (perhaps with edited arguments), or not.

    The caller has checked that the step waits, that the approval has not expired, that the
    decider may decide, and that edited arguments fit the tool's schema.
    """
    approval = dict(step.approval or {})
    if not approve:
        message = f"rejected by {by}" + (f": {reason}" if reason else "")
        error = {"code": ErrorCode.REJECTED.value, "message": message, "retryable": False}
        ended = terminal_values(step, tool=tool, transition=Transition.REJECT, now=now, error=error)
        ended["approval"] = approval | {"decision": "rejected", "by": by, "at": rfc3339(now)}
        ended["decide_by"] = None
        return StepChange(
            step=step,
            transition=Transition.REJECT,
            values=ended,
            event_data={"by": by, "reason": reason, "error": error},
        )
    before = step.resolved_args if step.resolved_args is not None else step.args
    final = before if args is None else args
    approval |= {
        "decision": "approved",
        "by": by,
        "at": rfc3339(now),
        "args_hash": args_hash(final),
    }
    values: dict[str, Any] = {"approval": approval, "decide_by": None}
    data: dict[str, Any] = {"by": by, "reason": reason}
    if args is not None and args != before:
        values["resolved_args"] = args
        data["edited"] = {"before": before, "after": args}
    return StepChange(step=step, transition=Transition.APPROVE, values=values, event_data=data)


def expired(step: StepRow, ctx: Decision) -> StepChange:
    """Nobody decided in time: the step is rejected, and the model is told why."""
    asked = (step.approval or {}).get("requested_at", "")
    message = f"not approved in time: nobody decided on it (asked at {asked})"
    error = {"code": ErrorCode.REJECTED.value, "message": message, "retryable": False}
    values = terminal_values(
        step, tool=ctx.tool, transition=Transition.REJECT, now=ctx.now, error=error
    )
    values["approval"] = dict(step.approval or {}) | {"decision": "expired"}
    values["decide_by"] = None
    return StepChange(
        step=step, transition=Transition.REJECT, values=values, event_data={"error": error}
    )
