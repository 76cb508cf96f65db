"""What people do to tasks already running: cancel them, resolve a step whose outcome is
unknown, approve or reject a step waiting for approval, and report the model tokens a task used.

Each action is one unit of work: the task locked, the decided change applied, the task advanced,
an audit row naming who acted, and wake-ups once committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach.states import TERMINAL_STEP_STATES, TERMINAL_TASK_STATES, StepStatus, Transition
from agent_reach.times import rfc3339
from agent_reach_controller.decide import approvals
from agent_reach_controller.decide.outcomes import decide_resolution, start_by, terminal_values
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.planning import argmap, fanout
from agent_reach_controller.planning.plan import validate_resolved_args
from agent_reach_controller.planning.problems import Problem, ProblemCode
from agent_reach_controller.services.queries import (
    StepNotFoundError,
    TaskNotFoundError,
    TaskView,
    read_view,
)
from agent_reach_controller.services.unit_of_work import TaskWork, UnitOfWork
from agent_reach_controller.storage import events as event_log
from agent_reach_controller.storage import steps as store
from agent_reach_controller.storage import tasks as task_store


class StepNotResolvableError(Exception):
    """Only a step in `outcome_unknown` can be resolved by an operator."""

    def __init__(self, step_id: str, status: str, why: str | None = None) -> None:
        super().__init__(
            why or f"step {step_id!r} is {status}; only outcome_unknown steps are resolved"
        )
        self.status = status


class NotAwaitingApprovalError(Exception):
    """Only a step waiting for approval can be approved or rejected."""

    def __init__(self, step_id: str, status: str) -> None:
        super().__init__(f"step {step_id!r} is {status}; only awaiting_approval steps are decided")


class ApprovalExpiredError(Exception):
    """The approval was not given in time; the step is (or is about to be) rejected."""


class SelfApprovalError(Exception):
    """Separation of duties: whoever submitted a task may not approve its steps."""


class EditedArgumentsError(Exception):
    """Edited arguments do not fit the tool's input schema; `problems` says where."""

    def __init__(self, problems: list[Any]) -> None:
        super().__init__("the edited arguments are invalid")
        self.problems = problems


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalInput:
    """A person's decision on a step waiting for approval."""

    task_id: str
    step_id: str
    approve: bool
    by: str
    tenant: str
    reason: str = ""
    args: dict[str, Any] | None = None  # edited arguments, replacing the resolved ones
    separation_of_duties: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolveInput:
    """An operator's verdict on a step whose outcome is unknown."""

    task_id: str
    step_id: str
    action: str  # retry | succeeded | failed
    by: str
    reason: str = ""
    output: Any = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NotMoved:
    """A step that keeps its time: it has started (`status`), or it `follows` one that has."""

    step_id: str
    status: str
    follows: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rescheduled:
    """The task after a reschedule, which steps moved and which kept their time."""

    view: TaskView
    moved: list[str]
    not_moved: list[NotMoved]


class NotReschedulableError(Exception):
    """Only a step that has not started yet (blocked, or queued for its first attempt) moves;
    a fan-out or verified step moves when one of its children can (`not_moved`: none could)."""

    def __init__(self, step_id: str, status: str, not_moved: Sequence[NotMoved] = ()) -> None:
        if not_moved:
            said = ", ".join(
                f"{n.step_id} follows {n.follows}" if n.follows else f"{n.step_id} is {n.status}"
                for n in not_moved[:10]
            )
            why = f"step {step_id!r} moves none of its children: each has started ({said})"
        else:
            why = f"step {step_id!r} is {status}: only a step that has not started yet can be "
            why += "rescheduled"
        super().__init__(why)
        self.not_moved = list(not_moved)


@dataclass(frozen=True, slots=True, kw_only=True)
class RescheduleInput:
    """A new time for a step that has not started."""

    task_id: str
    step_id: str
    run_at: datetime
    by: str
    tenant: str


class OperatorService:
    """Cancel, resolve, approve or reject; each under the task's lock, audited."""

    def __init__(self, *, work: UnitOfWork) -> None:
        self._work = work

    async def cancel(
        self,
        task_id: str,
        *,
        reason: str = "cancelled by request",
        by: tuple[str, str] | None = None,
    ) -> TaskView:
        """Cancel every step not yet finished; running ones learn it from their heartbeat.

        `by` is the (principal, tenant) who asked, recorded in the audit log.
        """
        error = {"code": ErrorCode.CANCELLED.value, "message": reason, "retryable": False}
        return await self.end(task_id, error=error, by=by)

    async def end(
        self, task_id: str, *, error: dict[str, Any], by: tuple[str, str] | None = None
    ) -> TaskView:
        """Cancel what is left of a task with `error` as every unfinished step's receipt."""
        async with self._work.begin() as tx:
            task = await tx.lock_task(task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            if by is not None:
                await tx.audit(
                    actor=by[0],
                    tenant=by[1],
                    action="task.cancel",
                    target=f"task:{task_id}",
                    data={"status": task.status.value},
                )
            reason = str(error.get("message", ""))
            if task.status not in TERMINAL_TASK_STATES:
                await tx.request_cancel(task)
                await tx.change(
                    [
                        StepChange(
                            step=step,
                            transition=Transition.CANCEL,
                            values=terminal_values(
                                step,
                                tool=tx.tool(step),
                                transition=Transition.CANCEL,
                                now=tx.now,
                                error=error,
                            ),
                            # Who cancelled, in the event log and so in the task's trace.
                            event_data=None if by is None else {"by": by[0], "reason": reason},
                        )
                        for step in await tx.steps_of(task_id)
                        if step.status not in TERMINAL_STEP_STATES
                    ]
                )
                await tx.advance()
            return await read_view(tx.conn, task_id)

    async def resolve(self, data: ResolveInput) -> TaskView:
        """Apply an operator's verdict; the event log records who decided and why."""
        async with self._work.begin() as tx:
            if await tx.lock_task(data.task_id) is None:
                raise TaskNotFoundError(data.task_id)
            step = await _step_of(tx, data.task_id, data.step_id)
            if step.status is not StepStatus.OUTCOME_UNKNOWN:
                raise StepNotResolvableError(step.step_id, step.status.value)
            if data.action == "retry" and fanout.gathers(step.step_id, tx.tool(step)):
                why = (
                    f"step {step.step_id!r} never runs itself (its children did): say "
                    "'succeeded' or 'failed', or submit it again"
                )
                raise StepNotResolvableError(step.step_id, step.status.value, why)
            change = decide_resolution(
                step,
                action=data.action,
                tool=tx.tool(step),
                now=tx.now,
                output=data.output,
                reason=data.reason,
            )
            verdict = {"by": data.by, "reason": data.reason, "action": data.action}
            await tx.change([replace(change, event_data=verdict)])
            await tx.audit(
                actor=data.by,
                tenant=data.tenant,
                action="step.resolve",
                target=f"task:{data.task_id}/step:{data.step_id}",
                data={"action": data.action, "reason": data.reason[:500]},
            )
            if data.action == "retry":
                tx.wake(connectors=[step.connector])
            await tx.advance()
            return await read_view(tx.conn, data.task_id)

    async def decide(self, data: ApprovalInput) -> TaskView:
        """Approve (perhaps with edited arguments) or reject a step waiting for approval."""
        async with self._work.begin() as tx:
            task = await tx.lock_task(data.task_id)
            if task is None or task.tenant != data.tenant:
                raise TaskNotFoundError(data.task_id)
            steps = await tx.steps_of(data.task_id)
            # A fan-out or verified step is decided through its one child waiting for it.
            step = approvals.decided_step(_step_in(steps, data.step_id), steps)
            if step.status is not StepStatus.AWAITING_APPROVAL:
                raise NotAwaitingApprovalError(step.step_id, step.status.value)
            if data.separation_of_duties and task.principal == data.by:
                raise SelfApprovalError(
                    f"{data.by} submitted this task and may not also approve its steps"
                )
            if step.decide_by is not None and step.decide_by < tx.now:
                raise ApprovalExpiredError(f"the approval of step {step.step_id!r} has expired")
            tool = tx.tool(step)
            if data.args is not None and (problems := validate_resolved_args(tool, data.args)):
                raise EditedArgumentsError(problems)
            if data.args is not None and tool.map_args is not None:
                try:
                    argmap.apply(tool.map_args, data.args)
                except argmap.ArgMapError as exc:
                    problem = Problem(
                        pointer="/args", code=ProblemCode.INVALID_ARGUMENTS, detail=str(exc)
                    )
                    raise EditedArgumentsError([problem]) from None
            change = approvals.decided(
                step,
                tool,
                approve=data.approve,
                by=data.by,
                reason=data.reason,
                now=tx.now,
                args=data.args,
            )
            await tx.change([change])
            await tx.audit(
                actor=data.by,
                tenant=data.tenant,
                action="approval.approve" if data.approve else "approval.reject",
                target=f"task:{data.task_id}/step:{step.step_id}",
                data={"reason": data.reason[:500], "edited": "resolved_args" in change.values},
            )
            if data.approve:
                tx.wake(connectors=[step.connector])
            await tx.advance()
            return await read_view(tx.conn, data.task_id)

    async def reschedule(self, data: RescheduleInput) -> Rescheduled:
        """Move a step that has not started to another time (earlier or later).

        A fan-out or verified step never runs itself: moving it moves each of its children that
        has not started (and the step's own `run_at`, which says the time asked). A child that
        started, or that follows a sibling that did (a verified write's read-back), stays, and
        the answer says so; when none can move, NotReschedulableError lists them.
        """
        async with self._work.begin() as tx:
            task = await tx.lock_task(data.task_id)
            if task is None or task.tenant != data.tenant:
                raise TaskNotFoundError(data.task_id)
            steps = await tx.steps_of(data.task_id)
            step = _step_in(steps, data.step_id)
            parent = fanout.gathers(step.step_id, tx.tool(step))
            family = [step]
            if parent:
                family = sorted(
                    (s for s in steps if fanout.parent_of(s.step_id) == step.step_id),
                    key=lambda s: s.position,
                )
            moved: list[StepRow] = []
            stayed: list[NotMoved] = []
            for member in family:
                why = _why_not_movable(member, stayed)
                if why is None and not await _move(tx, member, data.run_at):
                    why = NotMoved(step_id=member.step_id, status=StepStatus.RUNNING.value)
                if why is None:
                    moved.append(member)
                else:
                    stayed.append(why)
            if not moved:
                if parent:
                    raise NotReschedulableError(step.step_id, step.status.value, stayed)
                raise NotReschedulableError(step.step_id, stayed[0].status)
            # The step named shows the time asked (it never runs: its children carry it).
            named = [step] if parent and await _move(tx, step, data.run_at) else []
            await event_log.append_events(
                tx.conn,
                [
                    event_log.NewEvent(
                        task_id=data.task_id,
                        step_id=s.step_id,
                        kind="reschedule",
                        attempt=s.attempt,
                        data={"run_at": rfc3339(data.run_at), "by": data.by},
                        created_at=tx.now,
                    )
                    for s in [*named, *moved]
                ],
            )
            await tx.audit(
                actor=data.by,
                tenant=data.tenant,
                action="step.reschedule",
                target=f"task:{data.task_id}/step:{data.step_id}",
                data={
                    "run_at": rfc3339(data.run_at),
                    "moved": [s.step_id for s in moved],
                    "not_moved": [n.step_id for n in stayed],
                },
            )
            # Pollers learn the new next due time.
            tx.wake(connectors=sorted({s.connector for s in moved}))
            return Rescheduled(
                view=await read_view(tx.conn, data.task_id),
                moved=[s.step_id for s in moved],
                not_moved=stayed,
            )

    async def report_tokens(
        self, task_id: str, *, input_tokens: int, output_tokens: int, actor: str, tenant: str
    ) -> TaskView:
        """Add model tokens the caller spent on a task (any state; tasks are billed after too)."""
        async with self._work.begin() as tx:
            task = await task_store.load_task(tx.conn, task_id)
            if task is None or task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            await task_store.add_token_usage(
                tx.conn, task_id, input_tokens=input_tokens, output_tokens=output_tokens, now=tx.now
            )
            await tx.audit(
                actor=actor,
                tenant=tenant,
                action="task.usage",
                target=f"task:{task_id}",
                data={"input_tokens": input_tokens, "output_tokens": output_tokens},
            )
            return await read_view(tx.conn, task_id)


async def _step_of(tx: TaskWork, task_id: str, step_id: str) -> StepRow:
    """One step of a locked task, with its tool version loaded; StepNotFoundError if none."""
    return _step_in(await tx.steps_of(task_id), step_id)


def _step_in(steps: list[StepRow], step_id: str) -> StepRow:
    found = [s for s in steps if s.step_id == step_id]
    if not found:
        raise StepNotFoundError(step_id)
    return found[0]


def _why_not_movable(step: StepRow, stayed: list[NotMoved]) -> NotMoved | None:
    """Why a step keeps its time: it started (only a blocked step, or one queued for its first
    attempt, has not), or it follows a sibling that stays (`stayed`, in plan order)."""
    queued = step.status is StepStatus.READY and step.attempt == 1
    if step.status is not StepStatus.BLOCKED and not queued:
        return NotMoved(step_id=step.step_id, status=step.status.value)
    after = [n.step_id for n in stayed if n.step_id in step.depends_on]
    if after:
        return NotMoved(step_id=step.step_id, status=step.status.value, follows=after[0])
    return None


async def _move(tx: TaskWork, step: StepRow, run_at: datetime) -> bool:
    """Give a step that has not started a new time; False when it was leased meanwhile."""
    not_before = run_at if run_at > tx.now else None
    return await store.reschedule_step(
        tx.conn,
        step,
        run_at=run_at,
        not_before=not_before,
        start_by=start_by(step, tx.tool(step), not_before or tx.now),
        now=tx.now,
    )


def deadline_error(deadline: datetime) -> dict[str, Any]:
    """The receipt of a step ended because its task's deadline passed."""
    message = f"the task's deadline ({rfc3339(deadline)}) passed"
    return {"code": ErrorCode.DEADLINE_EXCEEDED.value, "message": message, "retryable": False}
