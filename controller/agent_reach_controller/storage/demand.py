"""What each executor pool holds and can run: the reads behind per-pool autoscaling beside the
queue's own (`steps.queued_groups`). Cold path: the queue sweep runs them, on both backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus
from agent_reach_controller.storage.schema import executor_sessions, steps


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPool:
    """A pool as its most recent executor session saw it."""

    pool: str
    scope: dict[str, Any]
    slots: int


async def running_by_pool(conn: AsyncConnection) -> dict[str, int]:
    """Running steps by the pool of the session that holds each lease."""
    rows = await conn.execute(
        sa.select(executor_sessions.c.pool, sa.func.count())
        .select_from(steps.join(executor_sessions, executor_sessions.c.id == steps.c.lease_owner))
        .where(steps.c.status == StepStatus.RUNNING)
        .group_by(executor_sessions.c.pool)
    )
    return {pool: int(n) for pool, n in rows.all()}


async def session_pools(conn: AsyncConnection) -> list[SessionPool]:
    """Each pool's most recent session (live or ended, until ended sessions are pruned): its
    scope and slots, which a pool scaled to zero still needs."""
    newest = (
        sa.select(
            executor_sessions.c.pool,
            sa.func.max(executor_sessions.c.registered_at).label("at"),
        )
        .group_by(executor_sessions.c.pool)
        .subquery()
    )
    rows = await conn.execute(
        sa.select(
            executor_sessions.c.pool, executor_sessions.c.scope, executor_sessions.c.slots
        ).join(
            newest,
            sa.and_(
                newest.c.pool == executor_sessions.c.pool,
                newest.c.at == executor_sessions.c.registered_at,
            ),
        )
    )
    found: dict[str, SessionPool] = {}
    for pool, scope, slots in rows.all():
        found[pool] = SessionPool(pool=pool, scope=scope or {}, slots=int(slots))
    return list(found.values())
