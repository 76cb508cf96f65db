"""Reading tasks: one task with its steps, lists, a step, the event log, waiting for the end.

Nothing here changes a task (operator actions and usage reports are in `operator.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from agent_reach.states import TERMINAL_TASK_STATES, StepStatus, TaskStatus
from agent_reach_controller.decide import approvals
from agent_reach_controller.domain.records import EventRow, StepRow, TaskRow
from agent_reach_controller.planning.fanout import parent_of
from agent_reach_controller.services.caps import task_usage
from agent_reach_controller.storage import events as event_log
from agent_reach_controller.storage import listings
from agent_reach_controller.storage import steps as store
from agent_reach_controller.storage import tasks as task_store
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.listings import Awaiting, TaskFilter
from agent_reach_controller.storage.wakeups import Notifier, task_key

# The approvals inbox reads waiting steps in batches of this many, and at most this many for one
# page (steps of tools the caller may not approve are passed over).
APPROVAL_BATCH = 200
APPROVAL_SCAN = 2000


class TaskNotFoundError(LookupError):
    """No task with that id (for this principal)."""


class StepNotFoundError(LookupError):
    """No step with that id in the task."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskError:
    """Why a task failed, at its top: the step that failed first, its code and message."""

    code: str
    message: str
    step_id: str


# A step in one of these ended a task `failed` (`derive_task_status`).
_FAILING = frozenset({StepStatus.FAILED, StepStatus.REJECTED})


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskView:
    task: TaskRow
    steps: list[StepRow]
    usage: dict[str, float] | None = None  # what the task used of each capped class
    tool_calls: int = 0  # attempts handed to executors so far

    @property
    def error(self) -> TaskError | None:
        """Why the task failed; None unless it did.

        The first failing step in plan order (a failed dependency skips its dependants, so
        that is the cause, not a consequence). A fan-out or verified step fails because its
        children did: then its first failing child is named, with the child's own code and
        message (`tell[2]`, "connection refused"), which says what to fix; the step's own
        receipt still counts how many targets succeeded. A step failed on its own (a verified
        write whose check did not hold) is named itself.
        """
        if self.task.status != TaskStatus.FAILED:
            return None
        failing = sorted((s for s in self.steps if s.status in _FAILING), key=_plan_order)
        if not failing:
            return None
        first = failing[0]
        children = [s for s in failing if parent_of(s.step_id) == first.step_id]
        culprit = children[0] if children else first
        error = culprit.error or {}
        return TaskError(
            code=str(error.get("code") or culprit.status.value),
            message=str(error.get("message") or f"step {culprit.step_id!r} {culprit.status}"),
            step_id=culprit.step_id,
        )


def _plan_order(step: StepRow) -> tuple[int, int]:
    """Children come after every step of the plan (`fanout.split`); a failed child ranks
    after the step it belongs to, which fails with it."""
    return (1 if parent_of(step.step_id) is not None else 0, step.position)


async def read_view(conn: Connection, task_id: str) -> TaskView:
    """The task, its steps, what it used of its caps and how many tool calls it made."""
    task = await task_store.load_task(conn, task_id)
    if task is None:
        raise TaskNotFoundError(task_id)
    steps = await store.load_steps(conn, [task_id])
    return TaskView(
        task=task,
        steps=steps,
        usage=await task_usage(conn, task_id),
        tool_calls=await event_log.count_tool_calls(conn, task_id),
    )


class TaskQueries:
    """What callers may read of tasks; each answer from one transaction."""

    def __init__(self, *, db: Database, notifier: Notifier) -> None:
        self._db = db
        self._notifier = notifier
        self._closing = False

    async def close(self) -> None:
        """The controller is stopping: every `wait` answers now, with the task as it stands,
        instead of holding the HTTP server's graceful shutdown open until it is cut."""
        self._closing = True
        await self._notifier.nudge()

    async def get(self, task_id: str, *, tenant: str | None = None) -> TaskView:
        """The task and its steps; with `tenant`, TaskNotFoundError unless it is that tenant's
        (the same answer as for a task that does not exist)."""
        async with self._db.transaction() as conn:
            view = await read_view(conn, task_id)
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
        return await self.find_tasks(
            TaskFilter(tenant=tenant, status=status, before=before, limit=limit)
        )

    async def find_tasks(self, where: TaskFilter) -> list[TaskRow]:
        """A page of a tenant's tasks, newest first, by any of TaskFilter's filters."""
        async with self._db.transaction() as conn:
            return await listings.list_tasks(conn, where)

    async def approvals(
        self,
        *,
        tenant: str,
        may_approve: Callable[[str], bool],
        after: tuple[datetime, int] | None,
        limit: int,
    ) -> tuple[list[Awaiting], tuple[datetime, int] | None]:
        """Up to `limit` of a tenant's steps waiting for a decision on a tool `may_approve`
        allows, soonest deadline first, and where the next page starts (None: nothing after).

        Steps of other tools are passed over, reading at most APPROVAL_SCAN of them: a page
        may then be short, and the next one starts after the last step read.
        """
        found: list[Awaiting] = []
        read = 0
        async with self._db.transaction() as conn:
            while read < APPROVAL_SCAN:
                batch = await listings.awaiting_approval(
                    conn, tenant=tenant, after=after, limit=APPROVAL_BATCH
                )
                for waiting in batch:
                    read += 1
                    after = (waiting.decide_by, waiting.step.id)
                    if may_approve(waiting.step.tool):
                        found.append(waiting)
                        if len(found) == limit:
                            return found, after
                if len(batch) < APPROVAL_BATCH:
                    return found, None
        return found, after

    async def step(self, task_id: str, step_id: str, *, tenant: str) -> StepRow:
        """One step of a tenant's task; TaskNotFoundError or StepNotFoundError otherwise."""
        async with self._db.transaction() as conn:
            task = await task_store.load_task(conn, task_id)
            if task is None or task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            found = [s for s in await store.load_steps(conn, [task_id]) if s.step_id == step_id]
        if not found:
            raise StepNotFoundError(step_id)
        return found[0]

    async def decided_step(self, task_id: str, step_id: str, *, tenant: str) -> StepRow:
        """The step a decision asked of `step_id` is for (`approvals.decided_step`: the step,
        or the one child of a fan-out or verified step waiting for a decision), so the caller's
        right to decide is checked on its tool; SeveralAwaitingError when several wait."""
        async with self._db.transaction() as conn:
            task = await task_store.load_task(conn, task_id)
            if task is None or task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            steps = await store.load_steps(conn, [task_id])
        found = [s for s in steps if s.step_id == step_id]
        if not found:
            raise StepNotFoundError(step_id)
        return approvals.decided_step(found[0], steps)

    async def in_flight(self, tenant: str, principal: str, *, up_to: int) -> int:
        """How many of this caller's tasks are unfinished (counting stops at `up_to`)."""
        async with self._db.transaction() as conn:
            return await task_store.unfinished_tasks(conn, tenant, principal, up_to=up_to)

    async def check_tenant(self, task_id: str, tenant: str) -> str:
        """The task's trace id; TaskNotFoundError unless the task exists and belongs to `tenant`
        (the same answer)."""
        async with self._db.transaction() as conn:
            task = await task_store.load_task(conn, task_id)
        if task is None or task.tenant != tenant:
            raise TaskNotFoundError(task_id)
        return task.trace_id

    async def history(
        self, task_id: str, *, tenant: str, up_to: int
    ) -> tuple[TaskView, list[EventRow]]:
        """The task of `tenant` and its first `up_to` events, read together (TaskNotFoundError
        for another tenant's task, as for a missing one)."""
        async with self._db.transaction() as conn:
            view = await read_view(conn, task_id)
            if view.task.tenant != tenant:
                raise TaskNotFoundError(task_id)
            return view, await event_log.load_events(conn, task_id, after=0, limit=up_to)

    async def events(self, task_id: str, *, after: int = 0, limit: int = 1000) -> list[EventRow]:
        async with self._db.transaction() as conn:
            if await task_store.load_task(conn, task_id) is None:
                raise TaskNotFoundError(task_id)
            return await event_log.load_events(conn, task_id, after=after, limit=limit)

    async def wait(self, task_id: str, *, within: float) -> TaskView:
        """The task once it is terminal, or as it stands after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        keys = [task_key(task_id)]
        with self._notifier.watching(keys):
            while True:
                since = self._notifier.snapshot(keys)
                async with self._db.transaction() as conn:  # the status only, until the end
                    task = await task_store.load_task(conn, task_id)
                if task is None:
                    raise TaskNotFoundError(task_id)
                remaining = deadline - loop.time()
                if task.status in TERMINAL_TASK_STATES or remaining <= 0 or self._closing:
                    return await self.get(task_id)
                # The cap is a safety net for a missed wake-up, not the normal path.
                await self._notifier.wait(
                    keys, since, within=min(remaining, 1.0), until=lambda: self._closing
                )
