"""SQL of executor sessions: open, re-key, heartbeat, expire, revoke, prune and list them, and
the running steps their leases hold. The rules (`services/sessions.py`) build sessions from rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from psycopg import AsyncCursor

from agent_reach.states import StepStatus
from agent_reach_controller.storage.engine import (
    Connection,
    before_commit,
    commit_statement,
    queue_statement,
)
from agent_reach_controller.storage.schema import executor_sessions, steps


@dataclass(frozen=True, slots=True, kw_only=True)
class NewSession:
    """The columns a session is opened with (it is live: no `ended_at`, no `end_reason`)."""

    id: str
    secret_hash: str
    lease_key: str
    credential: str
    pool: str
    scope: dict[str, Any]
    executor_id: str
    connectors: list[str]
    slots: int
    version: str
    registered_at: datetime
    last_seen_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRow(NewSession):
    """One row of `executor_sessions`: a session as opened, and how it ended if it did."""

    ended_at: datetime | None
    end_reason: str | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> SessionRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


async def insert_session(conn: Connection, new: NewSession) -> None:
    """Insert a new live session."""
    await conn.execute(
        executor_sessions.insert().values(**{f.name: getattr(new, f.name) for f in fields(new)})
    )


async def rekey_session(conn: Connection, new: NewSession) -> SessionRow | None:
    """Give the live session of `new`'s executor and credential its secret and expiry."""
    found = await conn.execute(
        sa.update(executor_sessions)
        .where(
            executor_sessions.c.executor_id == new.executor_id,
            executor_sessions.c.credential == new.credential,
            executor_sessions.c.ended_at.is_(None),
        )
        .values(
            secret_hash=new.secret_hash,
            last_seen_at=new.last_seen_at,
            expires_at=new.expires_at,
        )
        .returning(*executor_sessions.c)
    )
    kept = found.mappings().first()
    return SessionRow.from_mapping(kept) if kept is not None else None


async def load_session(conn: Connection, session_id: str) -> SessionRow | None:
    """One session by id, live or ended."""
    query = sa.select(executor_sessions).where(executor_sessions.c.id == session_id)
    row = (await conn.execute(query)).mappings().first()
    return SessionRow.from_mapping(row) if row else None


async def newest_live_session(
    conn: Connection, executor_id: str, credential: str
) -> SessionRow | None:
    """The newest live session of an executor opened with this credential."""
    query = (
        sa.select(executor_sessions)
        .where(
            executor_sessions.c.executor_id == executor_id,
            executor_sessions.c.credential == credential,
            executor_sessions.c.ended_at.is_(None),
        )
        .order_by(executor_sessions.c.registered_at.desc())
        .limit(1)
    )
    row = (await conn.execute(query)).mappings().first()
    return SessionRow.from_mapping(row) if row else None


# A live executor session's heartbeat (its row, if it is live).
TOUCH_SESSION = """
UPDATE executor_sessions SET last_seen_at = %(now)s, expires_at = %(expires_at)s
WHERE id = %(session_id)s AND ended_at IS NULL
RETURNING id
"""


async def touch_session(
    conn: Connection,
    session_id: str,
    *,
    now: datetime,
    expires_at: datetime,
    ended: Callable[[], Exception],
    at_commit: bool = False,
) -> None:
    """Move a live session's last heartbeat and expiry; raise `ended()` if it has ended (or is
    unknown). On Postgres the update goes with the transaction's next round trip (it is checked
    then): what the transaction does meanwhile is rolled back if the session has ended. With
    `at_commit` it goes in the commit statement instead, as its guard: nothing of the
    transaction is written if the session has ended by then, and committing raises `ended()`
    (a named function or a class: `CommitStatement.expect` names it in SQL)."""
    if conn.dialect.name == "postgresql":
        params = {"session_id": session_id, "now": now, "expires_at": expires_at}
        if at_commit:

            async def guard(c: Connection) -> None:
                commit_statement(c).expect(
                    TOUCH_SESSION, params, holds="count(*) = 1", refusal=ended
                )

            before_commit(conn, guard)
            return

        def check(cursor: AsyncCursor[Any]) -> None:
            if cursor.rowcount == 0:
                raise ended()

        queue_statement(conn, TOUCH_SESSION, params, check)
        return
    done = await conn.execute(
        sa.update(executor_sessions)
        .where(executor_sessions.c.id == session_id, executor_sessions.c.ended_at.is_(None))
        .values(last_seen_at=now, expires_at=expires_at)
    )
    if not done.rowcount:
        raise ended()


async def end_expired_sessions(conn: Connection, *, now: datetime) -> list[str]:
    """End every live session that expired before `now`; returns their ids."""
    rows = await conn.execute(
        sa.update(executor_sessions)
        .where(executor_sessions.c.ended_at.is_(None), executor_sessions.c.expires_at < now)
        .values(ended_at=now, end_reason="expired")
        .returning(executor_sessions.c.id)
    )
    return [r for (r,) in rows.all()]


async def revoke_token_sessions(conn: Connection, token_id: str, *, now: datetime) -> None:
    """End, as revoked, every live session opened with this pool token."""
    await conn.execute(
        sa.update(executor_sessions)
        .where(
            executor_sessions.c.credential == token_id,
            executor_sessions.c.ended_at.is_(None),
        )
        .values(ended_at=now, end_reason="revoked")
    )


async def revoke_credential_sessions(
    conn: Connection, credentials: Sequence[str], *, now: datetime
) -> None:
    """End, as revoked, every live session opened with any of these credentials."""
    await conn.execute(
        sa.update(executor_sessions)
        .where(
            executor_sessions.c.credential.in_(list(credentials)),
            executor_sessions.c.ended_at.is_(None),
        )
        .values(ended_at=now, end_reason="revoked")
    )


async def prune_sessions(conn: Connection, *, before: datetime) -> int:
    """Delete sessions that ended before `before` and hold no running step; returns how many."""
    held = sa.select(steps.c.id).where(
        steps.c.lease_owner == executor_sessions.c.id, steps.c.status == StepStatus.RUNNING
    )
    done = await conn.execute(
        sa.delete(executor_sessions).where(executor_sessions.c.ended_at < before, ~sa.exists(held))
    )
    return int(done.rowcount or 0)


async def list_sessions(conn: Connection, *, live_only: bool) -> list[tuple[SessionRow, int]]:
    """Up to 1000 sessions, newest first, each with how many running steps it leases."""
    leases = (
        sa.select(sa.func.count())
        .where(
            steps.c.lease_owner == executor_sessions.c.id,
            steps.c.status == StepStatus.RUNNING,
        )
        .scalar_subquery()
    )
    query = sa.select(executor_sessions, leases.label("leases")).order_by(
        executor_sessions.c.registered_at.desc()
    )
    if live_only:
        query = query.where(executor_sessions.c.ended_at.is_(None))
    rows = (await conn.execute(query.limit(1000))).mappings().all()
    return [(SessionRow.from_mapping(r), int(r["leases"])) for r in rows]


async def held_steps(conn: Connection, holders: Sequence[str]) -> list[int]:
    """Running steps leased to these holders."""
    if not holders:
        return []
    rows = await conn.execute(
        sa.select(steps.c.id).where(
            steps.c.status == StepStatus.RUNNING, steps.c.lease_owner.in_(list(holders))
        )
    )
    return [k for (k,) in rows.all()]


async def held_leases(conn: Connection, holder: str) -> list[tuple[int, int, int | None]]:
    """(step key, attempt, poll that took it) of every running step this holder leased."""
    rows = await conn.execute(
        sa.select(steps.c.id, steps.c.attempt, steps.c.lease_seq).where(
            steps.c.status == StepStatus.RUNNING, steps.c.lease_owner == holder
        )
    )
    return [(k, a, seq) for k, a, seq in rows.all()]


async def orphaned_steps(conn: Connection, *, limit: int) -> list[int]:
    """Running steps whose holder's session has ended (expired, revoked, replaced)."""
    rows = await conn.execute(
        sa.select(steps.c.id)
        .join(executor_sessions, executor_sessions.c.id == steps.c.lease_owner)
        .where(steps.c.status == StepStatus.RUNNING, executor_sessions.c.ended_at.is_not(None))
        .limit(limit)
    )
    return [k for (k,) in rows.all()]
