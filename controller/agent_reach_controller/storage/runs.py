"""SQL of agent runs and their conversations (one text for both backends: none is hot)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.domain.records import RunMessage, RunRow
from agent_reach_controller.storage.schema import run_messages, runs, tasks


async def insert_run(conn: AsyncConnection, row: Mapping[str, Any]) -> None:
    await conn.execute(sa.insert(runs).values(**row))


async def load_run(conn: AsyncConnection, run_id: str, *, lock: bool = False) -> RunRow | None:
    """A run (row-locked until the transaction ends, with `lock`, on Postgres)."""
    query = sa.select(runs).where(runs.c.run_id == run_id)
    if lock:
        query = query.with_for_update()
    row = (await conn.execute(query)).mappings().first()
    return RunRow.from_mapping(row) if row is not None else None


async def load_runs(conn: AsyncConnection, run_ids: Iterable[str]) -> dict[str, RunRow]:
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    rows = await conn.execute(sa.select(runs).where(runs.c.run_id.in_(ids)))
    return {r["run_id"]: RunRow.from_mapping(r) for r in rows.mappings()}


async def update_run(
    conn: AsyncConnection, run: RunRow, values: Mapping[str, Any], *, now: datetime
) -> bool:
    """Change a run read at `run.version` (optimistic lock); False if it moved meanwhile."""
    changed = await conn.execute(
        sa.update(runs)
        .where(runs.c.run_id == run.run_id, runs.c.version == run.version)
        .values(**values, version=run.version + 1, updated_at=now)
    )
    return changed.rowcount == 1


async def list_runs(
    conn: AsyncConnection, tenant: str, *, limit: int, before: str | None = None
) -> list[RunRow]:
    """A tenant's runs, newest first (run ids sort by time)."""
    query = sa.select(runs).where(runs.c.tenant == tenant)
    if before is not None:
        query = query.where(runs.c.run_id < before)
    rows = await conn.execute(query.order_by(runs.c.run_id.desc()).limit(limit))
    return [RunRow.from_mapping(r) for r in rows.mappings()]


async def append_messages(
    conn: AsyncConnection,
    run_id: str,
    round_: int,
    entries: Sequence[tuple[str, dict[str, Any]]],
    *,
    now: datetime,
) -> None:
    """Append (role, message) entries to a run's conversation, in order (the run is locked)."""
    if not entries:
        return
    last = (
        await conn.execute(
            sa.select(sa.func.max(run_messages.c.seq)).where(run_messages.c.run_id == run_id)
        )
    ).scalar_one()
    first = 0 if last is None else last + 1
    await conn.execute(
        sa.insert(run_messages),
        [
            {
                "run_id": run_id,
                "seq": first + i,
                "round": round_,
                "role": role,
                "message": message,
                "created_at": now,
            }
            for i, (role, message) in enumerate(entries)
        ],
    )


async def load_messages(
    conn: AsyncConnection, run_ids: Iterable[str]
) -> dict[str, list[RunMessage]]:
    """Each run's conversation, in order."""
    ids = sorted(set(run_ids))
    found: dict[str, list[RunMessage]] = {run_id: [] for run_id in ids}
    if not ids:
        return found
    rows = await conn.execute(
        sa.select(run_messages)
        .where(run_messages.c.run_id.in_(ids))
        .order_by(run_messages.c.run_id, run_messages.c.seq)
    )
    for r in rows.mappings():
        found[r["run_id"]].append(
            RunMessage(seq=r["seq"], round=r["round"], role=r["role"], message=r["message"])
        )
    return found


async def rounds_of(conn: AsyncConnection, run_id: str) -> list[tuple[str, str, str]]:
    """A run's rounds' tasks, oldest first: (task_id, status, goal)."""
    rows = await conn.execute(
        sa.select(tasks.c.task_id, tasks.c.status, tasks.c.goal)
        .where(tasks.c.run_id == run_id)
        .order_by(tasks.c.task_id)
    )
    return [(r[0], r[1], r[2] or "") for r in rows.all()]
