"""Charging steps against blast-radius caps just before they run: the counters and their SQL.

One transaction per claim that leased steps some cap bounds: skip steps already charged for their
tool (a retry, a lease that expired), lock the counters' total rows in key order (so replicas
that charge the same counters queue up instead of both seeing room), sum each tenant window's
buckets, decide with `flow.caps.admit`, and write the charges and the new totals. A refused step
is charged nothing; the caller ends it with the receipt this returns, and it is never handed out.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.errors import ErrorCode
from agent_reach_controller.db.engine import Database
from agent_reach_controller.db.schema import cap_charges, cap_usage, tasks
from agent_reach_controller.flow.caps import (
    NO_TENANT_CAPS,
    Ask,
    Cap,
    Key,
    TenantCaps,
    admit,
    bucket_start,
    caps_for,
    window_floor,
)
from agent_reach_controller.planning.effects import UnitsError, charges_of, declared
from agent_reach_controller.state.records import StepRow
from agent_reach_controller.state.registry import ToolRegistry
from agent_reach_controller.state.store import NewEvent, append_events, dialect_insert
from agent_reach_controller.tools.catalog import ToolSpec

log = logging.getLogger(__name__)
TenantCapsLookup = Callable[[str], TenantCaps]
# Why a step may not run, and the code its receipt carries.
Refused = dict[int, tuple[str, ErrorCode]]
_TOTAL = 0  # the bucket of a counter's running total (and its lock)
_REMEMBERED_TASKS = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class _Candidate:
    step: StepRow
    tool: ToolSpec
    caps: list[Cap]


class CapService:
    """Charges leased steps against their task's and tenant's caps. Safe in every replica."""

    def __init__(
        self, *, db: Database, registry: ToolRegistry, tenant_caps: TenantCapsLookup | None
    ) -> None:
        self._db = db
        self._registry = registry
        self._tenant_caps = tenant_caps
        # A task's own caps never change after submit: remembered (None: it has none).
        self._task_caps: OrderedDict[str, dict[str, float] | None] = OrderedDict()
        self.refused = 0

    async def charge(self, steps: Sequence[StepRow]) -> Refused:
        """Charge these steps, about to be handed out; returns those that may not run, and why.

        Steps are decided in dispatch order (higher priority first, then the oldest), so the
        last room under a cap goes to the step a claim would have picked first. Cheap when
        nothing is capped: no transaction unless a step's tool declares effects and some cap
        bounds it (plus one read of the caps of a task not seen before).
        """
        effectful = [
            (s, tool)
            for s in sorted(steps, key=lambda s: (-s.priority, s.id))  # who gets the last room
            if declared(tool := self._registry.get(s.tool, s.tool_version))
        ]
        if not effectful:
            return {}
        await self._remember({s.task_id for s, _ in effectful})
        candidates = self._candidates(effectful)
        if not candidates:
            return {}
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            done = await _charged(conn, [(c.step.id, c.step.tool) for c in candidates])
            refused, asks = _asks([c for c in candidates if (c.step.id, c.step.tool) not in done])
            if asks:
                refused |= await self._decide(conn, asks, candidates, now=now)
        if refused:
            self.refused += len(refused)
        return refused

    async def _remember(self, task_ids: set[str]) -> None:
        missing = sorted(t for t in task_ids if t not in self._task_caps)
        if not missing:
            return
        async with self._db.transaction() as conn:
            rows = await conn.execute(
                sa.select(tasks.c.task_id, tasks.c.caps).where(tasks.c.task_id.in_(missing))
            )
            found = {task_id: caps or None for task_id, caps in rows.all()}
        for task_id in missing:
            self._task_caps[task_id] = found.get(task_id)
        while len(self._task_caps) > _REMEMBERED_TASKS:
            self._task_caps.popitem(last=False)

    def _candidates(self, effectful: list[tuple[StepRow, ToolSpec]]) -> list[_Candidate]:
        """The steps some cap bounds, with those caps."""
        lookup = self._tenant_caps
        found = []
        for step, tool in effectful:
            caps = caps_for(
                task_id=step.task_id,
                tenant=step.tenant,
                effects=frozenset(declared(tool)),
                task_caps=self._task_caps.get(step.task_id),
                tenant_caps=lookup(step.tenant) if lookup else NO_TENANT_CAPS,
            )
            if caps:
                found.append(_Candidate(step=step, tool=tool, caps=caps))
        return found

    async def _decide(
        self,
        conn: AsyncConnection,
        asks: list[Ask],
        candidates: list[_Candidate],
        *,
        now: datetime,
    ) -> Refused:
        caps = {cap.key: cap for ask in asks for cap in ask.caps}
        used = await _lock_counters(conn, caps, now=now)
        # A charge of the same step (a lease that expired mid-charge, taken again) may have
        # committed while this waited for the counters: it is not charged twice.
        done = await _charged(conn, [(a.step_key, a.tool) for a in asks])
        asks = [a for a in asks if (a.step_key, a.tool) not in done]
        decided = admit(asks, used)
        by_key = {c.step.id: c.step for c in candidates}
        admitted = set(decided.admitted)
        charged = {ask.step_key: ask for ask in asks if ask.step_key in admitted}
        await _record(conn, [(by_key[k], a) for k, a in charged.items()], now=now)
        await _add(conn, decided.added, caps, now=now)
        refused: Refused = {}
        events = []
        for key, refusal in decided.refused.items():
            step = by_key[key]
            refused[key] = (refusal.message(step.tool), ErrorCode.CAP_EXCEEDED)
            events.append(
                NewEvent(
                    task_id=step.task_id,
                    step_id=step.step_id,
                    kind="cap_exceeded",
                    attempt=step.attempt,
                    data={"tool": step.tool, **refusal.as_dict()},
                    created_at=now,
                )
            )
            log.warning(
                "step %s of task %s refused: %s",
                step.step_id,
                step.task_id,
                refusal.message(step.tool),
                extra={"event": "cap_exceeded", "task_id": step.task_id},
            )
        await append_events(conn, events)
        return refused


async def task_usage(conn: AsyncConnection, task_id: str) -> dict[str, float]:
    """What a task has used of each capped class so far (classes nothing capped are absent)."""
    rows = await conn.execute(
        sa.select(cap_usage.c.effect, cap_usage.c.used).where(
            cap_usage.c.scope == f"task:{task_id}", cap_usage.c.bucket == _TOTAL
        )
    )
    return {effect: float(used) for effect, used in rows.all()}


def _asks(candidates: Iterable[_Candidate]) -> tuple[Refused, list[Ask]]:
    """What each step charges; a step whose units cannot be computed is refused (fail closed)."""
    refused: Refused = {}
    asks: list[Ask] = []
    for c in candidates:
        args = c.step.resolved_args if c.step.resolved_args is not None else c.step.args
        try:
            charges = charges_of(c.tool, args)
        except UnitsError as exc:
            refused[c.step.id] = (
                f"not run: {exc}; a capped tool must know what a call charges before it runs",
                ErrorCode.INVALID_ARGUMENTS,
            )
            continue
        if any(cap.effect in charges for cap in c.caps):
            asks.append(Ask(step_key=c.step.id, tool=c.step.tool, charges=charges, caps=c.caps))
    return refused, asks


async def _charged(conn: AsyncConnection, pairs: list[tuple[int, str]]) -> set[tuple[int, str]]:
    """Which (step, tool) pairs were charged already (an earlier attempt ran)."""
    rows = await conn.execute(
        sa.select(cap_charges.c.step_key, cap_charges.c.tool).where(
            sa.tuple_(cap_charges.c.step_key, cap_charges.c.tool).in_(pairs)
        )
    )
    return {(key, tool) for key, tool in rows.all()}


async def _lock_counters(
    conn: AsyncConnection, caps: Mapping[Key, Cap], *, now: datetime
) -> dict[Key, float]:
    """Each counter's use now, its total row locked until commit (in key order: no deadlock).

    A task counter's use is its total; a tenant window's is the sum of its recent buckets.
    """
    keys = sorted(caps)
    await conn.execute(
        dialect_insert(conn, cap_usage).on_conflict_do_nothing(
            index_elements=["scope", "effect", "bucket"]
        ),
        [
            {"scope": scope, "effect": effect, "bucket": _TOTAL, "used": 0.0, "updated_at": now}
            for scope, effect in keys
        ],
    )
    totals = await conn.execute(
        sa.select(cap_usage.c.scope, cap_usage.c.effect, cap_usage.c.used)
        .where(
            cap_usage.c.bucket == _TOTAL,
            sa.tuple_(cap_usage.c.scope, cap_usage.c.effect).in_(keys),
        )
        .order_by(cap_usage.c.scope, cap_usage.c.effect)
        .with_for_update()
    )
    used = {(scope, effect): float(value) for scope, effect, value in totals.all()}
    windows = [caps[key] for key in keys if caps[key].window_s is not None]
    if windows:
        sums = await conn.execute(
            sa.select(cap_usage.c.scope, cap_usage.c.effect, sa.func.sum(cap_usage.c.used))
            .where(
                cap_usage.c.bucket != _TOTAL,
                sa.or_(*(_recent(cap, now) for cap in windows)),
            )
            .group_by(cap_usage.c.scope, cap_usage.c.effect)
        )
        recent = {(scope, effect): float(total or 0.0) for scope, effect, total in sums.all()}
        for cap in windows:
            used[cap.key] = recent.get(cap.key, 0.0)
    return used


def _recent(cap: Cap, now: datetime) -> sa.ColumnElement[bool]:
    assert cap.window_s is not None
    return sa.and_(
        cap_usage.c.scope == cap.scope,
        cap_usage.c.effect == cap.effect,
        cap_usage.c.bucket > window_floor(cap.window_s, now.timestamp()),
    )


async def _record(
    conn: AsyncConnection, charged: list[tuple[StepRow, Ask]], *, now: datetime
) -> None:
    if not charged:
        return
    await conn.execute(
        dialect_insert(conn, cap_charges).on_conflict_do_nothing(
            index_elements=["step_key", "tool"]
        ),
        [
            {
                "step_key": step.id,
                "tool": step.tool,
                "task_id": step.task_id,
                "tenant": step.tenant,
                "units": dict(ask.charges),
                "charged_at": now,
            }
            for step, ask in charged
        ],
    )


async def _add(
    conn: AsyncConnection, added: Mapping[Key, float], caps: Mapping[Key, Cap], *, now: datetime
) -> None:
    """Grow the totals (rows locked above) and the current bucket of each tenant window."""
    if not added:
        return
    await conn.execute(
        sa.update(cap_usage)
        .where(
            cap_usage.c.scope == sa.bindparam("s"),
            cap_usage.c.effect == sa.bindparam("e"),
            cap_usage.c.bucket == _TOTAL,
        )
        .values(used=cap_usage.c.used + sa.bindparam("d"), updated_at=now),
        [{"s": scope, "e": effect, "d": units} for (scope, effect), units in sorted(added.items())],
    )
    windowed = [(caps[key], units) for key, units in sorted(added.items()) if caps[key].window_s]
    if not windowed:
        return
    stmt = dialect_insert(conn, cap_usage)
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["scope", "effect", "bucket"],
            set_={"used": cap_usage.c.used + stmt.excluded.used, "updated_at": now},
        ),
        [
            {
                "scope": cap.scope,
                "effect": cap.effect,
                "bucket": bucket_start(cap.window_s or 0.0, now.timestamp()),
                "used": units,
                "updated_at": now,
            }
            for cap, units in windowed
        ],
    )
    # Buckets that can no longer count: dropped while their counter is locked anyway.
    for cap, _ in windowed:
        await conn.execute(
            sa.delete(cap_usage).where(
                cap_usage.c.scope == cap.scope,
                cap_usage.c.effect == cap.effect,
                cap_usage.c.bucket != _TOTAL,
                cap_usage.c.bucket <= window_floor(cap.window_s or 0.0, now.timestamp()),
            )
        )
