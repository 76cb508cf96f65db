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

from agent_reach_controller.identity import keys
from agent_reach_controller.identity.pools import PoolScope
from agent_reach_controller.storage import sessions as storage
from agent_reach_controller.storage.engine import Connection, Database


# The last three are statements `services/leases.py` calls through this module.
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


def _session_of(row: storage.NewSession) -> Session:
    return Session(
        id=row.id,
        scope=PoolScope.from_json(row.scope, pool=row.pool, credential=row.credential),
        executor_id=row.executor_id,
        connectors=tuple(row.connectors),
        lease_key=row.lease_key,
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
        new = storage.NewSession(
            id=made.key_id,
            secret_hash=made.secret_hash,
            lease_key=secrets.token_hex(32),
            credential=scope.credential,
            pool=scope.pool,
            scope=scope.to_json(),
            executor_id=executor.executor_id[:128],
            connectors=sorted(set(executor.connectors)),
            slots=executor.slots,
            version=executor.version[:64],
            registered_at=now,
            last_seen_at=now,
            expires_at=now + self.liveness,
        )
        async with self._db.transaction() as conn:
            # Reuse gives the executor's live session (same id, same credential) the new secret.
            kept = await storage.rekey_session(conn, new) if reuse else None
            if kept is None:
                await storage.insert_session(conn, new)
        session = _session_of(kept if kept is not None else new)
        self._cache[session.id] = (
            time.monotonic() + self._cache_seconds,
            (session, made.secret_hash),
        )
        # A kept session keeps its id: the credential must name it, not the id drawn above.
        token = made.token if kept is None else made.under(kept.id)
        return session, token

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
        async with self._db.transaction() as conn:
            row = await storage.newest_live_session(conn, executor_id, credential)
        return _session_of(row) if row else None

    async def _load(self, session_id: str) -> tuple[Session, str] | None:
        async with self._db.transaction() as conn:
            row = await storage.load_session(conn, session_id)
        return (_session_of(row), row.secret_hash) if row else None

    async def touch(
        self, conn: Connection, session_id: str, *, now: datetime, at_commit: bool = False
    ) -> datetime:
        """Record that the session is alive; returns its new expiry. SessionEndedError if it
        has ended: on Postgres from the transaction's next round trip, which carries the update,
        or `at_commit` from its commit, which then writes nothing (`storage.touch_session`)."""
        expires = now + self.liveness

        def session_ended() -> SessionEndedError:
            return SessionEndedError(session_id)

        await storage.touch_session(
            conn, session_id, now=now, expires_at=expires, ended=session_ended, at_commit=at_commit
        )
        return expires

    async def end_expired(self, conn: Connection, *, now: datetime) -> list[str]:
        """End every live session whose heartbeats stopped; returns their ids."""
        return await storage.end_expired_sessions(conn, now=now)

    async def prune(self, *, before: datetime) -> int:
        """Forget sessions that ended before `before` and hold nothing."""
        async with self._db.transaction() as conn:
            return await storage.prune_sessions(conn, before=before)

    async def list(self, *, live_only: bool = True) -> list[SessionInfo]:
        """Sessions with the number of leases each holds, newest first."""
        async with self._db.transaction() as conn:
            rows = await storage.list_sessions(conn, live_only=live_only)
        return [
            SessionInfo(
                **{
                    k: getattr(r, k)
                    for k in SessionInfo.__dataclass_fields__
                    if k not in ("leases",)
                },
                leases=leases,
            )
            for r, leases in rows
        ]
