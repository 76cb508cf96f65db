"""Task use cases: submit, read, list, cancel, wait, and advancing a task after changes."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach.ids import new_task_id, new_trace_id, step_idempotency_key
from agent_reach.states import (
    TERMINAL_STEP_STATES,
    TERMINAL_TASK_STATES,
    StepStatus,
    TaskStatus,
    Transition,
    derive_task_status,
    target,
)
from agent_reach_controller import audit
from agent_reach_controller.decide import approvals
from agent_reach_controller.decide.advance import AdvanceInput, budget_for, decide_unblocks
from agent_reach_controller.decide.outcomes import Budget, decide_resolution, terminal_values
from agent_reach_controller.planning.plan import Plan, validate_resolved_args
from agent_reach_controller.services import webhooks
from agent_reach_controller.services.caps import task_usage
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.webhooks import ApprovalWebhook
from agent_reach_controller.storage import catalog
from agent_reach_controller.storage import steps as store
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.records import EventRow, StepChange, StepRow, TaskRow
from agent_reach_controller.storage.wakeups import Notifier, Wake, task_key


class TaskNotFoundError(LookupError):
    """No task with that id (for this principal)."""


class StepNotFoundError(LookupError):
    """No step with that id in the task."""


class StepNotResolvableError(Exception):
    """Only a step in `outcome_unknown` can be resolved by an operator."""

    def __init__(self, step_id: str, status: str) -> None:
        super().__init__(f"step {step_id!r} is {status}; only outcome_unknown steps are resolved")
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
    """A person's decision on a dangerous step."""

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


class IdempotencyConflictError(Exception):
    """The Idempotency-Key was already used with a different request body."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"Idempotency-Key already used for task {task_id} with a different body")
        self.task_id = task_id


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitInput:
    plan: Plan
    request: dict[str, Any]
    principal: str = "anonymous"
    tenant: str = "default"
    key_id: str | None = None  # the API key that submitted it, checked again at dispatch
    idempotency_key: str | None = None
    trace_id: str | None = None
    parent_span_id: str | None = None
    task_id: str | None = None  # chosen by the caller (the API names its spans after it)
    # The catalogue revision the plan was validated against: if another replica changed the
    # catalogue since, the submit stores nothing and raises CatalogChangedError.
    catalog_revision: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskView:
    task: TaskRow
    steps: list[StepRow]
    usage: dict[str, float] | None = None  # what the task used of each capped class
    tool_calls: int = 0  # attempts handed to executors so far


@dataclass(frozen=True, slots=True, kw_only=True)
class Advanced:
    """What an advance pass changed, for wake-ups and answers."""

    ready_connectors: set[str]
    finished_tasks: set[str]
    task_status: dict[str, TaskStatus]


@dataclass(frozen=True, slots=True, kw_only=True)
class Submitted:
    """The answer to a submit: which task, and whether this call created it."""

    task_id: str
    trace_id: str
    status: TaskStatus
    created: bool


def request_hash(body: Any) -> str:
    """A stable fingerprint of a request body (key order and spacing do not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# How many times a submit retries when the first holder of its Idempotency-Key vanishes between
# the conflict and the look-up (only if the key's record is deleted meanwhile).
_KEY_RACES = 3


class TaskService:
    """Everything that creates tasks or moves them forward outside of executor reports."""

    def __init__(
        self,
        *,
        db: Database,
        registry: ToolRegistry,
        notifier: Notifier,
        approval_ttl: timedelta = timedelta(hours=1),
        announcer: ApprovalWebhook | None = None,
    ) -> None:
        self._db = db
        self._registry = registry
        self._notifier = notifier
        self._approval_ttl = approval_ttl
        # Where approval requests are announced (an outbox row per request), if anywhere.
        self._announcer = announcer

    async def submit(self, data: SubmitInput) -> Submitted:
        """Persist a validated plan and make its first steps ready, in one transaction.

        With an Idempotency-Key another submit already holds, nothing is stored and the task
        of that first submit is answered (or IdempotencyConflictError for another body).
        """
        for _ in range(_KEY_RACES):
            try:
                return await self._create(data)
            except store.KeyTakenError:
                pass
            replayed = await self._replay(data)
            if replayed is not None:
                return replayed
        raise RuntimeError("an Idempotency-Key kept appearing and vanishing")  # pragma: no cover

    async def _replay(self, data: SubmitInput) -> Submitted | None:
        """The first submit's task for a key already used (None if that record is gone)."""
        assert data.idempotency_key is not None
        async with self._db.transaction() as conn:
            stored = await store.load_idempotency_key(conn, data.principal, data.idempotency_key)
            if stored is None:
                return None
            stored_hash, stored_task = stored
            if stored_hash != request_hash(data.request):
                raise IdempotencyConflictError(stored_task)
            existing = await self._view(conn, stored_task)
        return Submitted(
            task_id=stored_task,
            trace_id=existing.task.trace_id,
            status=existing.task.status,
            created=False,
        )

    async def _create(self, data: SubmitInput) -> Submitted:
        now = datetime.now(UTC)
        task_id = data.task_id or new_task_id()
        async with self._db.transaction() as conn:
            if data.idempotency_key is not None:
                await store.claim_idempotency_key(
                    conn,
                    {
                        "principal": data.principal,
                        "key": data.idempotency_key,
                        "request_hash": request_hash(data.request),
                        "task_id": task_id,
                        "created_at": now,
                    },
                )
            if data.catalog_revision is not None:
                await catalog.expect_revision(conn, data.catalog_revision)
            trace_id = data.trace_id or new_trace_id()
            new = store.NewTask(
                _task_row(data, task_id=task_id, trace_id=trace_id, now=now),
                _step_rows(data, task_id, trace_id, now, self._registry),
            )
            await store.append_events(
                conn,
                [
                    store.NewEvent(
                        task_id=task_id,
                        kind="task_created",
                        to_status=TaskStatus.PENDING,
                        data={
                            "goal": data.plan.goal,
                            "source": data.plan.source,
                            "steps": len(data.plan.steps),
                            "principal": data.principal,
                            "tenant": data.tenant,
                        },
                        created_at=now,
                    )
                ],
            )
            await audit.record(
                conn,
                actor=data.principal,
                tenant=data.tenant,
                action="task.submit",
                target=f"task:{task_id}",
                data={"steps": len(data.plan.steps), "source": data.plan.source},
                now=now,
            )
            # A task nobody else can see yet needs no lock: its first advance is decided on the
            # rows in memory, which are then inserted once, as decided.
            advanced = await self._advance_loaded(
                conn, {task_id: new.task_row()}, {task_id: new.step_rows()}, now=now, writes=new
            )
            await new.write(conn)
            wake = await self._notifier.publish(
                conn, connectors=advanced.ready_connectors, tasks=advanced.finished_tasks
            )
        await self._notifier.after_commit(wake)
        return Submitted(
            task_id=task_id,
            trace_id=trace_id,
            status=advanced.task_status.get(task_id, TaskStatus.PENDING),
            created=True,
        )

    async def advance(
        self,
        conn: Connection,
        task_ids: Iterable[str],
        *,
        now: datetime,
        locked: bool = False,
        tasks: dict[str, TaskRow] | None = None,
    ) -> Advanced:
        """Unblock, skip or fail what the current step states allow; settle task statuses.

        Takes the tasks' row locks first unless the caller holds them (`locked`, or `tasks`
        given: rows the caller read under those locks).
        """
        ids = sorted(set(task_ids))
        if tasks is None and not locked:
            await store.lock_tasks(conn, ids)
        # Only blocked steps can move, and only their dependencies' outputs matter; a task's
        # other steps count only through their statuses. (A budget needs every step's attempts.)
        loaded, rows, counts = await store.load_for_advance(conn, ids, with_tasks=tasks is None)
        tasks = loaded if tasks is None else tasks
        budgeted = [t for t in ids if t in tasks and tasks[t].max_attempts is not None]
        if budgeted:
            rows = [r for r in rows if r.task_id not in budgeted]
            rows += await store.load_steps(conn, budgeted)
        by_task: dict[str, list[StepRow]] = defaultdict(list)
        for step in rows:
            by_task[step.task_id].append(step)
        return await self._advance_loaded(conn, tasks, by_task, now=now, counts=counts)

    async def _advance_loaded(
        self,
        conn: Connection,
        tasks: dict[str, TaskRow],
        by_task: dict[str, list[StepRow]],
        *,
        now: datetime,
        counts: dict[str, Counter[StepStatus]] | None = None,
        writes: store.StepWrites | None = None,
    ) -> Advanced:
        """Apply what `decide_unblocks` allows and settle each task's status.

        `by_task` must hold every blocked step and the steps they depend on; `counts` gives the
        tasks' step statuses when `by_task` does not hold every step. The transitions go to the
        stored rows unless `writes` takes them (a task being submitted).
        """
        writes = writes or store.Stored(conn)
        ids = sorted(tasks)
        await self._registry.ensure(
            ((s.tool, s.tool_version) for steps in by_task.values() for s in steps), conn=conn
        )
        result = Advanced(ready_connectors=set(), finished_tasks=set(), task_status={})
        changes: list[StepChange] = []
        for task_id in ids:
            if task_id in tasks:
                changes += decide_unblocks(
                    AdvanceInput(
                        steps=by_task[task_id],
                        context=tasks[task_id].context,
                        tool_of=self._registry.get,
                        now=now,
                        budget=budget_for(tasks[task_id].max_attempts, by_task[task_id]),
                    )
                )
        moved = await writes.change_steps(changes, now=now)
        after = {c.step.id: target(c.transition) for c in changes if c.step.id in moved}
        asks = [
            StepChange(
                step=replace(c.step, status=StepStatus.READY, **c.values),
                transition=Transition.REQUIRE_APPROVAL,
                values=approvals.request_values(
                    c.step, c.values["resolved_args"], now=now, ttl=self._approval_ttl
                ),
            )
            for c in changes
            if c.transition is Transition.UNBLOCK
            and c.step.id in moved
            and self._registry.get(c.step.tool, c.step.tool_version).risk == "dangerous"
        ]
        # Dangerous steps go on to wait for a person; they are never offered to an executor.
        asked = await writes.change_steps(asks, now=now)
        for step_id in asked:
            after[step_id] = StepStatus.AWAITING_APPROVAL
        if self._announcer is not None and asked:
            await self._announcer.enqueue(
                conn,
                [
                    (webhooks.approval_request(a, tasks[a.step.task_id]), a.values["decide_by"])
                    for a in asks
                    if a.step.id in asked
                ],
            )
        result.ready_connectors.update(
            c.step.connector for c in changes if after.get(c.step.id) is StepStatus.READY
        )
        for task_id in ids:
            if task_id not in tasks:
                continue
            if counts is None:
                statuses = [after.get(s.id, s.status) for s in by_task[task_id]]
            else:
                tally = Counter(counts.get(task_id, {}))
                for c in changes:
                    if c.step.task_id == task_id and c.step.id in after:
                        tally[c.step.status] -= 1
                        tally[after[c.step.id]] += 1
                statuses = list(tally.elements())
            await self._settle(writes, tasks[task_id], statuses, now=now, result=result)
        return result

    async def _settle(
        self,
        writes: store.StepWrites,
        task: TaskRow,
        statuses: list[StepStatus],
        *,
        now: datetime,
        result: Advanced,
    ) -> None:
        new = derive_task_status(statuses, cancelled=task.cancel_requested)
        result.task_status[task.task_id] = task.status
        if task.status in TERMINAL_TASK_STATES or new == task.status:
            return
        if new == TaskStatus.PENDING and task.status == TaskStatus.RUNNING:
            return  # a retry moved every step back to ready: the task is still running
        result.task_status[task.task_id] = new
        await writes.set_task_status(task, new, now=now)
        if new in TERMINAL_TASK_STATES:
            result.finished_tasks.add(task.task_id)

    async def get(self, task_id: str, *, tenant: str | None = None) -> TaskView:
        """The task and its steps; with `tenant`, TaskNotFoundError unless it is that tenant's
        (the same answer as for a task that does not exist)."""
        async with self._db.transaction() as conn:
            view = await self._view(conn, task_id)
        if tenant is not None and view.task.tenant != tenant:
            raise TaskNotFoundError(task_id)
        return view

    async def list_tasks(
        self,
        *,
        tenant: str = "default",
        status: str | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> list[TaskRow]:
        async with self._db.transaction() as conn:
            return await store.list_tasks(
                conn, tenant=tenant, status=status, before=before, limit=limit
            )

    async def step(self, task_id: str, step_id: str, *, tenant: str) -> StepRow:
        """One step of a tenant's task; TaskNotFoundError or StepNotFoundError otherwise."""
        async with self._db.transaction() as conn:
            task = await store.load_task(conn, task_id)
            if task is None or task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            found = [s for s in await store.load_steps(conn, [task_id]) if s.step_id == step_id]
        if not found:
            raise StepNotFoundError(step_id)
        return found[0]

    async def in_flight(self, tenant: str, principal: str, *, up_to: int) -> int:
        """How many of this caller's tasks are unfinished (counting stops at `up_to`)."""
        async with self._db.transaction() as conn:
            return await store.unfinished_tasks(conn, tenant, principal, up_to=up_to)

    async def check_tenant(self, task_id: str, tenant: str) -> None:
        """TaskNotFoundError unless the task exists and belongs to `tenant` (the same answer)."""
        async with self._db.transaction() as conn:
            task = await store.load_task(conn, task_id)
        if task is None or task.tenant != tenant:
            raise TaskNotFoundError(task_id)

    async def report_tokens(
        self, task_id: str, *, input_tokens: int, output_tokens: int, actor: str, tenant: str
    ) -> TaskView:
        """Add model tokens the caller spent on a task (any state; tasks are billed after too)."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            task = await store.load_task(conn, task_id)
            if task is None or task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            await store.add_token_usage(
                conn, task_id, input_tokens=input_tokens, output_tokens=output_tokens, now=now
            )
            await audit.record(
                conn,
                actor=actor,
                tenant=tenant,
                action="task.usage",
                target=f"task:{task_id}",
                data={"input_tokens": input_tokens, "output_tokens": output_tokens},
                now=now,
            )
            return await self._view(conn, task_id)

    async def history(
        self, task_id: str, *, tenant: str, up_to: int
    ) -> tuple[TaskView, list[EventRow]]:
        """The task of `tenant` and its first `up_to` events, read together (TaskNotFoundError
        for another tenant's task, as for a missing one)."""
        async with self._db.transaction() as conn:
            view = await self._view(conn, task_id)
            if view.task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            return view, await store.load_events(conn, task_id, after=0, limit=up_to)

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[EventRow]:
        async with self._db.transaction() as conn:
            if await store.load_task(conn, task_id) is None:
                raise TaskNotFoundError(task_id)
            return await store.load_events(conn, task_id, after=after, limit=limit)

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
        return await self._end(task_id, error=error, by=by)

    async def expire_deadlines(self, *, limit: int = 100) -> int:
        """End tasks whose deadline has passed, every unfinished step with a receipt saying so.

        Any replica may run this: each task is ended under its row lock, once.
        """
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            overdue = await store.overdue_tasks(conn, now=now, limit=limit)
        for task_id, deadline in overdue:
            message = f"the task's deadline ({deadline.isoformat(timespec='seconds')}) passed"
            error = {
                "code": ErrorCode.DEADLINE_EXCEEDED.value,
                "message": message,
                "retryable": False,
            }
            await self._end(task_id, error=error)
        return len(overdue)

    async def _end(
        self, task_id: str, *, error: dict[str, Any], by: tuple[str, str] | None = None
    ) -> TaskView:
        now = datetime.now(UTC)
        wake = Wake()
        async with self._db.transaction() as conn:
            await store.lock_tasks(conn, [task_id])
            task = await store.load_task(conn, task_id)
            if task is None:
                raise TaskNotFoundError(task_id)
            if by is not None:
                await audit.record(
                    conn,
                    actor=by[0],
                    tenant=by[1],
                    action="task.cancel",
                    target=f"task:{task_id}",
                    data={"status": task.status.value},
                    now=now,
                )
            if task.status not in TERMINAL_TASK_STATES:
                await store.request_cancel(conn, task_id, now=now)
                steps = await store.load_steps(conn, [task_id])
                await self._registry.ensure([(s.tool, s.tool_version) for s in steps], conn=conn)
                changes = [
                    StepChange(
                        step=step,
                        transition=Transition.CANCEL,
                        values=terminal_values(
                            step,
                            tool=self._registry.get(step.tool, step.tool_version),
                            transition=Transition.CANCEL,
                            now=now,
                            error=error,
                        ),
                    )
                    for step in steps
                    if step.status not in TERMINAL_STEP_STATES
                ]
                await store.change_steps(conn, changes, now=now)
                advanced = await self.advance(conn, [task_id], now=now, locked=True)
                wake = await self._notifier.publish(conn, tasks=advanced.finished_tasks)
            view = await self._view(conn, task_id)
        await self._notifier.after_commit(wake)
        return view

    async def resolve(self, data: ResolveInput) -> TaskView:
        """Apply an operator's verdict; the event log records who decided and why."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            await store.lock_tasks(conn, [data.task_id])
            if await store.load_task(conn, data.task_id) is None:
                raise TaskNotFoundError(data.task_id)
            steps = {s.step_id: s for s in await store.load_steps(conn, [data.task_id])}
            step = steps.get(data.step_id)
            if step is None:
                raise StepNotFoundError(data.step_id)
            if step.status is not StepStatus.OUTCOME_UNKNOWN:
                raise StepNotResolvableError(step.step_id, step.status.value)
            await self._registry.ensure([(step.tool, step.tool_version)], conn=conn)
            change = decide_resolution(
                step,
                action=data.action,
                tool=self._registry.get(step.tool, step.tool_version),
                now=now,
                output=data.output,
                reason=data.reason,
            )
            verdict = {"by": data.by, "reason": data.reason, "action": data.action}
            await store.change_steps(conn, [replace(change, event_data=verdict)], now=now)
            await audit.record(
                conn,
                actor=data.by,
                tenant=data.tenant,
                action="step.resolve",
                target=f"task:{data.task_id}/step:{data.step_id}",
                data={"action": data.action, "reason": data.reason[:500]},
                now=now,
            )
            advanced = await self.advance(conn, [data.task_id], now=now, locked=True)
            wake = await self._notifier.publish(
                conn,
                connectors=advanced.ready_connectors
                | ({step.connector} if data.action == "retry" else set()),
                tasks=advanced.finished_tasks,
            )
            view = await self._view(conn, data.task_id)
        await self._notifier.after_commit(wake)
        return view

    async def decide(self, data: ApprovalInput) -> TaskView:
        """Approve (perhaps with edited arguments) or reject a step waiting for approval."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            await store.lock_tasks(conn, [data.task_id])
            task = await store.load_task(conn, data.task_id)
            if task is None or task.tenant != data.tenant:
                raise TaskNotFoundError(data.task_id)
            steps = {s.step_id: s for s in await store.load_steps(conn, [data.task_id])}
            step = steps.get(data.step_id)
            if step is None:
                raise StepNotFoundError(data.step_id)
            if step.status is not StepStatus.AWAITING_APPROVAL:
                raise NotAwaitingApprovalError(step.step_id, step.status.value)
            if data.separation_of_duties and task.principal == data.by:
                raise SelfApprovalError(
                    f"{data.by} submitted this task and may not also approve its steps"
                )
            if step.decide_by is not None and step.decide_by < now:
                raise ApprovalExpiredError(f"the approval of step {step.step_id!r} has expired")
            await self._registry.ensure([(step.tool, step.tool_version)], conn=conn)
            tool = self._registry.get(step.tool, step.tool_version)
            if data.args is not None and (problems := validate_resolved_args(tool, data.args)):
                raise EditedArgumentsError(problems)
            change = approvals.decided(
                step,
                tool,
                approve=data.approve,
                by=data.by,
                reason=data.reason,
                now=now,
                args=data.args,
            )
            await store.change_steps(conn, [change], now=now)
            await audit.record(
                conn,
                actor=data.by,
                tenant=data.tenant,
                action="approval.approve" if data.approve else "approval.reject",
                target=f"task:{data.task_id}/step:{data.step_id}",
                data={"reason": data.reason[:500], "edited": "resolved_args" in change.values},
                now=now,
            )
            advanced = await self.advance(conn, [data.task_id], now=now, locked=True)
            wake = await self._notifier.publish(
                conn,
                connectors=advanced.ready_connectors
                | ({step.connector} if data.approve else set()),
                tasks=advanced.finished_tasks,
            )
            view = await self._view(conn, data.task_id)
        await self._notifier.after_commit(wake)
        return view

    async def wait(self, task_id: str, *, within: float) -> TaskView:
        """The task once it is terminal, or as it stands after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        keys = [task_key(task_id)]
        with self._notifier.watching(keys):
            while True:
                since = self._notifier.snapshot(keys)
                async with self._db.transaction() as conn:  # the status only, until the end
                    task = await store.load_task(conn, task_id)
                if task is None:
                    raise TaskNotFoundError(task_id)
                remaining = deadline - loop.time()
                if task.status in TERMINAL_TASK_STATES or remaining <= 0:
                    return await self.get(task_id)
                # The cap is a safety net for a missed wake-up, not the normal path.
                await self._notifier.wait(keys, since, within=min(remaining, 1.0))

    async def budgets(self, conn: Connection, tasks: dict[str, TaskRow]) -> dict[str, Budget]:
        """What is left of each task's attempt budget (tasks without one are left out)."""
        limited = [t for t in tasks.values() if t.max_attempts is not None]
        if not limited:
            return {}
        by_task: dict[str, list[StepRow]] = defaultdict(list)
        for step in await store.load_steps(conn, (t.task_id for t in limited)):
            by_task[step.task_id].append(step)
        return {t.task_id: budget_for(t.max_attempts, by_task[t.task_id]) for t in limited}

    async def _view(self, conn: Connection, task_id: str) -> TaskView:
        task = await store.load_task(conn, task_id)
        if task is None:
            raise TaskNotFoundError(task_id)
        steps = await store.load_steps(conn, [task_id])
        return TaskView(
            task=task,
            steps=steps,
            usage=await task_usage(conn, task_id),
            tool_calls=await store.count_tool_calls(conn, task_id),
        )


def _task_row(data: SubmitInput, *, task_id: str, trace_id: str, now: datetime) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "trace_id": trace_id,
        "parent_span_id": data.parent_span_id,
        "status": TaskStatus.PENDING,
        "principal": data.principal,
        "tenant": data.tenant,
        "goal": data.plan.goal,
        "source": data.plan.source,
        "request": data.request,
        "context": data.plan.context,
        "cancel_requested": False,
        "version": 1,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
        "deadline": now + timedelta(seconds=data.plan.deadline_s) if data.plan.deadline_s else None,
        "max_attempts": data.plan.max_attempts,
        "caps": data.plan.caps,
    }


def _step_rows(
    data: SubmitInput, task_id: str, trace_id: str, now: datetime, registry: ToolRegistry
) -> list[dict[str, Any]]:
    rows = []
    for step in data.plan.steps:
        tool = registry.get(step.tool, step.tool_version)
        rows.append(
            {
                "task_id": task_id,
                "step_id": step.step_id,
                "position": step.position,
                "trace_id": trace_id,
                "tool": step.tool,
                "tool_version": step.tool_version,
                "connector": tool.connector,
                "args": step.args,
                "depends_on": list(step.depends_on),
                "when_expr": step.when,
                "status": StepStatus.BLOCKED,
                "priority": step.priority,
                "tenant": data.tenant,
                "key_id": data.key_id,
                "attempt": 1,
                "max_attempts": (step.retry or tool.retry).maximum_attempts,
                "retry": step.retry.model_dump(mode="json") if step.retry else None,
                "timeouts": (
                    step.timeouts.model_dump(mode="json", exclude_none=True)
                    if step.timeouts
                    else None
                ),
                "idempotency_key": step_idempotency_key(task_id, step.step_id),
                "created_at": now,
                "updated_at": now,
            }
        )
    return rows
