"""SQL of blast-radius caps: the charges made, and the counters they grow.

A counter is one (scope, effect) pair. Its row in bucket 0 holds a task's running total and is
the counter's lock; a tenant window also keeps rows per counting bucket (Unix seconds at the
bucket's start), summed over the window. Which charges fit is decided in `decide/caps.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_reach_controller.storage.engine import Connection, dialect_insert
from agent_reach_controller.storage.schema import cap_charges, cap_usage, tasks

Key = tuple[str, str]  # (scope, effect class): one counter
TOTAL = 0  # the bucket of a counter's running total (and its lock)


@dataclass(frozen=True, slots=True, kw_only=True)
class Charge:
    """What one step was charged for one tool, remembered so that it is charged only once."""

    step_key: int
    tool: str
    task_id: str
    tenant: str
    units: Mapping[str, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowUse:
    """Units added to a tenant window's current bucket; its buckets at or below `floor` expire."""

    key: Key
    bucket: int
    units: float
    floor: float


async def task_caps(conn: Connection, task_ids: Sequence[str]) -> dict[str, Any]:
    """The `caps` column of each of these tasks that exists (None or empty: it has none)."""
    rows = await conn.execute(
        sa.select(tasks.c.task_id, tasks.c.caps).where(tasks.c.task_id.in_(task_ids))
    )
    return {task_id: caps for task_id, caps in rows.all()}


async def task_usage(conn: Connection, task_id: str) -> dict[str, float]:
    """What a task has used of each capped class so far (classes nothing capped are absent)."""
    rows = await conn.execute(
        sa.select(cap_usage.c.effect, cap_usage.c.used).where(
            cap_usage.c.scope == f"task:{task_id}", cap_usage.c.bucket == TOTAL
        )
    )
    return {effect: float(used) for effect, used in rows.all()}


async def charged(conn: Connection, pairs: Sequence[tuple[int, str]]) -> set[tuple[int, str]]:
    """Which (step, tool) pairs were charged already (an earlier attempt ran)."""
    rows = await conn.execute(
        sa.select(cap_charges.c.step_key, cap_charges.c.tool).where(
            sa.tuple_(cap_charges.c.step_key, cap_charges.c.tool).in_(pairs)
        )
    )
    return {(key, tool) for key, tool in rows.all()}


async def lock_totals(conn: Connection, keys: Sequence[Key], *, now: datetime) -> dict[Key, float]:
    """Each counter's total, its row created if missing and locked until commit, in key order."""
    ordered = sorted(set(keys))
    await conn.execute(
        dialect_insert(conn, cap_usage).on_conflict_do_nothing(
            index_elements=["scope", "effect", "bucket"]
        ),
        [
            {"scope": scope, "effect": effect, "bucket": TOTAL, "used": 0.0, "updated_at": now}
            for scope, effect in ordered
        ],
    )
    totals = await conn.execute(
        sa.select(cap_usage.c.scope, cap_usage.c.effect, cap_usage.c.used)
        .where(
            cap_usage.c.bucket == TOTAL,
            sa.tuple_(cap_usage.c.scope, cap_usage.c.effect).in_(ordered),
        )
        .order_by(cap_usage.c.scope, cap_usage.c.effect)
        .with_for_update()
    )
    return {(scope, effect): float(value) for scope, effect, value in totals.all()}


async def window_sums(conn: Connection, floors: Mapping[Key, float]) -> dict[Key, float]:
    """The sum of each counter's buckets starting after its floor (counters with none absent)."""
    if not floors:
        return {}
    sums = await conn.execute(
        sa.select(cap_usage.c.scope, cap_usage.c.effect, sa.func.sum(cap_usage.c.used))
        .where(
            cap_usage.c.bucket != TOTAL,
            sa.or_(*(_after(key, floor) for key, floor in sorted(floors.items()))),
        )
        .group_by(cap_usage.c.scope, cap_usage.c.effect)
    )
    return {(scope, effect): float(total or 0.0) for scope, effect, total in sums.all()}


def _after(key: Key, floor: float) -> sa.ColumnElement[bool]:
    """The buckets of one counter that start after `floor`."""
    scope, effect = key
    return sa.and_(
        cap_usage.c.scope == scope, cap_usage.c.effect == effect, cap_usage.c.bucket > floor
    )


async def record_charges(conn: Connection, charges: Sequence[Charge], *, now: datetime) -> None:
    """Remember these charges (one already there for the same step and tool is kept)."""
    if not charges:
        return
    await conn.execute(
        dialect_insert(conn, cap_charges).on_conflict_do_nothing(
            index_elements=["step_key", "tool"]
        ),
        [
            {
                "step_key": c.step_key,
                "tool": c.tool,
                "task_id": c.task_id,
                "tenant": c.tenant,
                "units": dict(c.units),
                "charged_at": now,
            }
            for c in charges
        ],
    )


async def add_to_totals(conn: Connection, added: Mapping[Key, float], *, now: datetime) -> None:
    """Grow these counters' totals (their rows locked by `lock_totals`)."""
    if not added:
        return
    await conn.execute(
        sa.update(cap_usage)
        .where(
            cap_usage.c.scope == sa.bindparam("s"),
            cap_usage.c.effect == sa.bindparam("e"),
            cap_usage.c.bucket == TOTAL,
        )
        .values(used=cap_usage.c.used + sa.bindparam("d"), updated_at=now),
        [{"s": scope, "e": effect, "d": units} for (scope, effect), units in sorted(added.items())],
    )


async def add_to_windows(conn: Connection, uses: Sequence[WindowUse], *, now: datetime) -> None:
    """Grow each window's current bucket, then drop its buckets that can no longer count."""
    if not uses:
        return
    stmt = dialect_insert(conn, cap_usage)
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["scope", "effect", "bucket"],
            set_={"used": cap_usage.c.used + stmt.excluded.used, "updated_at": now},
        ),
        [
            {
                "scope": u.key[0],
                "effect": u.key[1],
                "bucket": u.bucket,
                "used": u.units,
                "updated_at": now,
            }
            for u in uses
        ],
    )
    # Dropped while the counter is locked anyway.
    for u in uses:
        await conn.execute(
            sa.delete(cap_usage).where(
                cap_usage.c.scope == u.key[0],
                cap_usage.c.effect == u.key[1],
                cap_usage.c.bucket != TOTAL,
                cap_usage.c.bucket <= u.floor,
            )
        )
