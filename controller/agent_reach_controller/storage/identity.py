"""SQL of credentials: API keys (`identity/service.py`), executor pool tokens
(`identity/pools.py`) and console sign-ins (`identity/sign_ins.py`). Secrets are stored only as
hashes; the layers above check them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.storage.schema import api_keys, console_sessions, executor_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKeyRow:
    """One row of `api_keys`."""

    key_id: str
    secret_hash: str
    name: str
    tenant: str
    roles: list[str]
    created_at: datetime
    created_by: str
    revoked_at: datetime | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> ApiKeyRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolTokenRow:
    """One row of `executor_tokens`."""

    token_id: str
    secret_hash: str
    name: str
    connectors: list[str] | None
    tools: list[str] | None
    tenant: str | None
    created_at: datetime
    created_by: str
    revoked_at: datetime | None

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> PoolTokenRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleSessionRow:
    """One row of `console_sessions`."""

    secret_hash: str
    principal: str
    tenant: str
    roles: list[str]
    key_id: str | None
    created_at: datetime
    expires_at: datetime

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> ConsoleSessionRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


def _values(row: ApiKeyRow | PoolTokenRow | ConsoleSessionRow) -> dict[str, Any]:
    return {f.name: getattr(row, f.name) for f in fields(row)}


# --- API keys -------------------------------------------------------------------------------


async def insert_api_key(conn: Connection, row: ApiKeyRow) -> None:
    """Insert a new API key."""
    await conn.execute(api_keys.insert().values(**_values(row)))


async def list_api_keys(conn: Connection, *, tenant: str | None = None) -> list[ApiKeyRow]:
    """Every API key (of one tenant, when given), oldest first."""
    query = sa.select(api_keys).order_by(api_keys.c.created_at)
    if tenant is not None:
        query = query.where(api_keys.c.tenant == tenant)
    rows = (await conn.execute(query)).mappings().all()
    return [ApiKeyRow.from_mapping(r) for r in rows]


async def load_api_key(conn: Connection, key_id: str) -> ApiKeyRow | None:
    """One API key by id, live or revoked."""
    row = (
        (await conn.execute(sa.select(api_keys).where(api_keys.c.key_id == key_id)))
        .mappings()
        .first()
    )
    return ApiKeyRow.from_mapping(row) if row else None


async def revoke_api_key(conn: Connection, key_id: str, *, now: datetime) -> bool:
    """Mark a live API key revoked; False when there is no such live key."""
    return await _revoke(conn, api_keys, api_keys.c.key_id == key_id, now=now)


# --- executor pool tokens -------------------------------------------------------------------


async def insert_pool_token(conn: Connection, row: PoolTokenRow) -> None:
    """Insert a new pool token."""
    await conn.execute(executor_tokens.insert().values(**_values(row)))


async def list_pool_tokens(conn: Connection) -> list[PoolTokenRow]:
    """Every pool token in the database, oldest first."""
    query = sa.select(executor_tokens).order_by(executor_tokens.c.created_at)
    rows = (await conn.execute(query)).mappings().all()
    return [PoolTokenRow.from_mapping(r) for r in rows]


async def load_pool_token(conn: Connection, token_id: str) -> PoolTokenRow | None:
    """One pool token by id, live or revoked."""
    query = sa.select(executor_tokens).where(executor_tokens.c.token_id == token_id)
    row = (await conn.execute(query)).mappings().first()
    return PoolTokenRow.from_mapping(row) if row else None


async def newest_live_pool_token(conn: Connection, name: str) -> PoolTokenRow | None:
    """The newest unrevoked pool token of this pool name."""
    query = (
        sa.select(executor_tokens)
        .where(executor_tokens.c.name == name, executor_tokens.c.revoked_at.is_(None))
        .order_by(executor_tokens.c.created_at.desc())
        .limit(1)
    )
    row = (await conn.execute(query)).mappings().first()
    return PoolTokenRow.from_mapping(row) if row else None


async def revoke_pool_token(conn: Connection, token_id: str, *, now: datetime) -> bool:
    """Mark a live pool token revoked; False when there is no such live token."""
    return await _revoke(conn, executor_tokens, executor_tokens.c.token_id == token_id, now=now)


async def _revoke(
    conn: Connection, table: sa.Table, which: sa.ColumnElement[bool], *, now: datetime
) -> bool:
    """Revoke the credential `which` picks if it is live: a credential is revoked once, and the
    first revocation's time stays (False: none was live)."""
    done = await conn.execute(
        sa.update(table).where(which, table.c.revoked_at.is_(None)).values(revoked_at=now)
    )
    return bool(done.rowcount)


# --- console sign-ins -----------------------------------------------------------------------


async def insert_console_session(conn: Connection, row: ConsoleSessionRow) -> None:
    """Insert a new console session."""
    await conn.execute(console_sessions.insert().values(**_values(row)))


async def load_console_session(conn: Connection, secret_hash: str) -> ConsoleSessionRow | None:
    """A console session by the hash of its secret, expired or not."""
    query = sa.select(console_sessions).where(console_sessions.c.secret_hash == secret_hash)
    row = (await conn.execute(query)).mappings().first()
    return ConsoleSessionRow.from_mapping(row) if row else None


async def delete_console_session(conn: Connection, secret_hash: str) -> None:
    """End one console session (signing out)."""
    await conn.execute(
        sa.delete(console_sessions).where(console_sessions.c.secret_hash == secret_hash)
    )


async def delete_console_sessions_of_key(conn: Connection, key_id: str) -> int:
    """End every console session made from an API key (the key was revoked)."""
    done = await conn.execute(
        sa.delete(console_sessions).where(console_sessions.c.key_id == key_id)
    )
    return int(done.rowcount or 0)


async def delete_expired_console_sessions(conn: Connection, *, now: datetime, limit: int) -> int:
    """Forget up to `limit` sessions that expired (oldest first)."""
    expired = (
        sa.select(console_sessions.c.secret_hash)
        .where(console_sessions.c.expires_at <= now)
        .order_by(console_sessions.c.expires_at)
        .limit(limit)
    )
    done = await conn.execute(
        sa.delete(console_sessions).where(
            console_sessions.c.secret_hash.in_(expired.scalar_subquery())
        )
    )
    return int(done.rowcount or 0)
