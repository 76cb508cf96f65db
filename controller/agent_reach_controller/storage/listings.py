"""SQL of the read-only lists: tasks by filter, steps awaiting a decision, a tool's running steps.

Each list is a keyset walk on an index, so a page costs the same at a million rows as at a
hundred (the console's pages, and an EXPLAIN test, rely on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from agent_reach.ids import task_id_floor
from agent_reach.states import StepStatus
from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.storage.schema import steps, tasks

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFilter:
    """Which of a tenant's tasks a page lists, newest first; every filter is optional.

    `since` and `until` bound the creation time (`since` included, `until` not) to the
    millisecond, through the time prefix of the task ids (UUIDv7). `before` is the last task
    id of the previous page.
    """

    tenant: str
    status: str | None = None
    principal: str | None = None
    tool: str | None = None  # tasks with a step of this tool
    since: datetime | None = None
    until: datetime | None = None
    before: str | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Awaiting:
    """A step waiting for a person's decision, and who submitted its task."""

    step: StepRow
    asked_by: str
    decide_by: datetime  # the step's, never None while it waits


def _status_is(status: StepStatus) -> sa.ColumnElement[bool]:
    # A literal, not a parameter: a partial index on the status is then usable by every plan,
    # a generic plan of a prepared statement included.
    return steps.c.status == sa.literal_column(f"'{status.value}'")


def _ms(when: datetime) -> int:
    return (when - _EPOCH) // timedelta(milliseconds=1)


def task_list_statement(where: TaskFilter) -> sa.Select[Any]:
    """The statement `list_tasks` runs: an index walk newest first, from `before` down.

    Status and principal each have their tenant's index (tenant, column, task_id); a tool is a
    semi-join on (tenant, tool, task_id) of steps, walked beside the tasks or first when the
    tool is rare. The time bounds are task id bounds, so they narrow whichever walk it is. (A
    combination matching fewer tasks than a page, Postgres may gather by index and sort.)
    """
    stmt = sa.select(tasks).where(tasks.c.tenant == where.tenant)
    if where.status is not None:
        stmt = stmt.where(tasks.c.status == where.status)
    if where.principal is not None:
        stmt = stmt.where(tasks.c.principal == where.principal)
    if where.since is not None:
        stmt = stmt.where(tasks.c.task_id >= task_id_floor(_ms(where.since)))
    if where.until is not None:
        stmt = stmt.where(tasks.c.task_id < task_id_floor(_ms(where.until)))
    if where.before is not None:
        stmt = stmt.where(tasks.c.task_id < where.before)
    if where.tool is not None:
        calls = sa.exists().where(
            steps.c.tenant == where.tenant,
            steps.c.tool == where.tool,
            steps.c.task_id == tasks.c.task_id,
        )
        stmt = stmt.where(calls)
    return stmt.order_by(tasks.c.task_id.desc()).limit(where.limit)


async def list_tasks(conn: Connection, where: TaskFilter) -> list[TaskRow]:
    """A page of a tenant's tasks, newest first (see TaskFilter)."""
    rows = await conn.execute(task_list_statement(where))
    return [TaskRow.from_mapping(r) for r in rows.mappings()]


async def awaiting_approval(
    conn: Connection, *, tenant: str, after: tuple[datetime, int] | None, limit: int
) -> list[Awaiting]:
    """A tenant's steps waiting for a decision, soonest `decide_by` first, then by key;
    `after` is the (decide_by, key) of the last one of the previous page.

    Walks the approval sweep's partial index (only waiting rows). Every waiting step has a
    `decide_by` (`decide.approvals.request_values`).
    """
    stmt = (
        sa.select(steps, tasks.c.principal.label("asked_by"))
        .join(tasks, tasks.c.task_id == steps.c.task_id)
        .where(
            _status_is(StepStatus.AWAITING_APPROVAL),
            steps.c.decide_by.is_not(None),
            steps.c.tenant == tenant,
        )
        .order_by(steps.c.decide_by, steps.c.id)
        .limit(limit)
    )
    if after is not None:
        decide_by, key = after
        stmt = stmt.where(
            sa.or_(
                steps.c.decide_by > decide_by,
                sa.and_(steps.c.decide_by == decide_by, steps.c.id > key),
            )
        )
    rows = await conn.execute(stmt)
    return [
        Awaiting(step=StepRow.from_mapping(r), asked_by=r["asked_by"], decide_by=r["decide_by"])
        for r in rows.mappings()
    ]


async def running_steps(conn: Connection, tool: str) -> int:
    """How many steps of a tool are running now, every tenant's (the lease reaper's partial
    index holds only running rows)."""
    counted = await conn.execute(
        sa.select(sa.func.count())
        .select_from(steps)
        .where(_status_is(StepStatus.RUNNING), steps.c.tool == tool)
    )
    return int(counted.scalar_one())
