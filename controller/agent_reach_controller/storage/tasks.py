"""SQL of tasks: reads, the guarded status changes (optimistic lock on `version`), deadlines and
cancel requests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import TaskStatus
from agent_reach_controller.domain.records import TaskRow
from agent_reach_controller.storage import hot
from agent_reach_controller.storage.engine import (
    Connection,
    commit_statement,
)
from agent_reach_controller.storage.events import NewEvent, append_events
from agent_reach_controller.storage.schema import tasks

_FINISHED = frozenset({TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED})


def finished_at(status: TaskStatus, now: datetime) -> datetime | None:
    """A task's `finished_at` once it has this status."""
    return now if status in _FINISHED else None


async def load_task(conn: AsyncConnection, task_id: str) -> TaskRow | None:
    row = (await conn.execute(sa.select(tasks).where(tasks.c.task_id == task_id))).mappings()
    first = row.first()
    return TaskRow.from_mapping(first) if first else None


async def add_token_usage(
    conn: AsyncConnection, task_id: str, *, input_tokens: int, output_tokens: int, now: datetime
) -> TaskRow | None:
    """Add reported model tokens to a task (one guarded UPDATE: concurrent reports all count)."""
    row = (
        await conn.execute(
            sa.update(tasks)
            .where(tasks.c.task_id == task_id)
            .values(
                input_tokens=tasks.c.input_tokens + input_tokens,
                output_tokens=tasks.c.output_tokens + output_tokens,
                updated_at=now,
            )
            .returning(*tasks.c)
        )
    ).mappings()
    first = row.first()
    return TaskRow.from_mapping(first) if first else None


# Tasks' statuses at commit, each guarded by the version it was read at; every row must match.
SET_TASK_STATUSES = f"""
UPDATE tasks AS t SET status = v.status, version = t.version + 1, updated_at = v.now,
    finished_at = v.finished_at
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(
    task_id text, version int, status text, now timestamptz, finished_at timestamptz
)
WHERE t.task_id = v.task_id AND t.version = v.version
  AND t.task_id = ANY({hot.keys_of("task_id", "text")})
RETURNING %(expected)s::int AS expected
"""


def set_task_statuses(
    conn: Connection, rows: str, *, expected: int, refusal: type[Exception]
) -> None:
    """Write tasks' statuses at commit (`rows`: a JSON array); unless all `expected` rows match
    their version, nothing of the transaction is written and `refusal()` is raised."""
    commit_statement(conn).expect(
        SET_TASK_STATUSES,
        {"rows": rows, "expected": expected},
        holds="count(*) = coalesce(max(expected), -1)",
        refusal=refusal,
    )


TASKS_BY_ID = f"SELECT {hot.TASK_COLUMNS} FROM tasks WHERE task_id = ANY(%(ids)s::text[])"


async def load_tasks(conn: AsyncConnection, task_ids: Iterable[str]) -> dict[str, TaskRow]:
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    if conn.dialect.name == "postgresql":
        found = await hot.rows(conn, TASKS_BY_ID, {"ids": ids})
        return {r["task_id"]: TaskRow.from_mapping(r) for r in found}
    rows = await conn.execute(sa.select(tasks).where(tasks.c.task_id.in_(ids)))
    return {r["task_id"]: TaskRow.from_mapping(r) for r in rows.mappings()}


async def unfinished_tasks(
    conn: AsyncConnection, tenant: str, principal: str, *, up_to: int
) -> int:
    """A caller's pending or running tasks, counted up to `up_to` (newest first, by index)."""
    mine = (
        sa.select(tasks.c.task_id)
        .where(
            tasks.c.tenant == tenant,
            tasks.c.principal == principal,
            tasks.c.status.in_([TaskStatus.PENDING, TaskStatus.RUNNING]),
        )
        .limit(up_to)
        .subquery()
    )
    return int((await conn.execute(sa.select(sa.func.count()).select_from(mine))).scalar_one())


# A task's status, guarded by the version it was read at (optimistic lock).
SET_TASK_STATUS = """
UPDATE tasks SET status = %(status)s, version = %(version)s + 1, updated_at = %(now)s,
    finished_at = %(finished_at)s
WHERE task_id = %(task_id)s AND version = %(version)s
"""


async def set_task_status(
    conn: AsyncConnection, task: TaskRow, status: TaskStatus, *, now: datetime
) -> bool:
    """Optimistic-locked status change of a task, with its event."""
    finished = finished_at(status, now)
    if conn.dialect.name == "postgresql":
        params = {"task_id": task.task_id, "version": task.version, "status": status}
        params |= {"now": now, "finished_at": finished}
        cur = await hot.run(conn, SET_TASK_STATUS, hot.bound(params, frozenset()))
        changed = cur.rowcount == 1
    else:
        stmt = (
            sa.update(tasks)
            .where(tasks.c.task_id == task.task_id, tasks.c.version == task.version)
            .values(status=status, version=task.version + 1, updated_at=now, finished_at=finished)
        )
        changed = (await conn.execute(stmt)).rowcount == 1
    if not changed:
        return False
    await append_events(conn, [task_status_event(task.task_id, task.status, status, now=now)])
    return True


def task_status_event(
    task_id: str, before: TaskStatus, after: TaskStatus, *, now: datetime
) -> NewEvent:
    return NewEvent(
        task_id=task_id, kind="task_status", from_status=before, to_status=after, created_at=now
    )


# pending -> running for the tasks of freshly leased steps; rows an advance holds are skipped.
MARK_TASKS_RUNNING = """
UPDATE tasks SET status = %(running)s, version = version + 1, updated_at = %(now)s
WHERE task_id IN (
    SELECT task_id FROM tasks WHERE task_id = ANY(%(task_ids)s) AND status = %(pending)s
    FOR UPDATE SKIP LOCKED
)
RETURNING task_id
"""


async def mark_tasks_running(
    conn: AsyncConnection, task_ids: Iterable[str], *, now: datetime
) -> None:
    """`pending` → `running` once a first step is leased, inside the claim's transaction.

    Task rows locked by an advance are skipped, never waited for (the claim holds step locks, and
    locks go task first everywhere else); that advance settles the status itself.
    """
    ids = sorted(set(task_ids))
    if conn.dialect.name == "postgresql":
        params = {"task_ids": ids, "now": now, "pending": TaskStatus.PENDING.value}
        params["running"] = TaskStatus.RUNNING.value
        cur = await hot.run(conn, MARK_TASKS_RUNNING, params)
        running = [task_id for (task_id,) in await cur.fetchall()]
    else:
        pending = (
            sa.select(tasks.c.task_id)
            .where(tasks.c.task_id.in_(ids), tasks.c.status == TaskStatus.PENDING)
            .with_for_update(skip_locked=True)
        )
        rows = await conn.execute(
            sa.update(tasks)
            .where(tasks.c.task_id.in_(pending.scalar_subquery()))
            .values(status=TaskStatus.RUNNING, version=tasks.c.version + 1, updated_at=now)
            .returning(tasks.c.task_id)
        )
        running = [task_id for (task_id,) in rows.all()]
    await tasks_started(conn, running, now=now)


async def tasks_started(conn: AsyncConnection, task_ids: Iterable[str], *, now: datetime) -> None:
    """Record `pending` → `running` of these tasks (their rows already say so)."""
    await append_events(
        conn,
        [
            NewEvent(
                task_id=task_id,
                kind="task_status",
                from_status=TaskStatus.PENDING,
                to_status=TaskStatus.RUNNING,
                created_at=now,
            )
            for task_id in task_ids
        ],
    )


async def overdue_tasks(
    conn: AsyncConnection, *, now: datetime, limit: int
) -> list[tuple[str, datetime]]:
    """Unfinished tasks whose deadline has passed, earliest first: (task_id, deadline)."""
    rows = await conn.execute(
        sa.select(tasks.c.task_id, tasks.c.deadline)
        .where(
            tasks.c.deadline.is_not(None),
            tasks.c.deadline < now,
            tasks.c.status.in_([TaskStatus.PENDING, TaskStatus.RUNNING]),
        )
        .order_by(tasks.c.deadline)
        .limit(limit)
    )
    return [(r[0], r[1]) for r in rows.all()]


async def request_cancel(conn: AsyncConnection, task_id: str, *, now: datetime) -> None:
    await conn.execute(
        sa.update(tasks)
        .where(tasks.c.task_id == task_id)
        .values(cancel_requested=True, updated_at=now)
    )
