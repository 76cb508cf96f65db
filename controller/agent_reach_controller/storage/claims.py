"""Claims: choosing due ready steps in dispatch order, and leasing them to an executor.

Dispatch order is priority first, then tenants in turn; concurrency caps are counted under
transaction-scoped advisory locks so two replicas never both see room for the same last slot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus, Transition, sources, target
from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.storage import hot, schema
from agent_reach_controller.storage.commit import tight
from agent_reach_controller.storage.engine import (
    Connection,
    closing_statement,
    commit_statement,
    prepare,
    round_trip,
)
from agent_reach_controller.storage.events import NewEvent, append_events, events_written
from agent_reach_controller.storage.schema import executor_sessions, steps
from agent_reach_controller.storage.tasks import mark_tasks_running


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimInput:
    # The lease holder: an executor session's id, or any name for a holder without one.
    executor_id: str
    connectors: Sequence[str]
    limit: int
    now: datetime
    # None for a session's lease: it lives as long as the session (`state/sessions.py`).
    lease_expires_at: datetime | None
    # Tools of these connectors outside the holder's scope, and the one tenant it may serve.
    exclude_tools: Sequence[str] = ()
    tenant: str | None = None
    # The holder's poll that takes these leases (PollSteps.poll_seq), if it numbers them.
    lease_seq: int | None = None
    # The executor process's own name when the holder is its session (events show both).
    executor: str = ""

    @property
    def who(self) -> dict[str, str]:
        """How events name the holder: the executor, and its session if it has one."""
        if not self.executor:
            return {"executor_id": self.executor_id}
        return {"executor_id": self.executor, "session": self.executor_id}


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


# The ungoverned claim in one statement: the fair order, the rows still queued locked (rows
# another claimer holds are skipped; MATERIALIZED, or the planner may evaluate the locking
# subquery twice and lease rows it did not lock), and the lease, taken only while the holder's
# session lives, the tasks it starts, and the events of both. Each row comes back with
# `queued_at`, the `updated_at` it had before the lease. Rows are found by key through
# `= ANY(ARRAY(…))`, never by a join the planner may run as a scan of every queued step: a
# database minutes old has no statistics yet, and that scan made a claim of 32 among 1,500 ready
# steps take 44 ms instead of 7. The started tasks' rows (`tasks.*`) reach the result only
# inside `to_jsonb`, so a column a later migration adds leaves the result's type as it was.
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
    RETURNING tasks.*, (SELECT count(*) FROM steps AS s WHERE s.task_id = tasks.task_id) AS steps
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
-- its task has just started (and, for a task of one step, the task as it left it), and when the
-- next deferred step of these connectors is due.
SELECT leased.*, picked.queued_at, started.task_id IS NOT NULL AS task_started,
    CASE WHEN started.steps = 1 THEN to_jsonb(started) END AS started_task, due.next_due{fresh}
FROM (
    SELECT min(not_before) AS next_due FROM steps
    WHERE status = 'ready' AND connector = ANY(%(connectors)s::text[]) AND not_before > %(now)s
) AS due
LEFT JOIN leased ON true
LEFT JOIN picked ON picked.step_key = leased.id
LEFT JOIN started ON started.task_id = leased.task_id
"""


_LEASED = hot.columns(schema.steps, "steps.")


CLAIM_READY = tight(
    _CLAIM.format(
        owners=_OWNERS, fair=_FAIR, guard="", guarded="", fresh="", leased_columns=_LEASED
    )
)


# The same claim when the claimer's catalogue is assumed current and its tools unpaused: it
# leases nothing unless the catalogue is still at %(revision)s and none of %(tools)s is paused,
# and says which (`fresh`), so the claimer needs no read of its own before it.
CLAIM_READY_GUARDED = tight(
    _CLAIM.format(
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
)


# What handing a new task's steps straight to waiting pollers assumes (services/handoff.py):
# their sessions live, their tools unpaused.
HAND_OFF_GUARD = """
SELECT (SELECT count(*) FROM executor_sessions
        WHERE id = ANY(%(sessions)s::text[]) AND ended_at IS NULL)
       = cardinality(%(sessions)s::text[])
   AND NOT EXISTS (SELECT 1 FROM tool_pauses
                   WHERE until > %(now)s AND tool = ANY(%(tools)s::text[])) AS ok
"""


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


@dataclass(frozen=True, slots=True)
class Claimed:
    """What CLAIM_READY gave: the leased rows (every `steps` column and `queued_at`), the tasks
    they started, when the next deferred step is due, and (guarded) whether the guard held."""

    leased: list[dict[str, Any]]
    started: list[str]
    next_due: datetime | None
    fresh: bool = True
    alone: dict[str, TaskRow] = field(default_factory=dict)  # started tasks of one step


async def _claim_ready_postgres(
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
    found = [hot.utc(row) for row in await cur.fetchall()]
    next_due: datetime | None = found[0]["next_due"] if found else None
    fresh = bool(found[0].get("fresh", True)) if found else True
    leased, started, alone = [], set(), {}
    for row in found:
        if row.pop("task_started"):
            started.add(row["task_id"])
        if (task := row.pop("started_task")) is not None:
            alone[task["task_id"]] = _task_from_json(task)
        del row["next_due"]
        row.pop("fresh", None)
        if row["id"] is not None:
            leased.append(row)
    return Claimed(leased, sorted(started), next_due, fresh, alone)


# A task row's timestamps, which `to_jsonb` gives as ISO 8601 text.
_TASK_TIMES = ("created_at", "updated_at", "finished_at", "deadline")


def _task_from_json(row: dict[str, Any]) -> TaskRow:
    for name in _TASK_TIMES:
        if (value := row.get(name)) is not None:
            row[name] = datetime.fromisoformat(value).astimezone(UTC)
    return TaskRow.from_mapping(row)


def _fair_params(
    claim: ClaimInput, *, skip_tools: Sequence[str], skip_keys: Sequence[str]
) -> dict[str, Any]:
    """The parameters of `FAIR_ORDER` (and of the fair part of `CLAIM_READY`)."""
    return {
        "connectors": list(claim.connectors),
        "skip": list(skip_tools),
        "skip_keys": list(skip_keys),
        "tenant": claim.tenant,
        "now": claim.now,
        "limit": claim.limit,
    }


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
    skip_tools = [*skip_tools, *claim.exclude_tools]
    if conn.dialect.name == "postgresql":
        params = _fair_params(claim, skip_tools=skip_tools, skip_keys=skip_keys)
        return [key for (key,) in await hot.tuples(conn, FAIR_ORDER, params)]
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
            steps.c.tenant == claim.tenant if claim.tenant is not None else sa.true(),
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


@dataclass(frozen=True, slots=True)
class Assumed:
    """What a claim that reads nothing first assumes: the catalogue is still at `revision` and
    none of `tools` is paused. If not, it leases nothing and says so."""

    revision: int
    tools: Sequence[str]


class AssumptionFailed(Exception):
    """A claim made under `Assumed` found the catalogue changed or a tool paused: nothing was
    leased, and the claimer should read both and claim again."""


async def claim_ready(
    conn: AsyncConnection, claim: ClaimInput, *, last: bool = False, assumed: Assumed | None = None
) -> tuple[list[StepRow], datetime | None, dict[str, TaskRow]]:
    """Lease up to `limit` due ready steps to an executor, in fair order, and start their tasks
    (`pending` → `running`); also says when the next deferred step of these connectors is due,
    and (Postgres) gives the tasks of one step it started, as it left them (services/held.py).

    The fast path, for connectors whose tools have no concurrency cap, breaker or rate limit:
    one statement on Postgres (`CLAIM_READY`, its events included). If it is the `last`
    write of its transaction, the COMMIT goes in the same round trip. With `assumed` (Postgres
    only) the statement also checks the catalogue revision and pauses the claimer did not read,
    and raises AssumptionFailed, having leased nothing, when they do not hold.
    """
    if conn.dialect.name == "postgresql":
        params = {
            **_fair_params(claim, skip_tools=claim.exclude_tools, skip_keys=()),
            "owner": claim.executor_id,
            "lease_expires_at": claim.lease_expires_at,
            "lease_seq": claim.lease_seq,
            "session": bool(claim.executor),
            "who": json.dumps(claim.who),
        }
        if assumed is not None:
            params |= {"revision": assumed.revision, "tools": list(assumed.tools)}
        got = await _claim_ready_postgres(conn, params, commit=last, guarded=assumed is not None)
        if not got.fresh:
            raise AssumptionFailed
        leased = [StepRow.from_mapping(r) for r in got.leased]
        events_written(conn, [*(s.task_id for s in leased), *got.started])
        return leased, got.next_due, got.alone
    if assumed is not None:
        raise ValueError("a claim under assumptions is a Postgres statement")
    leased = await _claim_ready_sqlite(conn, claim)
    if leased:
        await mark_tasks_running(conn, {s.task_id for s in leased}, now=claim.now)
    return leased, await next_due(conn, claim.connectors, now=claim.now), {}


async def _claim_ready_sqlite(conn: AsyncConnection, claim: ClaimInput) -> list[StepRow]:
    keys = await fair_order(conn, claim)
    if not keys:
        return []
    # Materialized: an IN (SELECT … SKIP LOCKED) subquery may be evaluated more than once by
    # the planner and lease rows it did not lock.
    picked = _lockable(keys).with_only_columns(*_PICKED)
    return await _lease(conn, picked.cte("picked").prefix_with("MATERIALIZED"), claim)


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
    """Lease these picked steps (`pick_ready` locked them)."""
    if not keys:
        return []
    picked = sa.select(*_PICKED).where(steps.c.id.in_(list(keys)))
    return await _lease(conn, picked.cte("picked").prefix_with("MATERIALIZED"), claim)


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


# What a lease reads before it writes: the step, and when its attempt was queued. Not named
# `id`: SQLite's RETURNING drops table prefixes, and `id = id` inside the subquery would match
# any row of the CTE.
_PICKED = (steps.c.id.label("step_key"), steps.c.updated_at.label("queued_at"))


async def _lease(conn: AsyncConnection, picked: sa.CTE, claim: ClaimInput) -> list[StepRow]:
    """Lease the steps of `picked` (a materialized CTE of `_PICKED`) that are still queued.

    Each row comes back with its `queued_at`, the `updated_at` it had before this lease (read
    from the CTE: RETURNING sees only new values, and on SQLite only the updated table).
    """
    queued_at = (
        sa.select(picked.c.queued_at).where(picked.c.step_key == steps.c.id).scalar_subquery()
    )
    # A session's lease is taken only while the session lives (not expired, not revoked): one
    # condition of this statement, rather than a write per claim.
    live = (
        sa.exists().where(
            executor_sessions.c.id == claim.executor_id, executor_sessions.c.ended_at.is_(None)
        )
        if claim.executor
        else sa.true()
    )
    stmt = (
        sa.update(steps)
        .where(
            steps.c.id.in_(sa.select(picked.c.step_key)),
            steps.c.status.in_(sources(Transition.LEASE)),
            live,
        )
        .values(
            status=target(Transition.LEASE),
            lease_owner=claim.executor_id,
            lease_expires_at=claim.lease_expires_at,
            lease_seq=claim.lease_seq,
            started_at=sa.func.coalesce(steps.c.started_at, claim.now),
            updated_at=claim.now,
        )
        .returning(*steps.c, queued_at.label("queued_at"))
    )
    claimed = [StepRow.from_mapping(r) for r in (await conn.execute(stmt)).mappings()]
    return await _leased(conn, claimed, claim)


async def _leased(
    conn: AsyncConnection, claimed: list[StepRow], claim: ClaimInput
) -> list[StepRow]:
    """Record the lease events of `claimed`; returns them."""
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
                data=claim.who,
                created_at=claim.now,
            )
            for s in claimed
        ],
    )
    return claimed
