"""Deleting what is past its retention: finished tasks with their steps, events, cap charges and
idempotency keys, ended agent runs with their conversations, and webhook deliveries that are
done. Small batches, each its own transaction;
rows another transaction holds are skipped (Postgres), so the hot path never waits on it. The
audit log is kept whole: its triggers refuse deletes."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.storage.schema import (
    cap_charges,
    events,
    idempotency_keys,
    run_messages,
    runs,
    steps,
    tasks,
    webhook_outbox,
)


async def prune_finished_tasks(
    conn: AsyncConnection, *, before: datetime, limit: int
) -> dict[str, int]:
    """Delete up to `limit` tasks that finished before `before`, oldest first, and everything
    kept for them; returns the rows deleted per table (empty when there was nothing to do)."""
    rows = await conn.execute(
        sa.select(tasks.c.task_id)
        .where(tasks.c.finished_at.is_not(None), tasks.c.finished_at < before)
        .order_by(tasks.c.finished_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = [task_id for (task_id,) in rows.all()]
    if not ids:
        return {}
    deleted = {}
    for table in (cap_charges, events, idempotency_keys, steps, tasks):
        result = await conn.execute(sa.delete(table).where(table.c.task_id.in_(ids)))
        deleted[table.name] = result.rowcount or 0
    return deleted


async def prune_finished_runs(
    conn: AsyncConnection, *, before: datetime, limit: int
) -> dict[str, int]:
    """Delete up to `limit` agent runs that ended before `before`, with their conversations (a
    run continued since has no `finished_at`, and is kept whole)."""
    rows = await conn.execute(
        sa.select(runs.c.run_id)
        .where(runs.c.finished_at.is_not(None), runs.c.finished_at < before)
        .order_by(runs.c.finished_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = [run_id for (run_id,) in rows.all()]
    if not ids:
        return {}
    deleted = {}
    for table in (run_messages, runs):
        result = await conn.execute(sa.delete(table).where(table.c.run_id.in_(ids)))
        deleted[table.name] = result.rowcount or 0
    # The Idempotency-Keys that started them (their `task_id` is the run's).
    keys = await conn.execute(
        sa.delete(idempotency_keys).where(idempotency_keys.c.task_id.in_(ids))
    )
    deleted[idempotency_keys.name] = keys.rowcount or 0
    return deleted


async def prune_webhook_deliveries(conn: AsyncConnection, *, before: datetime, limit: int) -> int:
    """Delete up to `limit` webhook deliveries that succeeded or were given up before `before`."""
    done = (
        sa.select(webhook_outbox.c.id)
        .where(
            sa.or_(webhook_outbox.c.delivered_at < before, webhook_outbox.c.given_up_at < before)
        )
        .limit(limit)
        .scalar_subquery()
    )
    result = await conn.execute(sa.delete(webhook_outbox).where(webhook_outbox.c.id.in_(done)))
    return result.rowcount or 0
