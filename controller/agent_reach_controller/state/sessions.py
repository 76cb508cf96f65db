"""Executor sessions: opened by Register, kept alive by one heartbeat per process, ended by
expiry, revocation or a new registration. A session's leases live exactly as long as it does.

The session credential (`xs_<id>_<secret>`) is a bearer secret stored as a hash; the id is public.
Lease tokens are an HMAC of the lease under the session's own key, so any replica can check that
a quoted lease was handed to this session, and nobody without that key can forge one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus
from agent_reach_controller.db.engine import Database
from agent_reach_controller.db.schema import executor_sessions, steps
from agent_reach_controller.identity import keys
from agent_reach_controller.identity.pools import PoolScope


class SessionEndedError(Exception):
    """The session expired, was revoked or was replaced: the executor must register again."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"executor session {session_id} has ended; register again")
        self.session_id = session_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """One executor process as the controller knows it."""

    id: str
    scope: PoolScope
    executor_id: str
    connectors: tuple[str, ...]
    lease_key: str

    def lease_token(self, step_key: int, attempt: int) -> str:
        """The token of this session's lease on one attempt: 128 bits, hex."""
        message = f"{step_key}:{attempt}".encode()
        return hmac.new(bytes.fromhex(self.lease_key), message, hashlib.sha256).hexdigest()[:32]

    def issued(self, token: str, step_key: int, attempt: int) -> bool:
        """Whether `token` is the one this session was handed for that attempt."""
        return hmac.compare_digest(token.encode(), self.lease_token(step_key, attempt).encode())


@dataclass(frozen=True, slots=True, kw_only=True)
class Announcement:
    """What an executor says of itself when it registers."""

    executor_id: str
    connectors: Sequence[str]
    slots: int
    version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """A session as operators list it."""

    id: str
    pool: str
    credential: str
    scope: dict[str, Any]
    executor_id: str
    connectors: list[str]
    slots: int
    version: str
    registered_at: datetime
    last_seen_at: datetime
    expires_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    leases: int


def _session_of(row: Any) -> Session:
    return Session(
        id=row["id"],
        scope=PoolScope.from_json(row["scope"], pool=row["pool"], credential=row["credential"]),
        executor_id=row["executor_id"],
        connectors=tuple(row["connectors"]),
        lease_key=row["lease_key"],
    )


class SessionService:
    """Sessions in the database. `liveness` is how long one lives past its last heartbeat."""

    def __init__(self, db: Database, *, liveness: timedelta, cache_seconds: float = 2.0) -> None:
        self._db = db
        self.liveness = liveness
        self._cache_seconds = cache_seconds
        # session id -> (until, (session, secret hash) or None)
        self._cache: dict[str, tuple[float, tuple[Session, str] | None]] = {}

    async def open(
        self, executor: Announcement, *, scope: PoolScope, now: datetime, reuse: bool = False
    ) -> tuple[Session, str]:
        """A new session and its credential (shown to the executor once, stored hashed).

        With `reuse` (anonymous executors of the previous release, which register again after
        any failed call), the executor's live session is kept, with a new credential, so the
        leases it holds stay its own.
        """
        made = keys.new_key(keys.SESSION_PREFIX)
        row: dict[str, Any] = {
            "id": made.key_id,
            "secret_hash": made.secret_hash,
            "lease_key": secrets.token_hex(32),
            "credential": scope.credential,
            "pool": scope.pool,
            "scope": scope.to_json(),
            "executor_id": executor.executor_id[:128],
            "connectors": sorted(set(executor.connectors)),
            "slots": executor.slots,
            "version": executor.version[:64],
            "registered_at": now,
            "last_seen_at": now,
            "expires_at": now + self.liveness,
        }
        async with self._db.transaction() as conn:
            kept = await self._rekey(conn, row) if reuse else None
            if kept is None:
                await conn.execute(executor_sessions.insert().values(**row))
            else:
                row = kept
        session = _session_of(row)
        self._cache[session.id] = (
            time.monotonic() + self._cache_seconds,
            (session, made.secret_hash),
        )
        return session, made.token

    async def _rekey(self, conn: AsyncConnection, row: dict[str, Any]) -> dict[str, Any] | None:
        """Give the executor's live session (same id, same credential) the new secret."""
        found = await conn.execute(
            sa.update(executor_sessions)
            .where(
                executor_sessions.c.executor_id == row["executor_id"],
                executor_sessions.c.credential == row["credential"],
                executor_sessions.c.ended_at.is_(None),
            )
            .values(
                secret_hash=row["secret_hash"],
                last_seen_at=row["last_seen_at"],
                expires_at=row["expires_at"],
            )
            .returning(*executor_sessions.c)
        )
        kept = found.mappings().first()
        return dict(kept) if kept is not None else None

    async def verify(self, credential: str) -> Session | None:
        """The session a credential stands for, or None (malformed, unknown or wrong secret).

        Whether it is still live is decided in the transaction that uses it (`touch`); a
        session's leases are checked against it row by row, so a stale cache grants nothing.
        """
        parsed = keys.parse(credential, keys.SESSION_PREFIX)
        if parsed is None:
            return None
        session_id, secret = parsed
        now = time.monotonic()
        cached = self._cache.get(session_id)
        if cached is None or cached[0] <= now:
            cached = (now + self._cache_seconds, await self._load(session_id))
            self._cache[session_id] = cached
        found = cached[1]
        if found is None or not keys.matches(secret, found[1]):
            return None
        return found[0]

    async def legacy(self, executor_id: str, credential: str) -> Session | None:
        """The newest live session of an executor that quotes no session (one release older),
        opened with the same credential."""
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
        async with self._db.transaction() as conn:
            row = (await conn.execute(query)).mappings().first()
        return _session_of(row) if row else None

    async def _load(self, session_id: str) -> tuple[Session, str] | None:
        query = sa.select(executor_sessions).where(executor_sessions.c.id == session_id)
        async with self._db.transaction() as conn:
            row = (await conn.execute(query)).mappings().first()
        return (_session_of(row), row["secret_hash"]) if row else None

    async def touch(self, conn: AsyncConnection, session_id: str, *, now: datetime) -> datetime:
        """Record that the session is alive; returns its new expiry, or SessionEndedError."""
        expires = now + self.liveness
        done = await conn.execute(
            sa.update(executor_sessions)
            .where(executor_sessions.c.id == session_id, executor_sessions.c.ended_at.is_(None))
            .values(last_seen_at=now, expires_at=expires)
        )
        if not done.rowcount:
            raise SessionEndedError(session_id)
        return expires

    async def end_expired(self, conn: AsyncConnection, *, now: datetime) -> list[str]:
        """End every live session whose heartbeats stopped; returns their ids."""
        rows = await conn.execute(
            sa.update(executor_sessions)
            .where(executor_sessions.c.ended_at.is_(None), executor_sessions.c.expires_at < now)
            .values(ended_at=now, end_reason="expired")
            .returning(executor_sessions.c.id)
        )
        return [r for (r,) in rows.all()]

    async def prune(self, *, before: datetime) -> int:
        """Forget sessions that ended before `before` and hold nothing."""
        held = sa.select(steps.c.id).where(
            steps.c.lease_owner == executor_sessions.c.id, steps.c.status == StepStatus.RUNNING
        )
        async with self._db.transaction() as conn:
            done = await conn.execute(
                sa.delete(executor_sessions).where(
                    executor_sessions.c.ended_at < before, ~sa.exists(held)
                )
            )
        return int(done.rowcount or 0)

    async def list(self, *, live_only: bool = True) -> list[SessionInfo]:
        """Sessions with the number of leases each holds, newest first."""
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
        async with self._db.transaction() as conn:
            rows = (await conn.execute(query.limit(1000))).mappings().all()
        return [
            SessionInfo(
                **{k: r[k] for k in SessionInfo.__dataclass_fields__ if k not in ("leases",)},
                leases=int(r["leases"]),
            )
            for r in rows
        ]


async def held_steps(conn: AsyncConnection, holders: Sequence[str]) -> list[int]:
    """Running steps leased to these holders."""
    if not holders:
        return []
    rows = await conn.execute(
        sa.select(steps.c.id).where(
            steps.c.status == StepStatus.RUNNING, steps.c.lease_owner.in_(list(holders))
        )
    )
    return [k for (k,) in rows.all()]


async def held_leases(conn: AsyncConnection, holder: str) -> list[tuple[int, int, int | None]]:
    """(step key, attempt, poll that took it) of every running step this holder leased."""
    rows = await conn.execute(
        sa.select(steps.c.id, steps.c.attempt, steps.c.lease_seq).where(
            steps.c.status == StepStatus.RUNNING, steps.c.lease_owner == holder
        )
    )
    return [(k, a, seq) for k, a, seq in rows.all()]


async def orphaned_steps(conn: AsyncConnection, *, limit: int) -> list[int]:
    """Running steps whose holder's session has ended (expired, revoked, replaced)."""
    rows = await conn.execute(
        sa.select(steps.c.id)
        .join(executor_sessions, executor_sessions.c.id == steps.c.lease_owner)
        .where(steps.c.status == StepStatus.RUNNING, executor_sessions.c.ended_at.is_not(None))
        .limit(limit)
    )
    return [k for (k,) in rows.all()]
