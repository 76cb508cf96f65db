"""Task row locks, always in task id order: what serialises the advancement of a task between
replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.storage import hot
from agent_reach_controller.storage.engine import (
    Connection,
    before_commit,
    commit_statement,
    nothing_before_commit,
    prepare,
    round_trip,
)
from agent_reach_controller.storage.schema import steps, tasks
from agent_reach_controller.storage.steps import LOCKED_STEPS_BY_KEY, load_steps_by_key
from agent_reach_controller.storage.tasks import load_tasks

# Row locks that serialise advancing these tasks between replicas, in id order.
LOCK_TASKS = (
    "SELECT task_id FROM tasks WHERE task_id = ANY(%(ids)s::text[]) ORDER BY task_id FOR UPDATE"
)


# The tasks of these steps, locked in id order and read whole by the same statement.
LOCK_TASK_ROWS_OF_STEPS = f"""
SELECT {hot.TASK_COLUMNS} FROM tasks
WHERE task_id = ANY(ARRAY(SELECT task_id FROM steps WHERE id = ANY(%(keys)s::bigint[])))
ORDER BY task_id FOR UPDATE
"""


# Tasks still at the version they were known at, and not asked to cancel: locked in id order.
HELD_TASKS = """
SELECT task_id FROM tasks
WHERE task_id = ANY(%(ids)s::text[])
  AND version = (%(versions)s::int[])[array_position(%(ids)s::text[], task_id)]
  AND NOT cancel_requested
ORDER BY task_id FOR UPDATE
"""


def expect_unchanged(
    conn: Connection, known: Iterable[TaskRow], *, refusal: Callable[[], Exception]
) -> None:
    """Lock these tasks with the commit (Postgres), before anything of it writes, and commit
    only if each is still at the version it was `known` at and not asked to cancel; else nothing
    is written and committing raises `refusal()`.

    For a transaction that decides on rows it did not read under the locks (a report on rows
    its replica leased, services/held.py): what changes a task's status bumps its version, and a
    cancel request sets `cancel_requested`; the steps' own changes are guarded by theirs. Any
    round trip of the transaction before its commit raises `refusal()` too: a write it sent
    would take its row locks before the tasks'."""
    rows = sorted((t.task_id, t.version) for t in known)
    params = {"ids": [i for i, _ in rows], "versions": [v for _, v in rows]}

    async def guard(conn: Connection) -> None:
        commit_statement(conn).ahead(
            HELD_TASKS, params, holds="count(*) = cardinality(%(ids)s::text[])", refusal=refusal
        )

    before_commit(conn, guard)
    nothing_before_commit(conn, refusal)


async def locked_reads(
    conn: Connection, keys: Sequence[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(task rows, step rows) of these steps, the tasks locked first, in one round trip; each
    step row also says whether every step of its task is among `keys` (`whole`).

    A pipeline runs its statements in order, so the steps are read once the locks are held:
    what the previous holder committed is visible.
    """
    params = {"keys": list(keys)}
    async with round_trip(conn, pipeline=True) as pg:
        task_rows, step_rows = pg.cursor(row_factory=dict_row), pg.cursor(row_factory=dict_row)
        await task_rows.execute(LOCK_TASK_ROWS_OF_STEPS, params, prepare=prepare(pg))
        await step_rows.execute(LOCKED_STEPS_BY_KEY, params, prepare=prepare(pg))
    return [hot.utc(r) for r in await task_rows.fetchall()], [
        hot.utc(r) for r in await step_rows.fetchall()
    ]


async def lock_tasks(conn: AsyncConnection, task_ids: Iterable[str]) -> None:
    """Serialise advancement of these tasks between replicas (row locks, in id order)."""
    ids = sorted(set(task_ids))
    if ids and conn.dialect.name == "postgresql":
        await hot.tuples(conn, LOCK_TASKS, {"ids": ids})
    elif ids:
        await conn.execute(
            sa.select(tasks.c.task_id)
            .where(tasks.c.task_id.in_(ids))
            .order_by(tasks.c.task_id)
            .with_for_update()
        )


async def lock_steps(
    conn: AsyncConnection, keys: Iterable[int]
) -> tuple[dict[str, TaskRow], dict[int, StepRow], set[str]]:
    """Lock the tasks these steps belong to (in id order), then read those tasks and the steps;
    also returns the tasks all of whose steps are among those read (on Postgres; none on
    SQLite). One round trip on Postgres."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}, {}, set()
    if conn.dialect.name != "postgresql":
        locked = await _lock_tasks_of_steps(conn, wanted)
        return await load_tasks(conn, locked), await load_steps_by_key(conn, wanted), set()
    task_rows, step_rows = await locked_reads(conn, wanted)
    return (
        {r["task_id"]: TaskRow.from_mapping(r) for r in task_rows},
        {r["id"]: StepRow.from_mapping(r) for r in step_rows},
        {r["task_id"] for r in step_rows if r["whole"]},
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
