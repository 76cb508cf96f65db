"""SQL of the webhook outbox (`services/webhooks.py` sends what it holds).

A request is written in the transaction that asks for it; senders take due rows (SKIP LOCKED on
Postgres) and move their due time forward before sending, then record how it went.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.storage.schema import webhook_outbox


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow:
    """One request taken for sending: its body, and how often it was tried before."""

    id: int
    kind: str
    payload: Any
    attempts: int
    expires_at: datetime | None
    url: str | None = None  # a task's own webhook; None: the approval webhook


async def add_requests(
    conn: Connection,
    requests: Sequence[tuple[str, dict[str, Any], datetime | None]],
    *,
    now: datetime,
    url: str | None = None,
) -> None:
    """INSERT (kind, payload, expires_at) requests, due at once (to `url`, if given)."""
    if not requests:
        return
    await conn.execute(
        sa.insert(webhook_outbox),
        [
            {
                "kind": kind,
                "payload": payload,
                "created_at": now,
                "due_at": now,
                "expires_at": expires_at,
                "url": url,
            }
            for kind, payload, expires_at in requests
        ],
    )


async def due_requests(conn: Connection, *, now: datetime, limit: int) -> list[OutboxRow]:
    """Up to `limit` pending requests due by `now`, soonest first; Postgres: locked, SKIP LOCKED."""
    pending = sa.and_(
        webhook_outbox.c.delivered_at.is_(None),
        webhook_outbox.c.given_up_at.is_(None),
        webhook_outbox.c.due_at <= now,
    )
    query = (
        sa.select(
            webhook_outbox.c.id,
            webhook_outbox.c.kind,
            webhook_outbox.c.payload,
            webhook_outbox.c.attempts,
            webhook_outbox.c.expires_at,
            webhook_outbox.c.url,
        )
        .where(pending)
        .order_by(webhook_outbox.c.due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)  # SQLite, one writer, compiles no FOR UPDATE
    )
    return [OutboxRow(**r) for r in (await conn.execute(query)).mappings()]


async def lease_requests(conn: Connection, ids: Sequence[int], *, due_at: datetime) -> None:
    """Move these requests' due time to `due_at` and count one more attempt."""
    if not ids:
        return
    await conn.execute(
        sa.update(webhook_outbox)
        .where(webhook_outbox.c.id.in_(list(ids)))
        .values(due_at=due_at, attempts=webhook_outbox.c.attempts + 1)
    )


async def mark_delivered(conn: Connection, request_id: int, *, now: datetime) -> None:
    """Record a request as acknowledged at `now`, clearing its last error."""
    await conn.execute(
        sa.update(webhook_outbox)
        .where(webhook_outbox.c.id == request_id)
        .values(delivered_at=now, last_error=None)
    )


async def mark_failed(
    conn: Connection,
    request_id: int,
    *,
    due_at: datetime,
    error: str,
    given_up_at: datetime | None = None,
) -> None:
    """Record a failed attempt: when to retry, why, and (if set) when it was given up."""
    values: dict[str, Any] = {"due_at": due_at, "last_error": error}
    if given_up_at is not None:
        values["given_up_at"] = given_up_at
    await conn.execute(
        sa.update(webhook_outbox).where(webhook_outbox.c.id == request_id).values(values)
    )


async def delete_finished(conn: Connection, *, before: datetime) -> int:
    """DELETE requests delivered or given up before `before`; returns how many."""
    done = await conn.execute(
        sa.delete(webhook_outbox).where(
            sa.or_(
                webhook_outbox.c.delivered_at < before,
                webhook_outbox.c.given_up_at < before,
            )
        )
    )
    return int(done.rowcount or 0)
