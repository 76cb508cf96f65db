"""SQL of the event log: a transaction's events, appended in one insert before it commits, and
read back in order."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.domain.records import EventRow
from agent_reach_controller.storage.commit import json_rows
from agent_reach_controller.storage.engine import (
    TX_STATE_PREFIX,
    Connection,
    before_commit,
    commit_statement,
)
from agent_reach_controller.storage.schema import events


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    task_id: str
    kind: str
    created_at: datetime
    step_id: str | None = None
    from_status: str | None = None
    to_status: str | None = None
    attempt: int | None = None
    data: dict[str, Any] | None = None


_EVENTS = f"{TX_STATE_PREFIX}events"


_WRITTEN = f"{TX_STATE_PREFIX}events_written"


async def append_events(conn: AsyncConnection, new: Sequence[NewEvent]) -> None:
    """Append history rows; a transaction's events are written in one insert before it commits."""
    if not new:
        return
    buffered: list[NewEvent] | None = conn.info.get(_EVENTS)
    if buffered is None:
        buffered = conn.info[_EVENTS] = []
        before_commit(conn, _flush_events)
    buffered.extend(new)


def events_written(conn: AsyncConnection, task_ids: Iterable[str]) -> None:
    """Say that a statement of this transaction wrote events of these tasks itself (the claim
    does), so that their followers are told as for appended ones."""
    written: set[str] = conn.info.setdefault(_WRITTEN, set())
    written.update(task_ids)


def tasks_with_events(conn: AsyncConnection) -> frozenset[str]:
    """The tasks this transaction has appended events to and not yet flushed, or written by a
    statement of its own (see notifier)."""
    buffered: list[NewEvent] = conn.info.get(_EVENTS, [])
    written: set[str] = conn.info.get(_WRITTEN, set())
    return frozenset(e.task_id for e in buffered) | written


# Every event of a transaction, in one statement, from one JSON array (psycopg dumps one string
# far faster than eight arrays), in the order appended: their ids are the log's order.
INSERT_EVENTS = """
INSERT INTO events (task_id, step_id, kind, from_status, to_status, attempt, data, created_at)
SELECT e.task_id, e.step_id, e.kind, e.from_status, e.to_status, e.attempt, e.data, e.created_at
FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb) AS (
    task_id text, step_id text, kind text, from_status text, to_status text, attempt int,
    data jsonb, created_at timestamptz
)) WITH ORDINALITY AS e(task_id, step_id, kind, from_status, to_status, attempt, data,
    created_at, n)
ORDER BY e.n
"""


def insert_events(conn: Connection, rows: str) -> None:
    """Append events at commit: `rows` is a JSON array of `events` rows without their `id`."""
    commit_statement(conn).write(INSERT_EVENTS, {"rows": rows})


async def _flush_events(conn: AsyncConnection) -> None:
    new: list[NewEvent] = conn.info.pop(_EVENTS, [])
    if not new:
        return
    rows = [
        {
            "task_id": e.task_id,
            "step_id": e.step_id,
            "kind": e.kind,
            "from_status": e.from_status,
            "to_status": e.to_status,
            "attempt": e.attempt,
            "data": e.data,
            "created_at": e.created_at,
        }
        for e in new
    ]
    if conn.dialect.name == "postgresql":
        insert_events(conn, json_rows(rows))
    else:
        await conn.execute(events.insert(), rows)


async def count_tool_calls(conn: AsyncConnection, task_id: str) -> int:
    """Attempts handed to an executor (lease events), every step and retry included."""
    counted = await conn.execute(
        sa.select(sa.func.count())
        .select_from(events)
        .where(events.c.task_id == task_id, events.c.kind == "lease")
    )
    return int(counted.scalar_one())


async def load_events(
    conn: AsyncConnection, task_id: str, *, after: int = 0, limit: int = 1000
) -> list[EventRow]:
    stmt = (
        sa.select(events)
        .where(events.c.task_id == task_id, events.c.id > after)
        .order_by(events.c.id)
        .limit(limit)
    )
    return [EventRow.from_mapping(r) for r in (await conn.execute(stmt)).mappings()]
