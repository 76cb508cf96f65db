"""SQL of steps: reads, and transitions, each a guarded compare-and-set.

Each table has its module: tasks in `tasks.py`, the event log in `events.py`, Idempotency-Keys
in `idempotency.py`, task row locks in `locks.py`. Leasing lives in `claims.py`, where an
advance's transitions go in `advance_writes.py`, the flow-control rows (breakers, rate buckets,
pauses) in `flow.py`, and the read-only lists (tasks by filter, the approvals inbox) in
`listings.py`.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from psycopg import AsyncConnection as PgConnection
from psycopg import AsyncCursor
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus, apply, target
from agent_reach_controller.domain.records import QueuedGroup, StepChange, StepRow, TaskRow
from agent_reach_controller.storage import hot, schema
from agent_reach_controller.storage.commit import json_rows
from agent_reach_controller.storage.engine import (
    TX_STATE_PREFIX,
    Connection,
    before_commit,
    commit_statement,
    prepare,
    round_trip,
)
from agent_reach_controller.storage.events import NewEvent, append_events
from agent_reach_controller.storage.schema import UtcDateTime, steps
from agent_reach_controller.storage.tasks import TASKS_BY_ID, load_tasks

# What an advance of some tasks reads, read right after their steps last changed.
_READ_AHEAD = f"{TX_STATE_PREFIX}read_ahead"
# Changes to write with the commit (`change_steps_at_commit`): [(groups, now, refusal)].
_AT_COMMIT = f"{TX_STATE_PREFIX}changes_at_commit"

# One statement's changes: (the columns set besides the status, as (name, SQL type)), the rows
# as a JSON array, how many rows).
_Group = tuple[tuple[tuple[str, str], ...], str, int]


class StepMovedError(Exception):
    """A change written with the commit found its step no longer as it was read: nothing of the
    transaction was written."""


async def load_steps(conn: AsyncConnection, task_ids: Iterable[str]) -> list[StepRow]:
    ids = sorted(set(task_ids))
    if not ids:
        return []
    rows = await conn.execute(
        sa.select(steps).where(steps.c.task_id.in_(ids)).order_by(steps.c.task_id, steps.c.position)
    )
    return [StepRow.from_mapping(r) for r in rows.mappings()]


async def add_steps(conn: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> list[StepRow]:
    """Insert steps into a task that exists (an agent run's round growing its tool calls), now:
    the advance that follows in the same transaction reads them."""
    conn.info.pop(_READ_AHEAD, None)  # what an advance read ahead lacks these
    added = []
    for row in rows:  # one by one: SQLite's executemany returns no rows
        inserted = await conn.execute(sa.insert(steps).values(**row).returning(*steps.c))
        added.append(StepRow.from_mapping(inserted.mappings().one()))
    return added


@functools.lru_cache(maxsize=64)
def change_steps_sql(fields: tuple[tuple[str, str], ...]) -> str:
    """Guarded transitions of many steps from a JSON array of rows: one text per set of columns
    set besides the status (`fields` as (column, SQL type) pairs)."""
    declared = "".join(f", {name} {kind}" for name, kind in fields)
    sets = "".join(f", {name} = v.{name}" for name, _ in fields)
    return (
        "UPDATE steps AS s SET status = v.new_status, updated_at = %(now)s"
        + sets
        + " FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(id bigint, seen_status text,"
        " seen_attempt bigint, new_status text" + declared + ")"
        " WHERE s.id = v.id AND s.status = v.seen_status AND s.attempt = v.seen_attempt"
        f" AND s.id = ANY({hot.keys_of('id', 'bigint')})"
        " RETURNING s.id, s.attempt"
    )


@functools.lru_cache(maxsize=64)
def change_steps_at_commit_sql(fields: tuple[tuple[str, str], ...]) -> str:
    """`change_steps_sql` as a part of the commit statement, guarded on how many rows it moves
    (`%(expected)s`)."""
    return change_steps_sql(fields).replace(
        "RETURNING s.id, s.attempt", "RETURNING %(expected)s::int AS expected"
    )


async def _change_steps_postgres(
    conn: Connection,
    groups: Sequence[_Group],
    *,
    now: Any,
    advance_of: Sequence[str] = (),
) -> tuple[dict[int, int], tuple[list[dict[str, Any]], list[tuple[Any, ...]]] | None]:
    """Run `change_steps_sql(fields)` over each group's JSON array of rows, in one round trip;
    ({step key: attempt} moved, and, for the tasks `advance_of`, what their advance reads once
    the changes are made: the advanceable steps and the status counts, read in the same trip).

    Changes waiting for the commit (`change_steps_at_commit`) go first, in the same round trip:
    a step they did not move raises their refusal (`StepMovedError` unless they named another)."""
    waiting: list[tuple[Sequence[_Group], Any, Any]] = conn.info.pop(_AT_COMMIT, [])
    many = len(groups) + sum(len(g) for g, _, _ in waiting) > 1
    async with round_trip(conn, pipeline=many or bool(advance_of)) as pg:
        certain = [
            (*await _send(pg, group, when), moved)
            for earlier, when, moved in waiting
            for group in earlier
        ]
        sent = [await _send(pg, group, now) for group in groups]
        ahead = await _send_advance_reads(pg, advance_of) if advance_of else None
    for cur, expected, moved in certain:
        if len(await cur.fetchall()) != expected:
            raise moved()
    moved = {key: attempt for cur, _ in sent for key, attempt in await cur.fetchall()}
    return moved, (await _advance_rows(*ahead) if ahead else None)


async def _send(pg: PgConnection[Any], group: _Group, now: Any) -> tuple[AsyncCursor[Any], int]:
    """Send one group's changes; (its cursor, how many rows it changes if none has moved)."""
    fields, rows, count = group
    cur = pg.cursor()
    await cur.execute(change_steps_sql(fields), {"rows": rows, "now": now}, prepare=prepare(pg))
    return cur, count


async def _send_advance_reads(
    pg: PgConnection[Any], ids: Sequence[str]
) -> tuple[AsyncCursor[Any], AsyncCursor[Any]]:
    """Send what an advance of these tasks reads: their advanceable steps, their status counts."""
    params = {"ids": list(ids)}
    steps, counts = pg.cursor(row_factory=dict_row), pg.cursor()
    await steps.execute(ADVANCEABLE_STEPS, params, prepare=prepare(pg))
    await counts.execute(STATUS_COUNTS, params, prepare=prepare(pg))
    return steps, counts


async def _advance_rows(
    steps: AsyncCursor[Any], counts: AsyncCursor[Any]
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    return [hot.utc(r) for r in await steps.fetchall()], await counts.fetchall()


# Reads of the report and claim paths: whole rows by key, and what an advance needs.
STEPS_BY_KEY = f"SELECT {hot.STEP_COLUMNS} FROM steps WHERE id = ANY(%(keys)s::bigint[])"


# Whole rows by key read under their tasks' locks (`locks.locked_reads`), each saying whether
# every step of its task is among the keys (`whole`): exact under the lock, which every insert
# of a task's steps holds (or comes before the task is visible). A task read whole is then
# advanced on those rows. `NOT EXISTS` stops at the first step left out: a plan of 100 steps
# reported a few at a time costs an index probe or two per step, not a count of its 100.
LOCKED_STEPS_BY_KEY = f"""
SELECT {hot.columns(schema.steps, "s.")},
       NOT EXISTS (
           SELECT 1 FROM steps AS o
           WHERE o.task_id = s.task_id AND o.id <> ALL(%(keys)s::bigint[])
       ) AS whole
FROM steps AS s WHERE s.id = ANY(%(keys)s::bigint[])
"""


BLOCKED_STEPS = f"""
SELECT {hot.STEP_COLUMNS} FROM steps WHERE task_id = ANY(%(ids)s::text[]) AND status = 'blocked'
ORDER BY task_id, position
"""


STEPS_BY_NAME = f"""
SELECT {hot.columns(schema.steps, "s.")} FROM steps AS s
JOIN unnest(%(task_ids)s::text[], %(step_ids)s::text[]) AS n(task_id, step_id)
  ON s.task_id = n.task_id AND s.step_id = n.step_id
"""


STATUS_COUNTS = """
SELECT task_id, status, count(*) FROM steps WHERE task_id = ANY(%(ids)s::text[])
GROUP BY task_id, status
"""


# The steps an advance needs: the blocked ones and those they depend on, in task order.
ADVANCEABLE_STEPS = f"""
WITH b AS (
    SELECT {hot.STEP_COLUMNS} FROM steps WHERE task_id = ANY(%(ids)s::text[]) AND status = 'blocked'
)
SELECT * FROM b
UNION ALL
SELECT {hot.columns(schema.steps, "s.")} FROM steps AS s
WHERE (s.task_id, s.step_id) IN (
    SELECT b.task_id, d.step_id FROM b, jsonb_array_elements_text(b.depends_on) AS d(step_id)
) AND s.status <> 'blocked'
ORDER BY task_id, position
"""


async def advance_reads(
    conn: Connection, ids: Sequence[str], *, with_tasks: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[Any, ...]]]:
    """(task rows, advanceable step rows, status counts) of these tasks, in one round trip."""
    async with round_trip(conn, pipeline=True) as pg:
        task_rows = pg.cursor(row_factory=dict_row)
        if with_tasks:
            await task_rows.execute(TASKS_BY_ID, {"ids": list(ids)}, prepare=prepare(pg))
        sent = await _send_advance_reads(pg, ids)
    found = [hot.utc(r) for r in await task_rows.fetchall()] if with_tasks else []
    return found, *await _advance_rows(*sent)


async def load_for_advance(
    conn: AsyncConnection, task_ids: Iterable[str], *, with_tasks: bool = True
) -> tuple[dict[str, TaskRow], list[StepRow], dict[str, Counter[StepStatus]]]:
    """What an advance of these tasks reads: the task rows (unless `with_tasks` is false), the
    blocked steps with every step they depend on, and the status counts. One round trip on
    Postgres."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}, [], {}
    if conn.dialect.name != "postgresql":
        tasks = await load_tasks(conn, ids) if with_tasks else {}
        return tasks, await load_advanceable_steps(conn, ids), await status_counts(conn, ids)
    ahead = conn.info.pop(_READ_AHEAD, None)
    task_rows: list[dict[str, Any]]
    if not with_tasks and ahead is not None and ahead[0] == ids:
        task_rows, step_rows, count_rows = [], ahead[1], ahead[2]
    else:
        task_rows, step_rows, count_rows = await advance_reads(conn, ids, with_tasks=with_tasks)
    counts: dict[str, Counter[StepStatus]] = {}
    for task_id, status, count in count_rows:
        counts.setdefault(task_id, Counter())[StepStatus(status)] = int(count)
    return (
        {r["task_id"]: TaskRow.from_mapping(r) for r in task_rows},
        [StepRow.from_mapping(r) for r in step_rows],
        counts,
    )


async def load_advanceable_steps(conn: AsyncConnection, task_ids: Iterable[str]) -> list[StepRow]:
    """The blocked steps of these tasks and every step they depend on."""
    ids = sorted(set(task_ids))
    if not ids:
        return []
    pg = conn.dialect.name == "postgresql"
    found: Iterable[Mapping[Any, Any]]
    if pg:
        found = await hot.rows(conn, BLOCKED_STEPS, {"ids": ids})
    else:
        found = (
            await conn.execute(
                sa.select(steps)
                .where(steps.c.task_id.in_(ids), steps.c.status == StepStatus.BLOCKED)
                .order_by(steps.c.task_id, steps.c.position)
            )
        ).mappings()
    blocked = [StepRow.from_mapping(r) for r in found]
    if not blocked:
        return []
    have = {(s.task_id, s.step_id) for s in blocked}
    needed = sorted({(s.task_id, d) for s in blocked for d in s.depends_on} - have)
    if not needed:
        return blocked
    if pg:
        names = {"task_ids": [t for t, _ in needed], "step_ids": [s for _, s in needed]}
        found = await hot.rows(conn, STEPS_BY_NAME, names)
    else:
        found = (
            await conn.execute(
                sa.select(steps).where(sa.tuple_(steps.c.task_id, steps.c.step_id).in_(needed))
            )
        ).mappings()
    return sorted(
        [*blocked, *(StepRow.from_mapping(r) for r in found)],
        key=lambda s: (s.task_id, s.position),
    )


async def status_counts(
    conn: AsyncConnection, task_ids: Iterable[str]
) -> dict[str, Counter[StepStatus]]:
    """How many steps of each task are in each state."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    found: Iterable[Sequence[Any]]
    if conn.dialect.name == "postgresql":
        found = await hot.tuples(conn, STATUS_COUNTS, {"ids": ids})
    else:
        found = (
            await conn.execute(
                sa.select(steps.c.task_id, steps.c.status, sa.func.count())
                .where(steps.c.task_id.in_(ids))
                .group_by(steps.c.task_id, steps.c.status)
            )
        ).all()
    counts: dict[str, Counter[StepStatus]] = {}
    for task_id, status, count in found:
        counts.setdefault(task_id, Counter())[StepStatus(status)] = int(count)
    return counts


async def load_steps_by_key(conn: AsyncConnection, keys: Iterable[int]) -> dict[int, StepRow]:
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    if conn.dialect.name == "postgresql":
        found = await hot.rows(conn, STEPS_BY_KEY, {"keys": wanted})
        return {r["id"]: StepRow.from_mapping(r) for r in found}
    rows = await conn.execute(sa.select(steps).where(steps.c.id.in_(wanted)))
    return {r["id"]: StepRow.from_mapping(r) for r in rows.mappings()}


async def queued_groups(conn: AsyncConnection, *, now: datetime) -> list[QueuedGroup]:
    """Steps waiting for an executor (ready, due or not) per tool, connector and tenant, in one
    grouped query: the queue's one read (admission, the gauges, each pool's demand).

    A due step became due at the later of its last change (queued) and its `not_before`
    (backoff, hold, rate limit); `oldest_due` is the earliest such time among the due ones.
    """
    nb, changed = steps.c.not_before, steps.c.updated_at
    due_at = sa.case((nb > changed, nb), else_=changed)
    is_due = sa.or_(nb.is_(None), nb <= now)
    oldest = sa.type_coerce(sa.func.min(sa.case((is_due, due_at))), UtcDateTime())
    rows = await conn.execute(
        sa.select(steps.c.tool, steps.c.connector, steps.c.tenant, sa.func.count(), oldest)
        .where(steps.c.status == StepStatus.READY)
        .group_by(steps.c.tool, steps.c.connector, steps.c.tenant)
    )
    return [
        QueuedGroup(tool=t, connector=c, tenant=tenant, depth=int(n), oldest_due=when)
        for t, c, tenant, n, when in rows.all()
    ]


def transition_event(change: StepChange, *, attempt: int, now: datetime) -> NewEvent:
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
    conn: AsyncConnection,
    changes: Sequence[StepChange],
    *,
    now: datetime,
    advance_of: Sequence[str] = (),
) -> set[int]:
    """Apply many transitions, each a compare-and-set on (status, attempt), with their events.

    Returns the keys of the steps that moved; a step missing from it had already moved on (a
    concurrent transition won, or the result is from an older attempt) and nothing was written
    for it. On Postgres each group of like changes is one statement, all in one round trip,
    which also reads what the advance of the tasks `advance_of` will need (`load_for_advance`
    uses it if nothing changed their steps since); SQLite takes them one by one.
    """
    for change in changes:
        apply(change.step.status, change.transition)  # raises IllegalTransitionError
    conn.info.pop(_READ_AHEAD, None)  # the steps change: what was read ahead is stale
    if not changes:
        return set()
    if conn.dialect.name == "postgresql":
        moved = await _change_steps_set_based(conn, changes, now=now, advance_of=advance_of)
    else:
        moved = {}
        for change in changes:
            moved.update(await _change_one(conn, change, now=now))
    await append_events(
        conn,
        [
            transition_event(c, attempt=moved[c.step.id], now=now)
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


async def _change_steps_set_based(
    conn: AsyncConnection,
    changes: Sequence[StepChange],
    *,
    now: datetime,
    advance_of: Sequence[str] = (),
) -> dict[int, int]:
    """UPDATE … FROM jsonb_to_recordset(:rows): one statement per set of columns changed, all in
    one round trip, with the reads of the advance of `advance_of` behind them (kept for
    `load_for_advance`)."""
    ids = sorted(set(advance_of))
    moved, ahead = await _change_steps_postgres(conn, _groups(changes), now=now, advance_of=ids)
    if ahead is not None:
        conn.info[_READ_AHEAD] = (ids, *ahead)
    return moved


def _groups(changes: Sequence[StepChange]) -> list[_Group]:
    """The changes by the columns they set: one statement's rows each."""
    by_columns: dict[tuple[str, ...], list[StepChange]] = {}
    for change in changes:
        by_columns.setdefault(tuple(sorted(change.values)), []).append(change)
    groups = []
    for columns, group in by_columns.items():
        fields = tuple((c, _sql_type(steps.c[c])) for c in columns)
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
        groups.append((fields, json_rows(rows), len(rows)))
    return groups


async def change_steps_at_commit(
    conn: AsyncConnection,
    changes: Sequence[StepChange],
    *,
    now: datetime,
    moved: Callable[[], Exception] = StepMovedError,
) -> set[int]:
    """Apply transitions none of which can lose, with their events; returns their steps' keys.

    A change cannot lose when its step was read under its task's lock in this transaction and
    not changed since: every transition of a step that is not `ready` holds that lock (a lease
    takes only ready steps). On Postgres they are then written with the commit, in its
    statement and as its guard, at no round trip of their own; if a step did move after all,
    nothing of the transaction is written and committing raises `moved()`. A change of
    steps in the same transaction sends them first (`change_steps`), as does
    `send_changes_at_commit` before a read that must see them.
    """
    if conn.dialect.name != "postgresql" or not changes:
        return await change_steps(conn, changes, now=now)
    for change in changes:
        apply(change.step.status, change.transition)  # raises IllegalTransitionError
    conn.info.pop(_READ_AHEAD, None)
    waiting: list[tuple[Sequence[_Group], datetime, Callable[[], Exception]]] | None = (
        conn.info.get(_AT_COMMIT)
    )
    if waiting is None:
        waiting = conn.info[_AT_COMMIT] = []
        before_commit(conn, _write_at_commit)
    waiting.append((_groups(changes), now, moved))
    await append_events(
        conn,
        [
            transition_event(c, attempt=c.values.get("attempt", c.step.attempt), now=now)
            for c in changes
        ],
    )
    return {c.step.id for c in changes}


async def send_changes_at_commit(conn: AsyncConnection) -> None:
    """Send now the changes waiting for the commit (`change_steps_at_commit`), before a read
    that must see them; `StepMovedError` if a step had moved."""
    if conn.info.get(_AT_COMMIT):
        await _change_steps_postgres(conn, [], now=None)


async def _write_at_commit(conn: AsyncConnection) -> None:
    statement = commit_statement(conn)
    for groups, now, moved in conn.info.pop(_AT_COMMIT, []):
        for fields, rows, count in groups:
            statement.expect(
                change_steps_at_commit_sql(fields),
                {"rows": rows, "now": now, "expected": count},
                holds="count(*) = coalesce(max(expected), -1)",
                refusal=moved,
            )


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


async def reschedule_step(
    conn: AsyncConnection,
    step: StepRow,
    *,
    run_at: datetime,
    not_before: datetime | None,
    start_by: datetime | None,
    now: datetime,
) -> bool:
    """Move a step that has not started to `run_at` (a guarded UPDATE: False, writing nothing,
    when the step moved on since it was read, e.g. an executor leased it)."""
    values: dict[str, Any] = {"run_at": run_at, "updated_at": now}
    if step.status == StepStatus.READY:
        values.update(not_before=not_before, start_by=start_by)
    changed = await conn.execute(
        sa.update(steps)
        .where(
            steps.c.id == step.id,
            steps.c.status == step.status,
            steps.c.attempt == step.attempt,
        )
        .values(**values)
    )
    return bool(changed.rowcount)
