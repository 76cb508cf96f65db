"""SQL of live event streams: a task's status and a page of its events (`services/feed.py`).

On Postgres the page also carries the bounds of the snapshot it was read in, so that the feed
can hold back events a still-running transaction might precede (see `services/feed.py`).
"""

from __future__ import annotations

import sqlalchemy as sa

from agent_reach_controller.domain.records import EventRow
from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.storage.schema import events, tasks


async def task_status(conn: Connection, task_id: str) -> str | None:
    """The task's status; None when there is no such task."""
    row = await conn.execute(sa.select(tasks.c.status).where(tasks.c.task_id == task_id))
    return row.scalar_one_or_none()


async def events_page(
    conn: Connection, task_id: str, *, after: int, limit: int
) -> tuple[list[EventRow], int, int]:
    """The task's next events after id `after`, and the Postgres snapshot's (xmin, xmax)."""
    query = (
        sa.select(events)
        .where(events.c.task_id == task_id, events.c.id > after)
        .order_by(events.c.id)
        .limit(limit)
    )
    if conn.dialect.name != "postgresql":  # one writer: no snapshot bounds, (0, 0)
        return [EventRow.from_mapping(r) for r in (await conn.execute(query)).mappings()], 0, 0
    snapshot = sa.func.pg_current_snapshot()
    bounds = (
        _xid(sa.func.pg_snapshot_xmin(snapshot)).label("snapshot_xmin"),
        _xid(sa.func.pg_snapshot_xmax(snapshot)).label("snapshot_xmax"),
    )
    result = (await conn.execute(query.add_columns(*bounds))).mappings().all()
    if not result:
        return [], 0, 0
    rows = [EventRow.from_mapping({c.name: r[c.name] for c in events.c}) for r in result]
    return rows, int(result[0]["snapshot_xmin"]), int(result[0]["snapshot_xmax"])


def _xid(value: sa.ColumnElement[object]) -> sa.ColumnElement[int]:
    """An xid8 as a number (through text: drivers have no adapter for xid8)."""
    return sa.cast(sa.cast(value, sa.Text), sa.BigInteger)
