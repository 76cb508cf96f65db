"""What each executor pool has to do: the reads behind per-pool autoscaling.

services/autoscaling.py uses them; a sweep runs them a few times a minute at most, on both backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus
from agent_reach_controller.storage.schema import UtcDateTime, executor_sessions, steps


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedGroup:
    """Ready steps of one tool, connector and tenant, and when the longest-waiting due one became
    due (None: none is due yet)."""

    tool: str
    connector: str
    tenant: str
    depth: int
    oldest_due: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionPool:
    """A pool as its most recent executor session saw it."""

    pool: str
    scope: dict[str, Any]
    slots: int
    live: bool


async def queued_groups(conn: AsyncConnection, *, now: datetime) -> list[QueuedGroup]:
    """The queue (ready steps, due or not) by tool, connector and tenant, in one grouped read."""
    nb, changed = steps.c.not_before, steps.c.updated_at
    due_at = sa.case((nb > changed, nb), else_=changed)
    is_due = sa.or_(nb.is_(None), nb <= now)
    oldest = sa.type_coerce(sa.func.min(sa.case((is_due, due_at))), UtcDateTime())
    rows = await conn.execute(
        sa.select(steps.c.tool, steps.c.connector, steps.c.tenant, sa.func.count(), oldest)
        .where(steps.c.status == StepStatus.READY)
        .group_by(steps.c.tool, steps.c.connector, steps.c.tenant)
    )
    return [
        QueuedGroup(tool=t, connector=c, tenant=tenant, depth=int(n), oldest_due=when)
        for t, c, tenant, n, when in rows.all()
    ]


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
    live = (
        sa.select(executor_sessions.c.pool)
        .where(executor_sessions.c.ended_at.is_(None))
        .distinct()
        .subquery()
    )
    rows = await conn.execute(
        sa.select(
            executor_sessions.c.pool,
            executor_sessions.c.scope,
            executor_sessions.c.slots,
            live.c.pool.is_not(None),
        )
        .join(
            newest,
            sa.and_(
                newest.c.pool == executor_sessions.c.pool,
                newest.c.at == executor_sessions.c.registered_at,
            ),
        )
        .outerjoin(live, live.c.pool == executor_sessions.c.pool)
    )
    found: dict[str, SessionPool] = {}
    for pool, scope, slots, is_live in rows.all():
        found[pool] = SessionPool(
            pool=pool, scope=scope or {}, slots=int(slots), live=bool(is_live)
        )
    return list(found.values())
