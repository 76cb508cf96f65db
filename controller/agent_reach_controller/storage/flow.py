"""The stored state of flow control: circuit breakers, rate-limit buckets, learned pauses.

The rules themselves are pure (`decide/breakers.py`, `decide/ratelimits.py`) and run in the
services; this module only reads and writes their rows, inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import sqlalchemy as sa

from agent_reach_controller.domain.records import Breaker, BreakerState
from agent_reach_controller.storage import catalog, hot
from agent_reach_controller.storage.engine import (
    Connection,
    dialect_insert,
)
from agent_reach_controller.storage.schema import breakers, rate_buckets, tool_pauses


async def load_breakers(
    conn: Connection, tools: Iterable[str], *, lock: bool = False
) -> dict[str, Breaker]:
    """Breaker rows of these tools (locked for update when `lock`)."""
    names = sorted(set(tools))
    if not names:
        return {}
    query = sa.select(breakers).where(breakers.c.tool.in_(names)).order_by(breakers.c.tool)
    if lock:
        query = query.with_for_update()
    rows = (await conn.execute(query)).mappings()
    return {
        r["tool"]: Breaker(
            tool=r["tool"],
            state=BreakerState(r["state"]),
            window_started_at=r["window_started_at"],
            calls=r["calls"],
            failures=r["failures"],
            opened_at=r["opened_at"],
        )
        for r in rows
    }


async def ensure_breakers(conn: Connection, tools: Iterable[str], *, now: datetime) -> None:
    """Create missing breaker rows (closed), so that locking them always locks something.

    Without a row, `SELECT … FOR UPDATE` locks nothing: two reports could both see no breaker,
    both open it, and the second would overwrite the first's opening time.
    """
    names = sorted(set(tools))
    if not names:
        return
    await conn.execute(
        dialect_insert(conn, breakers).on_conflict_do_nothing(index_elements=["tool"]),
        [
            {
                "tool": name,
                "state": BreakerState.CLOSED.value,
                "window_started_at": now,
                "calls": 0,
                "failures": 0,
                "opened_at": None,
                "updated_at": now,
            }
            for name in names
        ],
    )


async def save_breakers(conn: Connection, rows: Sequence[Breaker], *, now: datetime) -> None:
    """Insert or overwrite breaker rows."""
    if not rows:
        return
    stmt = dialect_insert(conn, breakers)
    stmt = stmt.on_conflict_do_update(
        index_elements=["tool"],
        set_={
            c: stmt.excluded[c]
            for c in ("state", "window_started_at", "calls", "failures", "opened_at", "updated_at")
        },
    )
    await conn.execute(
        stmt,
        [
            {
                "tool": b.tool,
                "state": b.state.value,
                "window_started_at": b.window_started_at,
                "calls": b.calls,
                "failures": b.failures,
                "opened_at": b.opened_at,
                "updated_at": now,
            }
            for b in rows
        ],
    )


async def lock_buckets(conn: Connection, names: Iterable[str]) -> dict[str, float]:
    """The TAT of each rate bucket, its row created if missing and locked in name order."""
    ordered = sorted(set(names))
    if not ordered:
        return {}
    await conn.execute(
        dialect_insert(conn, rate_buckets).on_conflict_do_nothing(index_elements=["bucket"]),
        [{"bucket": name, "tat": 0.0} for name in ordered],
    )
    rows = await conn.execute(
        sa.select(rate_buckets.c.bucket, rate_buckets.c.tat)
        .where(rate_buckets.c.bucket.in_(ordered))
        .order_by(rate_buckets.c.bucket)
        .with_for_update()
    )
    return {bucket: float(tat) for bucket, tat in rows.all()}


async def save_buckets(conn: Connection, tats: Mapping[str, float]) -> None:
    """Set the TAT of these rate buckets (rows locked by `lock_buckets`)."""
    if not tats:
        return
    await conn.execute(
        sa.update(rate_buckets)
        .where(rate_buckets.c.bucket == sa.bindparam("b"))
        .values(tat=sa.bindparam("tat")),
        [{"b": bucket, "tat": tat} for bucket, tat in tats.items()],
    )


async def peek_bucket(conn: Connection, name: str) -> float | None:
    """The TAT of a rate bucket (None: no row), read without a lock and changing nothing."""
    found = await conn.execute(sa.select(rate_buckets.c.tat).where(rate_buckets.c.bucket == name))
    tat = found.scalar_one_or_none()
    return None if tat is None else float(tat)


async def peek_key_buckets(
    conn: Connection, tool: str, *, after: float, up_to: int
) -> tuple[int, float | None]:
    """A keyed tool's buckets (`tool#…`) whose TAT is later than `after`: how many (counting
    stops at `up_to`) and the latest TAT among them; read without locks, changing nothing."""
    escaped = tool.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    held = (
        sa.select(rate_buckets.c.tat)
        .where(
            rate_buckets.c.bucket.like(f"{escaped}#%", escape="\\"),
            rate_buckets.c.tat > after,
        )
        .limit(up_to)
        .subquery()
    )
    row = (await conn.execute(sa.select(sa.func.count(), sa.func.max(held.c.tat)))).one()
    return int(row[0]), None if row[1] is None else float(row[1])


ACTIVE_PAUSES = "SELECT tool, until FROM tool_pauses WHERE until > %(now)s"


# What a claim checks first, in one read: the catalogue's revision and the tools held back now
# (one row with NULLs when none is).
REVISION_AND_PAUSES = """
SELECT (SELECT revision FROM catalog_state WHERE id = 1) AS revision, p.tool, p.until
FROM (SELECT 1) AS one LEFT JOIN tool_pauses AS p ON p.until > %(now)s
"""


async def revision_and_pauses(
    conn: Connection, *, now: datetime
) -> tuple[int, dict[str, datetime]]:
    """The catalogue's revision and `active_pauses`, in one round trip on Postgres."""
    if conn.dialect.name != "postgresql":
        return await catalog.revision(conn), await active_pauses(conn, now=now)
    found = await hot.rows(conn, REVISION_AND_PAUSES, {"now": now})
    pauses = {r["tool"]: r["until"] for r in found if r["tool"] is not None}
    return int(found[0]["revision"]), pauses


async def active_pauses(conn: Connection, *, now: datetime) -> dict[str, datetime]:
    """Tools held back by their downstream right now, and until when."""
    if conn.dialect.name == "postgresql":
        found = await hot.rows(conn, ACTIVE_PAUSES, {"now": now})
        return {r["tool"]: r["until"] for r in found}
    rows = await conn.execute(
        sa.select(tool_pauses.c.tool, tool_pauses.c.until).where(tool_pauses.c.until > now)
    )
    return {tool: until for tool, until in rows.all()}


async def pause_tool(
    conn: Connection, tool: str, *, until: datetime, reason: str, now: datetime
) -> None:
    """Hold a tool back until `until`; a longer pause already in place is kept."""
    stmt = dialect_insert(conn, tool_pauses).values(
        tool=tool, until=until, reason=reason, updated_at=now
    )
    longer = sa.case(
        (stmt.excluded.until > tool_pauses.c.until, stmt.excluded.until), else_=tool_pauses.c.until
    )
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["tool"],
            set_={"until": longer, "reason": reason, "updated_at": now},
        )
    )
