"""Charging steps against blast-radius caps just before they run.

One transaction per claim that leased steps some cap bounds: skip steps already charged for their
tool (a retry, a lease that expired), lock the counters' total rows in key order (so replicas
that charge the same counters queue up instead of both seeing room), sum each tenant window's
buckets, decide with `decide.caps.admit`, and write the charges and the new totals (the SQL is
in `storage/caps.py`). A refused step is charged nothing; the caller ends it with the receipt
this returns, and it is never handed out.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_reach.errors import ErrorCode
from agent_reach_controller.decide.caps import (
    NO_TENANT_CAPS,
    Ask,
    Cap,
    Key,
    Refusal,
    TenantCaps,
    admit,
    bucket_start,
    caps_for,
    window_floor,
)
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning.effects import UnitsError, charges_of, declared
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.storage import caps as caps_db
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.events import NewEvent, append_events
from agent_reach_controller.tools.catalog import ToolSpec

log = logging.getLogger(__name__)
TenantCapsLookup = Callable[[str], TenantCaps]
# Why a step may not run, and the code its receipt carries.
Refused = dict[int, tuple[str, ErrorCode]]
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
            done = await caps_db.charged(conn, [(c.step.id, c.step.tool) for c in candidates])
            refused, asks = _asks([c for c in candidates if (c.step.id, c.step.tool) not in done])
            if asks:
                refused |= await self._decide(conn, asks, candidates, now=now)
        if refused:
            self.refused += len(refused)
        return refused

    async def _remember(self, task_ids: set[str]) -> None:
        """Read the own caps of the tasks not seen before."""
        missing = sorted(t for t in task_ids if t not in self._task_caps)
        if not missing:
            return
        async with self._db.transaction() as conn:
            found = await caps_db.task_caps(conn, missing)
        for task_id in missing:
            self._task_caps[task_id] = found.get(task_id) or None
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
        conn: Connection,
        asks: list[Ask],
        candidates: list[_Candidate],
        *,
        now: datetime,
    ) -> Refused:
        """Lock the counters, admit what fits, and write the charges and the counters' growth."""
        caps = {cap.key: cap for ask in asks for cap in ask.caps}
        used = await _lock_counters(conn, caps, now=now)
        # A charge of the same step (a lease that expired mid-charge, taken again) may have
        # committed while this waited for the counters: it is not charged twice.
        done = await caps_db.charged(conn, [(a.step_key, a.tool) for a in asks])
        asks = [a for a in asks if (a.step_key, a.tool) not in done]
        decided = admit(asks, used)
        by_key = {c.step.id: c.step for c in candidates}
        admitted = set(decided.admitted)
        charged = {a.step_key: a for a in asks if a.step_key in admitted}
        await caps_db.record_charges(
            conn, [_charge(by_key[k], a) for k, a in charged.items()], now=now
        )
        await caps_db.add_to_totals(conn, decided.added, now=now)
        await caps_db.add_to_windows(conn, _window_uses(decided.added, caps, now), now=now)
        refused = {key: (by_key[key], refusal) for key, refusal in decided.refused.items()}
        await append_events(conn, [_refused(step, r, now) for step, r in refused.values()])
        return {
            key: (refusal.message(step.tool), ErrorCode.CAP_EXCEEDED)
            for key, (step, refusal) in refused.items()
        }


async def task_usage(conn: Connection, task_id: str) -> dict[str, float]:
    """What a task has used of each capped class so far (classes nothing capped are absent)."""
    return await caps_db.task_usage(conn, task_id)


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


async def _lock_counters(
    conn: Connection, caps: Mapping[Key, Cap], *, now: datetime
) -> dict[Key, float]:
    """Each counter's use now, its total row locked until commit (in key order: no deadlock).

    A task counter's use is its total; a tenant window's is the sum of its recent buckets.
    """
    used = await caps_db.lock_totals(conn, list(caps), now=now)
    floors = {
        key: window_floor(cap.window_s, now.timestamp())
        for key, cap in caps.items()
        if cap.window_s is not None
    }
    recent = await caps_db.window_sums(conn, floors)
    return used | {key: recent.get(key, 0.0) for key in floors}


def _charge(step: StepRow, ask: Ask) -> caps_db.Charge:
    """The charge row of an admitted step."""
    return caps_db.Charge(
        step_key=step.id,
        tool=step.tool,
        task_id=step.task_id,
        tenant=step.tenant,
        units=ask.charges,
    )


def _window_uses(
    added: Mapping[Key, float], caps: Mapping[Key, Cap], now: datetime
) -> list[caps_db.WindowUse]:
    """What the tenant windows among these counters gain, in their current buckets."""
    return [
        caps_db.WindowUse(
            key=key,
            bucket=bucket_start(window, now.timestamp()),
            units=units,
            floor=window_floor(window, now.timestamp()),
        )
        for key, units in sorted(added.items())
        if (window := caps[key].window_s)
    ]


def _refused(step: StepRow, refusal: Refusal, now: datetime) -> NewEvent:
    """Log a refused step, and the `cap_exceeded` event of its history."""
    log.warning(
        "step %s of task %s refused: %s",
        step.step_id,
        step.task_id,
        refusal.message(step.tool),
        extra={"event": "cap_exceeded", "task_id": step.task_id},
    )
    return NewEvent(
        task_id=step.task_id,
        step_id=step.step_id,
        kind="cap_exceeded",
        attempt=step.attempt,
        data={"tool": step.tool, **refusal.as_dict()},
        created_at=now,
    )
