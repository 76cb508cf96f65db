"""Task row locks, always in task id order: what serialises the advancement of a task between
replicas."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.storage import hot
from agent_reach_controller.storage.schema import steps, tasks
from agent_reach_controller.storage.steps import load_steps_by_key
from agent_reach_controller.storage.tasks import load_tasks


async def lock_tasks(conn: AsyncConnection, task_ids: Iterable[str]) -> None:
    """Serialise advancement of these tasks between replicas (row locks, in id order)."""
    ids = sorted(set(task_ids))
    if ids and conn.dialect.name == "postgresql":
        await hot.tuples(conn, hot.LOCK_TASKS, {"ids": ids})
    elif ids:
        await conn.execute(
            sa.select(tasks.c.task_id)
            .where(tasks.c.task_id.in_(ids))
            .order_by(tasks.c.task_id)
            .with_for_update()
        )


async def lock_steps(
    conn: AsyncConnection, keys: Iterable[int]
) -> tuple[dict[str, TaskRow], dict[int, StepRow]]:
    """Lock the tasks these steps belong to (in id order), then read those tasks and the steps.
    One round trip on Postgres."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}, {}
    if conn.dialect.name != "postgresql":
        locked = await _lock_tasks_of_steps(conn, wanted)
        return await load_tasks(conn, locked), await load_steps_by_key(conn, wanted)
    task_rows, step_rows = await hot.locked_reads(conn, wanted)
    return (
        {r["task_id"]: TaskRow.from_mapping(r) for r in task_rows},
        {r["id"]: StepRow.from_mapping(r) for r in step_rows},
    )


async def _lock_tasks_of_steps(conn: AsyncConnection, wanted: list[int]) -> list[str]:
    """Lock the tasks these steps belong to (in id order, like lock_tasks); returns their ids.
    (SQLite: the writer lock makes it a formality; Postgres reads the rows with the lock.)"""
    owners = sa.select(steps.c.task_id).where(steps.c.id.in_(wanted))
    rows = await conn.execute(
        sa.select(tasks.c.task_id)
        .where(tasks.c.task_id.in_(owners))
        .order_by(tasks.c.task_id)
        .with_for_update()
    )
    return [r[0] for r in rows.all()]
