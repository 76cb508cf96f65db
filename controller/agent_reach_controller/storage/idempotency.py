"""SQL of Idempotency-Keys: one task per (principal, key), claimed at commit on Postgres."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.storage.engine import (
    before_commit,
    commit_statement,
    dialect_insert,
)
from agent_reach_controller.storage.schema import idempotency_keys


class KeyTakenError(Exception):
    """Another transaction holds this (principal, Idempotency-Key): nothing here was stored."""


# A new Idempotency-Key: no row back means another submit holds it.
CLAIM_IDEMPOTENCY_KEY = """
INSERT INTO idempotency_keys (principal, key, request_hash, task_id, created_at)
VALUES (%(principal)s, %(key)s, %(request_hash)s, %(task_id)s, %(created_at)s)
ON CONFLICT (principal, key) DO NOTHING
RETURNING task_id
"""


async def claim_idempotency_key(conn: AsyncConnection, row: dict[str, Any]) -> None:
    """Record (principal, key) → task, or raise KeyTakenError (rolling the transaction back).

    A concurrent submit with the same key waits on the unique index until the first one ends,
    so exactly one task is created per key. On Postgres the insert is part of the commit
    statement and the error comes at commit; on SQLite it comes at once.
    """
    if conn.dialect.name == "postgresql":

        async def claim(c: AsyncConnection) -> None:
            refused = KeyTakenError
            commit_statement(c).expect(
                CLAIM_IDEMPOTENCY_KEY, row, holds="count(*) = 1", refusal=refused
            )

        before_commit(conn, claim)
        return
    inserted = await conn.execute(
        dialect_insert(conn, idempotency_keys)
        .values(**row)
        .on_conflict_do_nothing(index_elements=["principal", "key"])
    )
    if inserted.rowcount != 1:
        raise KeyTakenError


async def load_idempotency_key(
    conn: AsyncConnection, principal: str, key: str
) -> tuple[str, str] | None:
    """The (request_hash, task_id) stored for (principal, key), if any."""
    row = (
        await conn.execute(
            sa.select(idempotency_keys.c.request_hash, idempotency_keys.c.task_id).where(
                idempotency_keys.c.principal == principal, idempotency_keys.c.key == key
            )
        )
    ).first()
    return (row[0], row[1]) if row is not None else None
