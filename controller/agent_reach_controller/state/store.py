"""All SQL of the state machine, in one place. Every status write is a guarded compare-and-set."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus, TaskStatus, Transition, apply, sources, target
from agent_reach_controller.db.engine import TX_STATE_PREFIX, before_commit
from agent_reach_controller.db.schema import (
    UtcDateTime,
    breakers,
    events,
    idempotency_keys,
    rate_buckets,
    steps,
    tasks,
    tool_pauses,
    tools,
)
from agent_reach_controller.flow.breakers import Breaker, BreakerState
from agent_reach_controller.flow.ratelimits import Rate, admit, floor_tat
from agent_reach_controller.state.records import EventRow, StepChange, StepRow, TaskRow


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


async def append_events(conn: AsyncConnection, new: Sequence[NewEvent]) -> None:
    """Append history rows; a transaction's events are written in one insert before it commits."""
    if not new:
        return
    buffered: list[NewEvent] | None = conn.info.get(_EVENTS)
    if buffered is None:
        buffered = conn.info[_EVENTS] = []
        before_commit(conn, _flush_events)
    buffered.extend(new)


async def _flush_events(conn: AsyncConnection) -> None:
    new: list[NewEvent] = conn.info.pop(_EVENTS, [])
    if not new:
        return
    await conn.execute(
        events.insert(),
        [
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
        ],
    )


# --- steps: reads ---------------------------------------------------------------------------


async def load_steps(conn: AsyncConnection, task_ids: Iterable[str]) -> list[StepRow]:
    ids = sorted(set(task_ids))
    if not ids:
        return []
    rows = await conn.execute(
        sa.select(steps).where(steps.c.task_id.in_(ids)).order_by(steps.c.task_id, steps.c.position)
    )
    return [StepRow.from_mapping(r) for r in rows.mappings()]


async def load_advanceable_steps(conn: AsyncConnection, task_ids: Iterable[str]) -> list[StepRow]:
    """The blocked steps of these tasks and every step they depend on."""
    ids = sorted(set(task_ids))
    if not ids:
        return []
    rows = await conn.execute(
        sa.select(steps)
        .where(steps.c.task_id.in_(ids), steps.c.status == StepStatus.BLOCKED)
        .order_by(steps.c.task_id, steps.c.position)
    )
    blocked = [StepRow.from_mapping(r) for r in rows.mappings()]
    if not blocked:
        return []
    have = {(s.task_id, s.step_id) for s in blocked}
    needed = {(s.task_id, d) for s in blocked for d in s.depends_on} - have
    if not needed:
        return blocked
    rows = await conn.execute(
        sa.select(steps).where(sa.tuple_(steps.c.task_id, steps.c.step_id).in_(sorted(needed)))
    )
    return sorted(
        [*blocked, *(StepRow.from_mapping(r) for r in rows.mappings())],
        key=lambda s: (s.task_id, s.position),
    )


async def status_counts(
    conn: AsyncConnection, task_ids: Iterable[str]
) -> dict[str, Counter[StepStatus]]:
    """How many steps of each task are in each state."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    rows = await conn.execute(
        sa.select(steps.c.task_id, steps.c.status, sa.func.count())
        .where(steps.c.task_id.in_(ids))
        .group_by(steps.c.task_id, steps.c.status)
    )
    counts: dict[str, Counter[StepStatus]] = {}
    for task_id, status, count in rows.all():
        counts.setdefault(task_id, Counter())[StepStatus(status)] = int(count)
    return counts


async def load_steps_by_key(conn: AsyncConnection, keys: Iterable[int]) -> dict[int, StepRow]:
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    rows = await conn.execute(sa.select(steps).where(steps.c.id.in_(wanted)))
    return {r["id"]: StepRow.from_mapping(r) for r in rows.mappings()}


async def load_breakers(
    conn: AsyncConnection, tools: Iterable[str], *, lock: bool = False
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


async def ensure_breakers(conn: AsyncConnection, tools: Iterable[str], *, now: datetime) -> None:
    """Create missing breaker rows (closed), so that locking them always locks something.

    Without a row, `SELECT … FOR UPDATE` locks nothing: two reports could both see no breaker,
    both open it, and the second would overwrite the first's opening time.
    """
    names = sorted(set(tools))
    if not names:
        return
    await conn.execute(
        _insert(conn, breakers).on_conflict_do_nothing(index_elements=["tool"]),
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


async def save_breakers(conn: AsyncConnection, rows: Sequence[Breaker], *, now: datetime) -> None:
    """Insert or overwrite breaker rows."""
    if not rows:
        return
    stmt = _insert(conn, breakers)
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


async def queue_depth(conn: AsyncConnection) -> int:
    """Steps waiting for an executor (ready, due or not), over the claim query's partial index."""
    row = await conn.execute(
        sa.select(sa.func.count()).select_from(steps).where(steps.c.status == StepStatus.READY)
    )
    return int(row.scalar_one())


async def next_due(
    conn: AsyncConnection, connectors: Sequence[str], *, now: datetime
) -> datetime | None:
    """When the earliest deferred ready step of these connectors becomes due (after `now`).

    Steps already due but not leased (their tool is at its cap) are not counted: a finishing
    step of that tool wakes the pollers instead.
    """
    row = await conn.execute(
        sa.select(sa.func.min(steps.c.not_before)).where(
            steps.c.status == StepStatus.READY,
            steps.c.connector.in_(connectors),
            steps.c.not_before > now,
        )
    )
    value: datetime | None = row.scalar_one_or_none()
    return value


# --- rate limits and pauses ----------------------------------------------------------------


async def take_tokens(
    conn: AsyncConnection, asks: Sequence[tuple[str, Rate]], *, now: float, since: float
) -> list[float]:
    """GCRA over the `rate_buckets` rows, locked in name order: the wait of each ask, 0 if taken."""
    names = sorted({bucket for bucket, _ in asks})
    await conn.execute(
        _insert(conn, rate_buckets).on_conflict_do_nothing(index_elements=["bucket"]),
        [{"bucket": name, "tat": 0.0} for name in names],
    )
    rows = await conn.execute(
        sa.select(rate_buckets.c.bucket, rate_buckets.c.tat)
        .where(rate_buckets.c.bucket.in_(names))
        .order_by(rate_buckets.c.bucket)
        .with_for_update()
    )
    tats: dict[str, float] = {bucket: float(tat) for bucket, tat in rows.all()}
    before = dict(tats)
    waits = []
    for bucket, rate in asks:
        tats[bucket], wait = admit(tats[bucket], now, rate, floor=floor_tat(rate, since))
        waits.append(wait)
    changed = [{"b": b, "tat": t} for b, t in tats.items() if t != before[b]]
    if changed:
        await conn.execute(
            sa.update(rate_buckets)
            .where(rate_buckets.c.bucket == sa.bindparam("b"))
            .values(tat=sa.bindparam("tat")),
            changed,
        )
    return waits


async def active_pauses(conn: AsyncConnection, *, now: datetime) -> dict[str, datetime]:
    """Tools held back by their downstream right now, and until when."""
    rows = await conn.execute(
        sa.select(tool_pauses.c.tool, tool_pauses.c.until).where(tool_pauses.c.until > now)
    )
    return {tool: until for tool, until in rows.all()}


async def pause_tool(
    conn: AsyncConnection, tool: str, *, until: datetime, reason: str, now: datetime
) -> None:
    """Hold a tool back until `until`; a longer pause already in place is kept."""
    stmt = _insert(conn, tool_pauses).values(tool=tool, until=until, reason=reason, updated_at=now)
    longer = sa.case(
        (stmt.excluded.until > tool_pauses.c.until, stmt.excluded.until), else_=tool_pauses.c.until
    )
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["tool"],
            set_={"until": longer, "reason": reason, "updated_at": now},
        )
    )


# --- steps: transitions ---------------------------------------------------------------------


async def insert_steps(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> list[StepRow]:
    """Insert a task's steps (all `blocked`); returns them with their keys."""
    result = await conn.execute(steps.insert().returning(*steps.c), list(rows))
    return sorted((StepRow.from_mapping(r) for r in result.mappings()), key=lambda s: s.position)


def _transition_event(change: StepChange, *, attempt: int, now: datetime) -> NewEvent:
    return NewEvent(
        task_id=change.step.task_id,
        step_id=change.step.step_id,
        kind=change.transition.value,
        from_status=change.step.status,
        to_status=target(change.transition),
        attempt=attempt,
        data=dict(change.event_data) if change.event_data else None,
        created_at=now,
    )


async def change_step(conn: AsyncConnection, change: StepChange, *, now: datetime) -> bool:
    """Apply one transition as a compare-and-set on (status, attempt) and record its event.

    Returns False, writing nothing, when the step is no longer in the state it was read in (a
    concurrent transition won, or the result is from an older attempt).
    """
    return bool(await change_steps(conn, [change], now=now))


async def change_steps(
    conn: AsyncConnection, changes: Sequence[StepChange], *, now: datetime
) -> set[int]:
    """Apply many transitions, each a compare-and-set on (status, attempt), with their events.

    Returns the keys of the steps that moved; a step missing from it had already moved on (a
    concurrent transition won, or the result is from an older attempt) and nothing was written
    for it. On Postgres each group of like changes is one statement; SQLite takes them one by one.
    """
    for change in changes:
        apply(change.step.status, change.transition)  # raises IllegalTransitionError
    if not changes:
        return set()
    if conn.dialect.name == "postgresql":
        moved = await _change_steps_set_based(conn, changes, now=now)
    else:
        moved = {}
        for change in changes:
            moved.update(await _change_one(conn, change, now=now))
    await append_events(
        conn,
        [
            _transition_event(c, attempt=moved[c.step.id], now=now)
            for c in changes
            if c.step.id in moved
        ],
    )
    return set(moved)


async def _change_one(
    conn: AsyncConnection, change: StepChange, *, now: datetime
) -> dict[int, int]:
    step = change.step
    stmt = (
        sa.update(steps)
        .where(
            steps.c.id == step.id, steps.c.status == step.status, steps.c.attempt == step.attempt
        )
        .values(status=target(change.transition), updated_at=now, **dict(change.values))
        .returning(steps.c.id, steps.c.attempt)
    )
    return {r[0]: r[1] for r in (await conn.execute(stmt)).all()}


def _sql_type(column: sa.Column[Any]) -> str:
    kind = column.type
    if isinstance(kind, UtcDateTime):
        return "timestamptz"
    if isinstance(kind, sa.Integer):
        return "bigint"
    if isinstance(kind, sa.Boolean):
        return "boolean"
    if isinstance(kind, sa.String | sa.Text):
        return "text"
    return "jsonb"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot store {type(value).__name__}")


async def _change_steps_set_based(
    conn: AsyncConnection, changes: Sequence[StepChange], *, now: datetime
) -> dict[int, int]:
    """UPDATE … FROM jsonb_to_recordset(:rows): one statement per set of columns changed."""
    groups: dict[tuple[str, ...], list[StepChange]] = {}
    for change in changes:
        groups.setdefault(tuple(sorted(change.values)), []).append(change)
    moved: dict[int, int] = {}
    for columns, group in groups.items():
        fields = ", ".join(f"{c} {_sql_type(steps.c[c])}" for c in columns)
        sets = "".join(f", {c} = v.{c}" for c in columns)
        sql = sa.text(
            "UPDATE steps AS s SET status = v.new_status, updated_at = :now"
            + sets
            + " FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS v(id bigint, seen_status text,"
            " seen_attempt bigint, new_status text" + (", " + fields if fields else "") + ")"
            " WHERE s.id = v.id AND s.status = v.seen_status AND s.attempt = v.seen_attempt"
            " RETURNING s.id, s.attempt"
        ).bindparams(sa.bindparam("now", type_=UtcDateTime()))
        rows = [
            {
                "id": c.step.id,
                "seen_status": c.step.status.value,
                "seen_attempt": c.step.attempt,
                "new_status": target(c.transition).value,
                **c.values,
            }
            for c in group
        ]
        payload = json.dumps(rows, default=_json_default, separators=(",", ":"))
        result = await conn.execute(sql, {"rows": payload, "now": now})
        moved.update({r[0]: r[1] for r in result.all()})
    return moved


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimInput:
    executor_id: str
    connectors: Sequence[str]
    limit: int
    now: datetime
    lease_expires_at: datetime


# Fair order on Postgres in one statement. `owners` walks the distinct tenants with queued
# steps through the fair index (a loose index scan: one probe per tenant, however long their
# queues); each then gives its first `limit` due steps (LATERAL, same index); the outer query
# deals them out: priority first, then one step per tenant in turn, oldest first.
_FAIR_ORDER = sa.text(
    """
WITH RECURSIVE owners(p) AS (
    (SELECT tenant FROM steps WHERE status = 'ready' ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT tenant FROM steps
            WHERE status = 'ready' AND tenant > owners.p ORDER BY tenant LIMIT 1)
    FROM owners WHERE owners.p IS NOT NULL
)
SELECT q.id FROM (
    SELECT s.id, s.priority,
           row_number() OVER (PARTITION BY o.p ORDER BY s.priority DESC, s.id) AS turn
    FROM owners o, LATERAL (
        SELECT id, priority FROM steps
        WHERE status = 'ready' AND tenant = o.p
          AND connector = ANY(:connectors) AND tool <> ALL(:skip)
          AND tool || ':' || coalesce(concurrency_key, '') <> ALL(:skip_keys)
          AND (not_before IS NULL OR not_before <= :now)
        ORDER BY priority DESC, id
        LIMIT :limit
    ) s
    WHERE o.p IS NOT NULL
) q
ORDER BY q.priority DESC, q.turn, q.id
LIMIT :limit
"""
).bindparams(
    sa.bindparam("connectors", type_=postgresql.ARRAY(sa.String())),
    sa.bindparam("skip", type_=postgresql.ARRAY(sa.String())),
    sa.bindparam("skip_keys", type_=postgresql.ARRAY(sa.String())),
    sa.bindparam("now", type_=UtcDateTime()),
)


def held_key(tool: str, key: str | None) -> str:
    """How `fair_order` names one key value of a tool (a `skip_keys` entry)."""
    return f"{tool}:{key or ''}"


async def fair_order(
    conn: AsyncConnection,
    claim: ClaimInput,
    *,
    skip_tools: Sequence[str] = (),
    skip_keys: Sequence[str] = (),
) -> list[int]:
    """Up to `limit` due ready steps in dispatch order, not yet locked.

    Higher priority first; within a priority, tenants take turns, each oldest first, so
    one tenant's burst of thousands of steps does not starve another's single step.
    """
    if conn.dialect.name == "postgresql":
        rows = await conn.execute(
            _FAIR_ORDER,
            {
                "connectors": list(claim.connectors),
                "skip": list(skip_tools),
                "skip_keys": list(skip_keys),
                "now": claim.now,
                "limit": claim.limit,
            },
        )
        return [key for (key,) in rows.all()]
    turn = sa.func.row_number().over(
        partition_by=steps.c.tenant, order_by=(steps.c.priority.desc(), steps.c.id)
    )
    due = (
        sa.select(steps.c.id, steps.c.priority, turn.label("turn"))
        .where(
            steps.c.status.in_(sources(Transition.LEASE)),
            steps.c.connector.in_(list(claim.connectors)),
            sa.or_(steps.c.not_before.is_(None), steps.c.not_before <= claim.now),
            steps.c.tool.not_in(list(skip_tools)),
            (steps.c.tool + ":" + sa.func.coalesce(steps.c.concurrency_key, "")).not_in(
                list(skip_keys)
            ),
        )
        .subquery()
    )
    rows = await conn.execute(
        sa.select(due.c.id).order_by(due.c.priority.desc(), due.c.turn, due.c.id).limit(claim.limit)
    )
    return [key for (key,) in rows.all()]


def _lockable(keys: Sequence[int]) -> sa.Select[tuple[int]]:
    """These steps if still queued, locked; rows another claimer holds are skipped."""
    return (
        sa.select(steps.c.id)
        .where(steps.c.id.in_(list(keys)), steps.c.status.in_(sources(Transition.LEASE)))
        .with_for_update(skip_locked=True)
    )


async def claim_ready(conn: AsyncConnection, claim: ClaimInput) -> list[StepRow]:
    """Lease up to `limit` due ready steps to an executor, in fair order.

    The fast path, for connectors whose tools have no concurrency cap, breaker or rate limit.
    """
    keys = await fair_order(conn, claim)
    if not keys:
        return []
    # Materialized: an IN (SELECT … SKIP LOCKED) subquery may be evaluated more than once by
    # the planner and lease rows it did not lock.
    picked = _lockable(keys).cte("picked").prefix_with("MATERIALIZED")
    return await _lease(conn, steps.c.id == picked.c.id, claim)


@dataclass(frozen=True, slots=True)
class Candidate:
    key: int
    tool: str
    rate_key: str | None
    concurrency_key: str | None


async def pick_ready(
    conn: AsyncConnection,
    claim: ClaimInput,
    *,
    skip_tools: Sequence[str] = (),
    skip_keys: Sequence[str] = (),
) -> list[Candidate]:
    """Due ready steps to consider for a lease, in fair order, locked until the transaction ends."""
    keys = await fair_order(conn, claim, skip_tools=skip_tools, skip_keys=skip_keys)
    if not keys:
        return []
    query = _lockable(keys).add_columns(steps.c.tool, steps.c.rate_key, steps.c.concurrency_key)
    found = {row[0]: Candidate(*row) for row in (await conn.execute(query)).all()}
    return [found[key] for key in keys if key in found]


async def lease_steps(
    conn: AsyncConnection, keys: Sequence[int], claim: ClaimInput
) -> list[StepRow]:
    """Lease these picked steps."""
    return await _lease(conn, steps.c.id.in_(list(keys)), claim) if keys else []


async def defer_steps(conn: AsyncConnection, due: Mapping[int, datetime]) -> None:
    """Push picked ready steps back in the queue until their time (a durable wait, no event)."""
    if not due:
        return
    await conn.execute(
        sa.update(steps)
        .where(steps.c.id == sa.bindparam("key"), steps.c.status == StepStatus.READY)
        .values(not_before=sa.bindparam("due")),
        [{"key": key, "due": when} for key, when in due.items()],
    )


async def room(
    conn: AsyncConnection, concurrency: Mapping[str, int], per_key: Mapping[str, int]
) -> tuple[dict[str, int], dict[str, int]]:
    """Free slots per capped tool, and per key value (`held_key`) of tools capped per key.

    Counted under each tool's advisory lock (taken in name order, transaction-scoped), so two
    replicas never both see room for the same last slot.
    """
    await _lock_caps(conn, sorted({*concurrency, *per_key}))
    free = await _free_per_tool(conn, concurrency)
    if not per_key:
        return free, {}
    rows = await conn.execute(
        sa.select(steps.c.tool, steps.c.concurrency_key, sa.func.count())
        .where(steps.c.status == StepStatus.RUNNING, steps.c.tool.in_(list(per_key)))
        .group_by(steps.c.tool, steps.c.concurrency_key)
    )
    free_keys = {held_key(tool, key): per_key[tool] - int(n) for tool, key, n in rows.all()}
    return free, free_keys


async def _lock_caps(conn: AsyncConnection, tools: Sequence[str]) -> None:
    if conn.dialect.name == "postgresql":
        for tool in tools:
            await conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext(:key))"),
                {"key": f"agent_reach:v1:concurrency:{tool}"},
            )


async def _free_per_tool(conn: AsyncConnection, concurrency: Mapping[str, int]) -> dict[str, int]:
    tools = sorted(concurrency)
    if not tools:
        return {}
    rows = await conn.execute(
        sa.select(steps.c.tool, sa.func.count())
        .where(steps.c.status == StepStatus.RUNNING, steps.c.tool.in_(tools))
        .group_by(steps.c.tool)
    )
    running = {tool: int(count) for tool, count in rows.all()}
    return {tool: concurrency[tool] - running.get(tool, 0) for tool in tools}


async def _lease(
    conn: AsyncConnection, which: sa.ColumnElement[bool], claim: ClaimInput
) -> list[StepRow]:
    stmt = (
        sa.update(steps)
        .where(which, steps.c.status.in_(sources(Transition.LEASE)))
        .values(
            status=target(Transition.LEASE),
            lease_owner=claim.executor_id,
            lease_expires_at=claim.lease_expires_at,
            started_at=sa.func.coalesce(steps.c.started_at, claim.now),
            updated_at=claim.now,
        )
        .returning(*steps.c)
    )
    claimed = [StepRow.from_mapping(r) for r in (await conn.execute(stmt)).mappings()]
    await append_events(
        conn,
        [
            NewEvent(
                task_id=s.task_id,
                step_id=s.step_id,
                kind=Transition.LEASE.value,
                from_status=StepStatus.READY,
                to_status=s.status,
                attempt=s.attempt,
                data={"executor_id": claim.executor_id},
                created_at=claim.now,
            )
            for s in claimed
        ],
    )
    return claimed


async def queued_steps_of(conn: AsyncConnection, tools: Sequence[str], *, limit: int) -> list[int]:
    """Queued (ready) steps of these tools, oldest first."""
    rows = await conn.execute(
        sa.select(steps.c.id)
        .where(steps.c.status == StepStatus.READY, steps.c.tool.in_(list(tools)))
        .order_by(steps.c.id)
        .limit(limit)
    )
    return [key for (key,) in rows.all()]


async def overdue_approvals(conn: AsyncConnection, *, now: datetime, limit: int) -> list[int]:
    """Steps still waiting for a decision past their `decide_by` (the sweep's partial index)."""
    rows = await conn.execute(
        sa.select(steps.c.id)
        .where(
            steps.c.status == StepStatus.AWAITING_APPROVAL,
            steps.c.decide_by.is_not(None),
            steps.c.decide_by < now,
        )
        .order_by(steps.c.decide_by)
        .limit(limit)
    )
    return [key for (key,) in rows.all()]


async def unstarted_steps(conn: AsyncConnection, *, now: datetime, limit: int) -> list[int]:
    """Queued steps past their `start_by`, oldest first (the sweep's partial index)."""
    rows = await conn.execute(
        sa.select(steps.c.id)
        .where(
            steps.c.status == StepStatus.READY,
            steps.c.start_by.is_not(None),
            steps.c.start_by < now,
        )
        .order_by(steps.c.start_by)
        .limit(limit)
    )
    return [key for (key,) in rows.all()]


async def expired_leases(conn: AsyncConnection, *, now: datetime, limit: int) -> list[StepRow]:
    """Running steps whose lease has expired, locked against other reapers."""
    stmt = (
        sa.select(steps)
        .where(steps.c.status == StepStatus.RUNNING, steps.c.lease_expires_at < now)
        .order_by(steps.c.lease_expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [StepRow.from_mapping(r) for r in (await conn.execute(stmt)).mappings()]


async def extend_leases(
    conn: AsyncConnection,
    *,
    executor_id: str,
    leases: Sequence[tuple[int, int]],
    expires_at: datetime,
) -> set[tuple[int, int]]:
    """Extend the leases still held by this executor; returns the (key, attempt) pairs extended."""
    if not leases:
        return set()
    stmt = (
        sa.update(steps)
        .where(
            sa.tuple_(steps.c.id, steps.c.attempt).in_(list(leases)),
            steps.c.status == StepStatus.RUNNING,
            steps.c.lease_owner == executor_id,
        )
        .values(lease_expires_at=expires_at)
        .returning(steps.c.id, steps.c.attempt)
    )
    return {(r[0], r[1]) for r in (await conn.execute(stmt)).all()}


# --- tasks ----------------------------------------------------------------------------------


async def insert_task(conn: AsyncConnection, row: dict[str, Any]) -> None:
    await conn.execute(tasks.insert().values(**row))


async def load_task(conn: AsyncConnection, task_id: str) -> TaskRow | None:
    row = (await conn.execute(sa.select(tasks).where(tasks.c.task_id == task_id))).mappings()
    first = row.first()
    return TaskRow.from_mapping(first) if first else None


async def load_tasks(conn: AsyncConnection, task_ids: Iterable[str]) -> dict[str, TaskRow]:
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    rows = await conn.execute(sa.select(tasks).where(tasks.c.task_id.in_(ids)))
    return {r["task_id"]: TaskRow.from_mapping(r) for r in rows.mappings()}


async def list_tasks(
    conn: AsyncConnection, *, tenant: str, status: str | None, before: str | None, limit: int
) -> list[TaskRow]:
    """A tenant's tasks, newest first; `before` is the last task id of the previous page."""
    stmt = (
        sa.select(tasks)
        .where(tasks.c.tenant == tenant)
        .order_by(tasks.c.task_id.desc())
        .limit(limit)
    )
    if status is not None:
        stmt = stmt.where(tasks.c.status == status)
    if before is not None:
        stmt = stmt.where(tasks.c.task_id < before)
    return [TaskRow.from_mapping(r) for r in (await conn.execute(stmt)).mappings()]


async def unfinished_tasks(
    conn: AsyncConnection, tenant: str, principal: str, *, up_to: int
) -> int:
    """A caller's pending or running tasks, counted up to `up_to` (newest first, by index)."""
    mine = (
        sa.select(tasks.c.task_id)
        .where(
            tasks.c.tenant == tenant,
            tasks.c.principal == principal,
            tasks.c.status.in_([TaskStatus.PENDING, TaskStatus.RUNNING]),
        )
        .limit(up_to)
        .subquery()
    )
    return int((await conn.execute(sa.select(sa.func.count()).select_from(mine))).scalar_one())


async def set_task_status(
    conn: AsyncConnection, task: TaskRow, status: TaskStatus, *, now: datetime
) -> bool:
    """Optimistic-locked status change of a task, with its event."""
    finished = (
        now if status in (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED) else None
    )
    stmt = (
        sa.update(tasks)
        .where(tasks.c.task_id == task.task_id, tasks.c.version == task.version)
        .values(status=status, version=task.version + 1, updated_at=now, finished_at=finished)
    )
    if (await conn.execute(stmt)).rowcount != 1:
        return False
    await append_events(
        conn,
        [
            NewEvent(
                task_id=task.task_id,
                kind="task_status",
                from_status=task.status,
                to_status=status,
                created_at=now,
            )
        ],
    )
    return True


async def mark_tasks_running(
    conn: AsyncConnection, task_ids: Iterable[str], *, now: datetime
) -> None:
    """`pending` → `running` once a first step is leased, inside the claim's transaction.

    Task rows locked by an advance are skipped, never waited for (the claim holds step locks, and
    locks go task first everywhere else); that advance settles the status itself.
    """
    pending = (
        sa.select(tasks.c.task_id)
        .where(tasks.c.task_id.in_(sorted(set(task_ids))), tasks.c.status == TaskStatus.PENDING)
        .with_for_update(skip_locked=True)
    )
    rows = await conn.execute(
        sa.update(tasks)
        .where(tasks.c.task_id.in_(pending.scalar_subquery()))
        .values(status=TaskStatus.RUNNING, version=tasks.c.version + 1, updated_at=now)
        .returning(tasks.c.task_id)
    )
    await append_events(
        conn,
        [
            NewEvent(
                task_id=task_id,
                kind="task_status",
                from_status=TaskStatus.PENDING,
                to_status=TaskStatus.RUNNING,
                created_at=now,
            )
            for (task_id,) in rows.all()
        ],
    )


async def overdue_tasks(
    conn: AsyncConnection, *, now: datetime, limit: int
) -> list[tuple[str, datetime]]:
    """Unfinished tasks whose deadline has passed, earliest first: (task_id, deadline)."""
    rows = await conn.execute(
        sa.select(tasks.c.task_id, tasks.c.deadline)
        .where(
            tasks.c.deadline.is_not(None),
            tasks.c.deadline < now,
            tasks.c.status.in_([TaskStatus.PENDING, TaskStatus.RUNNING]),
        )
        .order_by(tasks.c.deadline)
        .limit(limit)
    )
    return [(r[0], r[1]) for r in rows.all()]


async def request_cancel(conn: AsyncConnection, task_id: str, *, now: datetime) -> None:
    await conn.execute(
        sa.update(tasks)
        .where(tasks.c.task_id == task_id)
        .values(cancel_requested=True, updated_at=now)
    )


async def lock_tasks(conn: AsyncConnection, task_ids: Iterable[str]) -> None:
    """Serialise advancement of these tasks between replicas (row locks, in id order)."""
    ids = sorted(set(task_ids))
    if ids:
        await conn.execute(
            sa.select(tasks.c.task_id)
            .where(tasks.c.task_id.in_(ids))
            .order_by(tasks.c.task_id)
            .with_for_update()
        )


async def lock_tasks_of_steps(conn: AsyncConnection, keys: Iterable[int]) -> list[str]:
    """Lock the tasks these steps belong to (in id order, like lock_tasks); returns their ids."""
    wanted = sorted(set(keys))
    if not wanted:
        return []
    owners = sa.select(steps.c.task_id).where(steps.c.id.in_(wanted))
    rows = await conn.execute(
        sa.select(tasks.c.task_id)
        .where(tasks.c.task_id.in_(owners))
        .order_by(tasks.c.task_id)
        .with_for_update()
    )
    return [r[0] for r in rows.all()]


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


# --- idempotency and tools ------------------------------------------------------------------


async def claim_idempotency_key(conn: AsyncConnection, row: dict[str, Any]) -> tuple[str, str]:
    """Record (principal, key) → task; returns the (request_hash, task_id) stored for the key.

    A concurrent submit with the same key waits on the unique index and then sees the first
    one's record, so exactly one task is created per key.
    """
    await conn.execute(
        _insert(conn, idempotency_keys)
        .values(**row)
        .on_conflict_do_nothing(index_elements=["principal", "key"])
    )
    stored = (
        await conn.execute(
            sa.select(idempotency_keys.c.request_hash, idempotency_keys.c.task_id).where(
                idempotency_keys.c.principal == row["principal"],
                idempotency_keys.c.key == row["key"],
            )
        )
    ).one()
    return stored[0], stored[1]


def _insert(conn: AsyncConnection, table: sa.Table) -> Any:
    """INSERT with ON CONFLICT support in the connection's dialect."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


async def save_tool_versions(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Store tool definitions by (name, version); existing versions are immutable."""
    if not rows:
        return
    await conn.execute(
        _insert(conn, tools).on_conflict_do_nothing(index_elements=["name", "version"]), list(rows)
    )


async def load_tool_version(
    conn: AsyncConnection, name: str, version: str
) -> dict[str, Any] | None:
    row = await conn.execute(
        sa.select(tools.c.spec).where(tools.c.name == name, tools.c.version == version)
    )
    spec: dict[str, Any] | None = row.scalar_one_or_none()
    return spec
