"""The hot path's writes on Postgres: named statements sent through psycopg, prepared, pipelined.

SQLAlchemy spends about as much CPU building and binding a statement as Postgres spends running
it (~0.3-0.6 ms against ~0.1 ms for the same INSERT through psycopg), and a submit or a report is a
handful of such statements. The writes every task makes (its rows, its events, its audit entry,
its wake-ups) are therefore sent here as plain SQL on the transaction's own psycopg connection,
prepared once per connection, and queued in a pipeline so that they cost one round trip. SQLite
(embedded mode) keeps the SQLAlchemy statements beside each caller; the rows written are the same.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agent_reach_controller.storage import schema
from agent_reach_controller.storage.commit import json_rows
from agent_reach_controller.storage.engine import (
    Connection,
    closing_statement,
    commit_statement,
    prepare,
    queue_statement,
    round_trip,
)

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

# A transaction's unsealed audit entries (no seq, no hash: the sealer chains them later), in the
# order recorded.
INSERT_AUDIT_ENTRIES = """
INSERT INTO audit_log (at, actor, tenant, action, target, data)
SELECT e.at, e.actor, e.tenant, e.action, e.target, e.data
FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb) AS (
    at timestamptz, actor text, tenant text, action text, target text, data jsonb
)) WITH ORDINALITY AS e(at, actor, tenant, action, target, data, n)
ORDER BY e.n
"""

# A transaction's wake-ups, delivered by Postgres when (and only if) it commits.
NOTIFY = """
SELECT pg_notify(n->>0, n->>1) FROM jsonb_array_elements(%(messages)s::jsonb) AS n
"""

CATALOG_REVISION = "SELECT revision FROM catalog_state WHERE id = 1"
# Whether the catalogue is still at the revision a plan was validated against (a submit's guard).
FRESH_CATALOG = "SELECT revision = %(expected)s AS fresh FROM catalog_state WHERE id = 1"

# A new Idempotency-Key: no row back means another submit holds it.
CLAIM_IDEMPOTENCY_KEY = """
INSERT INTO idempotency_keys (principal, key, request_hash, task_id, created_at)
VALUES (%(principal)s, %(key)s, %(request_hash)s, %(task_id)s, %(created_at)s)
ON CONFLICT (principal, key) DO NOTHING
RETURNING task_id
"""

# Fair order: `owners` walks the distinct tenants with queued steps through the fair index (a
# loose index scan: one probe per tenant, however long their queues); each then gives its first
# `limit` due steps (LATERAL, same index); the outer query deals them out: priority first, then
# one step per tenant in turn, oldest first.
_OWNERS = """
    (SELECT tenant FROM steps WHERE status = 'ready' ORDER BY tenant LIMIT 1)
    UNION ALL
    SELECT (SELECT tenant FROM steps
            WHERE status = 'ready' AND tenant > owners.p ORDER BY tenant LIMIT 1)
    FROM owners WHERE owners.p IS NOT NULL
"""
_FAIR = """
    SELECT q.id FROM (
        SELECT s.id, s.priority,
               row_number() OVER (PARTITION BY o.p ORDER BY s.priority DESC, s.id) AS turn
        FROM owners o, LATERAL (
            SELECT id, priority FROM steps
            WHERE status = 'ready' AND tenant = o.p
              AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
              AND connector = ANY(%(connectors)s::text[]) AND tool <> ALL(%(skip)s::text[])
              AND tool || ':' || coalesce(concurrency_key, '') <> ALL(%(skip_keys)s::text[])
              AND (not_before IS NULL OR not_before <= %(now)s)
            ORDER BY priority DESC, id
            LIMIT %(limit)s
        ) s
        WHERE o.p IS NOT NULL
    ) q
    ORDER BY q.priority DESC, q.turn, q.id
    LIMIT %(limit)s
"""
FAIR_ORDER = f"WITH RECURSIVE owners(p) AS ({_OWNERS}){_FAIR}"


def _columns(table: sa.Table, alias: str = "") -> str:
    """The table's columns by name, never `*`: a prepared statement whose result would grow
    when a newer release's migration adds a column fails ("cached plan must not change result
    type") in every process still running the older code; named columns keep their plans."""
    return ", ".join(f"{alias}{c.name}" for c in table.c)


STEP_COLUMNS, TASK_COLUMNS = _columns(schema.steps), _columns(schema.tasks)


# The ungoverned claim in one statement: the fair order, the rows still queued locked (rows
# another claimer holds are skipped; MATERIALIZED, or the planner may evaluate the locking
# subquery twice and lease rows it did not lock), and the lease, taken only while the holder's
# session lives, the tasks it starts, and the events of both. Each row comes back with
# `queued_at`, the `updated_at` it had before the lease. Rows are found by key through
# `= ANY(ARRAY(…))`, never by a join the planner may run as a scan of every queued step: a
# database minutes old has no statistics yet, and that scan made a claim of 32 among 1,500 ready
# steps take 44 ms instead of 7.
_CLAIM = """
WITH RECURSIVE owners(p) AS ({owners}), fair AS ({fair}),{guard} picked AS MATERIALIZED (
    SELECT id AS step_key, updated_at AS queued_at FROM steps
    WHERE id = ANY(ARRAY(SELECT id FROM fair)) AND status = 'ready'{guarded}
    FOR UPDATE SKIP LOCKED
), leased AS (
    UPDATE steps SET status = 'running', lease_owner = %(owner)s,
        lease_expires_at = %(lease_expires_at)s, lease_seq = %(lease_seq)s,
        started_at = coalesce(steps.started_at, %(now)s), updated_at = %(now)s
    WHERE steps.id = ANY(ARRAY(SELECT step_key FROM picked)) AND steps.status = 'ready'
      AND (NOT %(session)s OR EXISTS (
          SELECT 1 FROM executor_sessions WHERE id = %(owner)s AND ended_at IS NULL))
    RETURNING {leased_columns}
), started AS (
    -- pending -> running for the tasks of the leased steps; rows an advance holds are skipped
    UPDATE tasks SET status = 'running', version = version + 1, updated_at = %(now)s
    WHERE task_id IN (
        SELECT task_id FROM tasks
        WHERE task_id = ANY(ARRAY(SELECT task_id FROM leased)) AND status = 'pending'
        FOR UPDATE SKIP LOCKED
    )
    RETURNING task_id
), recorded AS (
    -- the events of both, leases first, in the order leased
    INSERT INTO events (task_id, step_id, kind, from_status, to_status, attempt, data, created_at)
    SELECT e.task_id, e.step_id, e.kind, e.from_status, e.to_status, e.attempt, e.data, %(now)s
    FROM (
        SELECT task_id, step_id, 'lease' AS kind, 'ready' AS from_status, status AS to_status,
            attempt, %(who)s::jsonb AS data, 0 AS part, id AS n
        FROM leased
        UNION ALL
        SELECT task_id, NULL, 'task_status', 'pending', 'running', NULL, NULL, 1, 0 FROM started
    ) AS e
    ORDER BY e.part, e.n
)
-- One row at least: the leased steps (none: every column of the step NULL), each saying whether
-- its task has just started, and when the next deferred step of these connectors is due.
SELECT leased.*, picked.queued_at, started.task_id IS NOT NULL AS task_started, due.next_due{fresh}
FROM (
    SELECT min(not_before) AS next_due FROM steps
    WHERE status = 'ready' AND connector = ANY(%(connectors)s::text[]) AND not_before > %(now)s
) AS due
LEFT JOIN leased ON true
LEFT JOIN picked ON picked.step_key = leased.id
LEFT JOIN started ON started.task_id = leased.task_id
"""
_LEASED = _columns(schema.steps, "steps.")
CLAIM_READY = _CLAIM.format(
    owners=_OWNERS, fair=_FAIR, guard="", guarded="", fresh="", leased_columns=_LEASED
)
# The same claim when the claimer's catalogue is assumed current and its tools unpaused: it
# leases nothing unless the catalogue is still at %(revision)s and none of %(tools)s is paused,
# and says which (`fresh`), so the claimer needs no read of its own before it.
CLAIM_READY_GUARDED = _CLAIM.format(
    leased_columns=_LEASED,
    owners=_OWNERS,
    fair=_FAIR,
    guard="""
guard AS (
    SELECT (SELECT revision FROM catalog_state WHERE id = 1) = %(revision)s
       AND NOT EXISTS (SELECT 1 FROM tool_pauses
                       WHERE until > %(now)s AND tool = ANY(%(tools)s::text[])) AS fresh
),""",
    guarded=" AND (SELECT fresh FROM guard)",
    fresh=", (SELECT fresh FROM guard) AS fresh",
)

# A task's status, guarded by the version it was read at (optimistic lock).
SET_TASK_STATUS = """
UPDATE tasks SET status = %(status)s, version = %(version)s + 1, updated_at = %(now)s,
    finished_at = %(finished_at)s
WHERE task_id = %(task_id)s AND version = %(version)s
"""


def _keys_of(field: str, kind: str) -> str:
    """The `field` of every row in %(rows)s, as an array. An UPDATE … FROM jsonb_to_recordset
    also matches its table on this: the planner takes any set-returning function for 100 rows,
    so a prepared (generic) plan would otherwise hash-join them against a full scan of the
    table, which grows with it (5 ms a report at 12,000 tasks); `= ANY(array)` uses the key."""
    return f"ARRAY(SELECT (r->>'{field}')::{kind} FROM jsonb_array_elements(%(rows)s::jsonb) AS r)"


# Tasks' statuses at commit, each guarded by the version it was read at; every row must match.
SET_TASK_STATUSES = f"""
UPDATE tasks AS t SET status = v.status, version = t.version + 1, updated_at = v.now,
    finished_at = v.finished_at
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(
    task_id text, version int, status text, now timestamptz, finished_at timestamptz
)
WHERE t.task_id = v.task_id AND t.version = v.version
  AND t.task_id = ANY({_keys_of("task_id", "text")})
RETURNING %(expected)s::int AS expected
"""

# pending -> running for the tasks of freshly leased steps; rows an advance holds are skipped.
MARK_TASKS_RUNNING = """
UPDATE tasks SET status = %(running)s, version = version + 1, updated_at = %(now)s
WHERE task_id IN (
    SELECT task_id FROM tasks WHERE task_id = ANY(%(task_ids)s) AND status = %(pending)s
    FOR UPDATE SKIP LOCKED
)
RETURNING task_id
"""

# What handing a new task's steps straight to waiting pollers assumes (services/handoff.py):
# their sessions live, their tools unpaused.
HAND_OFF_GUARD = """
SELECT (SELECT count(*) FROM executor_sessions
        WHERE id = ANY(%(sessions)s::text[]) AND ended_at IS NULL)
       = cardinality(%(sessions)s::text[])
   AND NOT EXISTS (SELECT 1 FROM tool_pauses
                   WHERE until > %(now)s AND tool = ANY(%(tools)s::text[])) AS ok
"""

# Audit entries chained by the sealer (audit/log.py), from a JSON array, each only if unsealed.
SEAL_AUDIT_ENTRIES = f"""
UPDATE audit_log AS a SET seq = v.seq, prev_hash = v.prev_hash, hash = v.hash
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(id bigint, seq bigint, prev_hash text, hash text)
WHERE a.id = v.id AND a.hash IS NULL AND a.id = ANY({_keys_of("id", "bigint")})
RETURNING a.id
"""

# A live executor session's heartbeat.
TOUCH_SESSION = """
UPDATE executor_sessions SET last_seen_at = %(now)s, expires_at = %(expires_at)s
WHERE id = %(session_id)s AND ended_at IS NULL
"""


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
        f" AND s.id = ANY({_keys_of('id', 'bigint')})"
        " RETURNING s.id, s.attempt"
    )


def _json_columns(table: sa.Table) -> frozenset[str]:
    return frozenset(c.name for c in table.c if isinstance(c.type, sa.JSON))


_TABLES = {t.name: (t, _json_columns(t)) for t in (schema.tasks, schema.steps)}


@functools.lru_cache(maxsize=64)
def insert_rows_sql(table: str, columns: tuple[str, ...]) -> str:
    """`INSERT INTO table (columns)` from a JSON array of rows, in the array's order: one text
    per set of columns, so each set is prepared once (a submit writes the same few sets)."""
    known = _TABLES[table][0].c
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ValueError(f"{table} has no column(s) {unknown}")
    names = ", ".join(columns)
    return (
        f"INSERT INTO {table} ({names}) SELECT {names}"
        f" FROM jsonb_populate_recordset(NULL::{table}, %(rows)s::jsonb) WITH ORDINALITY"
        " ORDER BY ordinality"
    )


def _value(value: Any, *, json: bool) -> Any:
    if value is None:
        return None
    if json:
        return Jsonb(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _bound(row: Mapping[str, Any], json_columns: frozenset[str]) -> dict[str, Any]:
    return {k: _value(v, json=k in json_columns) for k, v in row.items()}


def by_columns(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows grouped by the columns they set: a column a row leaves out keeps its default (SQL
    NULL or the server default), never a value another row of the batch needed."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(row)), []).append(row)
    return groups


def insert_rows(conn: Connection, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert whole rows of `tasks` or `steps` at commit, one part per set of columns."""
    statement = commit_statement(conn)
    for columns, group in by_columns(rows).items():
        statement.write(insert_rows_sql(table, columns), {"rows": json_rows(group)})


def insert_steps_keyed(
    conn: Connection,
    rows: Sequence[Mapping[str, Any]],
    answer: Callable[[list[tuple[str, str, int]]], None],
) -> None:
    """Insert whole `steps` rows at commit, as `insert_rows`, and tell `answer` the key the
    database gave each: [(task_id, step_id, id)] once the commit statement has run."""
    statement = commit_statement(conn)
    for columns, group in by_columns(rows).items():
        statement.read(
            insert_rows_sql("steps", columns) + " RETURNING task_id, step_id, id",
            {"rows": json_rows(group)},
            value="json_agg(json_build_array(task_id, step_id, id))",
            answer=lambda found: answer([tuple(row) for row in found or ()]),
        )


def expect_hand_off(
    conn: Connection,
    *,
    sessions: Sequence[str],
    tools: Sequence[str],
    now: datetime,
    refusal: type[Exception],
) -> None:
    """Commit only if these executor sessions are all live and none of these tools is paused,
    else raise `refusal()`: what leasing a new task's steps to waiting pollers assumes."""
    commit_statement(conn).expect(
        HAND_OFF_GUARD,
        {"sessions": sorted(set(sessions)), "tools": sorted(set(tools)), "now": now},
        holds="coalesce(bool_and(ok), false)",
        refusal=refusal,
    )


def insert_events(conn: Connection, rows: str) -> None:
    """Append events at commit: `rows` is a JSON array of `events` rows without their `id`."""
    commit_statement(conn).write(INSERT_EVENTS, {"rows": rows})


def insert_audit_entries(conn: Connection, rows: str) -> None:
    """Append audit entries at commit: `rows` is a JSON array of unsealed `audit_log` rows."""
    commit_statement(conn).write(INSERT_AUDIT_ENTRIES, {"rows": rows})


def notify(conn: Connection, messages: Sequence[tuple[str, str]]) -> None:
    commit_statement(conn).select(NOTIFY, {"messages": json.dumps(messages)})


async def set_task_status(conn: Connection, params: Mapping[str, Any]) -> bool:
    cur = await _run(conn, SET_TASK_STATUS, _bound(params, frozenset()))
    return cur.rowcount == 1


def set_task_statuses(
    conn: Connection, rows: str, *, expected: int, refusal: type[Exception]
) -> None:
    """Write tasks' statuses at commit (`rows`: a JSON array); unless all `expected` rows match
    their version, nothing of the transaction is written and `refusal()` is raised."""
    commit_statement(conn).expect(
        SET_TASK_STATUSES,
        {"rows": rows, "expected": expected},
        holds="count(*) = coalesce(max(expected), -1)",
        refusal=refusal,
    )


async def mark_tasks_running(
    conn: Connection, task_ids: Sequence[str], *, now: Any, pending: str, running: str
) -> list[str]:
    params = {"task_ids": list(task_ids), "now": now, "pending": pending, "running": running}
    cur = await _run(conn, MARK_TASKS_RUNNING, params)
    return [task_id for (task_id,) in await cur.fetchall()]


def touch_session(
    conn: Connection, params: Mapping[str, Any], ended: Callable[[], Exception]
) -> None:
    """Queue a session's heartbeat for the next round trip; `ended()` is raised then if the
    session has ended."""

    def check(cursor: AsyncCursor[Any]) -> None:
        if cursor.rowcount == 0:
            raise ended()

    queue_statement(conn, TOUCH_SESSION, params, check)


async def change_steps(
    conn: Connection,
    groups: Sequence[tuple[tuple[tuple[str, str], ...], str]],
    *,
    now: Any,
    advance_of: Sequence[str] = (),
) -> tuple[dict[int, int], tuple[list[dict[str, Any]], list[tuple[Any, ...]]] | None]:
    """Run `change_steps_sql(fields)` over each group's JSON array of rows, in one round trip;
    ({step key: attempt} moved, and, for the tasks `advance_of`, what their advance reads once
    the changes are made: the advanceable steps and the status counts, read in the same trip)."""
    async with round_trip(conn, pipeline=len(groups) > 1 or bool(advance_of)) as pg:
        sent = []
        for fields, rows in groups:
            cur = pg.cursor()
            await cur.execute(
                change_steps_sql(fields), {"rows": rows, "now": now}, prepare=prepare(pg)
            )
            sent.append(cur)
        ahead = await _send_advance_reads(pg, advance_of) if advance_of else None
    moved = {key: attempt for cur in sent for key, attempt in await cur.fetchall()}
    return moved, (await _advance_rows(*ahead) if ahead else None)


async def _send_advance_reads(
    pg: AsyncConnection[Any], ids: Sequence[str]
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
    return [_utc(r) for r in await steps.fetchall()], await counts.fetchall()


def expect_revision(conn: Connection, expected: int, refusal: type[Exception]) -> None:
    """Commit only if the catalogue is at `expected` then, else raise `refusal()`."""
    commit_statement(conn).expect(
        FRESH_CATALOG,
        {"expected": expected},
        holds="coalesce(bool_and(fresh), false)",
        refusal=refusal,
    )


def claim_idempotency_key(
    conn: Connection, row: Mapping[str, Any], refusal: type[Exception]
) -> None:
    """Insert the key at commit; if another transaction holds it, raise `refusal()`."""
    commit_statement(conn).expect(CLAIM_IDEMPOTENCY_KEY, row, holds="count(*) = 1", refusal=refusal)


async def _run(
    conn: Connection, sql: str, params: Mapping[str, Any], *, dicts: bool = False
) -> AsyncCursor[Any]:
    """Execute a prepared statement (with whatever must share its round trip)."""
    async with round_trip(conn) as pg:
        cur: AsyncCursor[Any] = pg.cursor(row_factory=dict_row) if dicts else pg.cursor()
        await cur.execute(sql, params, prepare=prepare(pg))
    return cur


def _utc(row: dict[str, Any]) -> dict[str, Any]:
    """A row as SQLAlchemy's UtcDateTime gives it: every timestamp in UTC."""
    for name, value in row.items():
        if isinstance(value, datetime) and value.tzinfo is not UTC:
            row[name] = value.astimezone(UTC)
    return row


@dataclass(frozen=True, slots=True)
class Claimed:
    """What CLAIM_READY gave: the leased rows (every `steps` column and `queued_at`), the tasks
    they started, when the next deferred step is due, and (guarded) whether the guard held."""

    leased: list[dict[str, Any]]
    started: list[str]
    next_due: datetime | None
    fresh: bool = True


async def claim_ready(
    conn: Connection, params: Mapping[str, Any], *, commit: bool, guarded: bool = False
) -> Claimed:
    """Run CLAIM_READY (CLAIM_READY_GUARDED if `guarded`, with `revision` and `tools` among the
    `params`). With `commit` the claim ends its transaction (`engine.closing_statement`: alone,
    without BEGIN or COMMIT, if the transaction sent nothing before): it must be the last thing
    the transaction writes."""
    sql = CLAIM_READY_GUARDED if guarded else CLAIM_READY
    async with closing_statement(conn) if commit else round_trip(conn) as pg:
        cur = pg.cursor(row_factory=dict_row)
        await cur.execute(sql, params, prepare=prepare(pg))
    found = [_utc(row) for row in await cur.fetchall()]
    next_due: datetime | None = found[0]["next_due"] if found else None
    fresh = bool(found[0].get("fresh", True)) if found else True
    leased, started = [], set()
    for row in found:
        if row.pop("task_started"):
            started.add(row["task_id"])
        del row["next_due"]
        row.pop("fresh", None)
        if row["id"] is not None:
            leased.append(row)
    return Claimed(leased, sorted(started), next_due, fresh)


# Reads of the report and claim paths: whole rows by key, and what an advance needs.
STEPS_BY_KEY = f"SELECT {STEP_COLUMNS} FROM steps WHERE id = ANY(%(keys)s::bigint[])"
TASKS_BY_ID = f"SELECT {TASK_COLUMNS} FROM tasks WHERE task_id = ANY(%(ids)s::text[])"
BLOCKED_STEPS = f"""
SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ANY(%(ids)s::text[]) AND status = 'blocked'
ORDER BY task_id, position
"""
STEPS_BY_NAME = f"""
SELECT {_columns(schema.steps, "s.")} FROM steps AS s
JOIN unnest(%(task_ids)s::text[], %(step_ids)s::text[]) AS n(task_id, step_id)
  ON s.task_id = n.task_id AND s.step_id = n.step_id
"""
STATUS_COUNTS = """
SELECT task_id, status, count(*) FROM steps WHERE task_id = ANY(%(ids)s::text[])
GROUP BY task_id, status
"""
# Row locks that serialise advancing these tasks between replicas, in id order.
LOCK_TASKS = (
    "SELECT task_id FROM tasks WHERE task_id = ANY(%(ids)s::text[]) ORDER BY task_id FOR UPDATE"
)
# The tasks of these steps, locked in id order and read whole by the same statement.
LOCK_TASK_ROWS_OF_STEPS = f"""
SELECT {TASK_COLUMNS} FROM tasks
WHERE task_id = ANY(ARRAY(SELECT task_id FROM steps WHERE id = ANY(%(keys)s::bigint[])))
ORDER BY task_id FOR UPDATE
"""
ACTIVE_PAUSES = "SELECT tool, until FROM tool_pauses WHERE until > %(now)s"
# What a claim checks first, in one read: the catalogue's revision and the tools held back now
# (one row with NULLs when none is).
REVISION_AND_PAUSES = """
SELECT (SELECT revision FROM catalog_state WHERE id = 1) AS revision, p.tool, p.until
FROM (SELECT 1) AS one LEFT JOIN tool_pauses AS p ON p.until > %(now)s
"""


async def rows(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A prepared read's rows as dicts, timestamps in UTC."""
    cur = await _run(conn, sql, params, dicts=True)
    return [_utc(row) for row in await cur.fetchall()]


async def tuples(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """A prepared read's rows as tuples (no timestamp among them is converted)."""
    return await (await _run(conn, sql, params)).fetchall()


# The steps an advance needs: the blocked ones and those they depend on, in task order.
ADVANCEABLE_STEPS = f"""
WITH b AS (
    SELECT {STEP_COLUMNS} FROM steps WHERE task_id = ANY(%(ids)s::text[]) AND status = 'blocked'
)
SELECT * FROM b
UNION ALL
SELECT {_columns(schema.steps, "s.")} FROM steps AS s
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
        tasks = pg.cursor(row_factory=dict_row)
        if with_tasks:
            await tasks.execute(TASKS_BY_ID, {"ids": list(ids)}, prepare=prepare(pg))
        sent = await _send_advance_reads(pg, ids)
    found = [_utc(r) for r in await tasks.fetchall()] if with_tasks else []
    return found, *await _advance_rows(*sent)


async def locked_reads(
    conn: Connection, keys: Sequence[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(task rows, step rows) of these steps, the tasks locked first, in one round trip.

    A pipeline runs its statements in order, so the steps are read once the locks are held:
    what the previous holder committed is visible.
    """
    params = {"keys": list(keys)}
    async with round_trip(conn, pipeline=True) as pg:
        tasks, steps = pg.cursor(row_factory=dict_row), pg.cursor(row_factory=dict_row)
        await tasks.execute(LOCK_TASK_ROWS_OF_STEPS, params, prepare=prepare(pg))
        await steps.execute(STEPS_BY_KEY, params, prepare=prepare(pg))
    return [_utc(r) for r in await tasks.fetchall()], [_utc(r) for r in await steps.fetchall()]
