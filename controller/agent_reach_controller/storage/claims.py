"""Claims: choosing due ready steps in dispatch order, and leasing them to an executor.

Dispatch order is priority first, then tenants in turn; concurrency caps are counted under
transaction-scoped advisory locks so two replicas never both see room for the same last slot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus, Transition, sources, target
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.storage import hot
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


def _fair_params(
    claim: ClaimInput, *, skip_tools: Sequence[str], skip_keys: Sequence[str]
) -> dict[str, Any]:
    """The parameters of `hot.FAIR_ORDER` (and of the fair part of `hot.CLAIM_READY`)."""
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
        return [key for (key,) in await hot.tuples(conn, hot.FAIR_ORDER, params)]
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
) -> tuple[list[StepRow], datetime | None]:
    """Lease up to `limit` due ready steps to an executor, in fair order, and start their tasks
    (`pending` → `running`); also says when the next deferred step of these connectors is due.

    The fast path, for connectors whose tools have no concurrency cap, breaker or rate limit:
    one statement on Postgres (`hot.CLAIM_READY`, its events included). If it is the `last`
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
        got = await hot.claim_ready(conn, params, commit=last, guarded=assumed is not None)
        if not got.fresh:
            raise AssumptionFailed
        leased = [StepRow.from_mapping(r) for r in got.leased]
        events_written(conn, [*(s.task_id for s in leased), *got.started])
        return leased, got.next_due
    if assumed is not None:
        raise ValueError("a claim under assumptions is a Postgres statement")
    leased = await _claim_ready_sqlite(conn, claim)
    if leased:
        await mark_tasks_running(conn, {s.task_id for s in leased}, now=claim.now)
    return leased, await next_due(conn, claim.connectors, now=claim.now)


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
