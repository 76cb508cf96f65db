"""What each executor pool has to do, for autoscalers: its share of the queue, its running steps,
and the executors that takes at the slots its executors have.

A pool is known from its tokens (database or provisioning file) or from its executors' sessions,
so a pool scaled to zero, or one whose executors never ran, still gets a figure: scale from zero
needs one. A step counts for every pool whose scope takes it (overlapping pools each see it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_reach_controller.domain.records import QueuedGroup
from agent_reach_controller.identity.pools import PoolScope, PoolTokenService
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.admission import AdmissionService
from agent_reach_controller.storage import demand as storage
from agent_reach_controller.storage.engine import Database


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolDemand:
    pool: str
    queued: int  # ready steps the pool may take, due or not
    running: int  # steps its executors hold
    oldest_ready_age_seconds: float  # how long its longest-waiting due step has been due
    # Slots of the pool's most recent executor (None: none has ever registered).
    slots_per_executor: int | None

    @property
    def steps(self) -> int:
        return self.queued + self.running

    @property
    def desired_executors(self) -> int:
        """Executors to run what runs and what waits; 1 for work whose pool's slots are unknown."""
        if self.steps == 0:
            return 0
        if not self.slots_per_executor:
            return 1
        return math.ceil(self.steps / self.slots_per_executor)

    def to_json(self) -> dict[str, object]:
        return {
            "pool": self.pool,
            "queued": self.queued,
            "running": self.running,
            "steps": self.steps,
            "oldest_ready_age_seconds": self.oldest_ready_age_seconds,
            "slots_per_executor": self.slots_per_executor,
            "desired_executors": self.desired_executors,
        }


def _takes(scope: PoolScope, group: QueuedGroup) -> bool:
    return (
        (scope.connectors is None or group.connector in scope.connectors)
        and scope.allows_tool(group.tool)
        and (scope.tenant is None or scope.tenant == group.tenant)
    )


def pool_demand(
    scopes: Mapping[str, PoolScope],
    queued: Iterable[QueuedGroup],
    running: Mapping[str, int],
    slots: Mapping[str, int],
    *,
    now: datetime,
) -> dict[str, PoolDemand]:
    """Each pool's demand from the queue's groups, its running steps and its slots (pure)."""
    groups = list(queued)
    found = {}
    for name, scope in scopes.items():
        mine = [g for g in groups if _takes(scope, g)]
        due = [g.oldest_due for g in mine if g.oldest_due is not None]
        found[name] = PoolDemand(
            pool=name,
            queued=sum(g.depth for g in mine),
            running=running.get(name, 0),
            oldest_ready_age_seconds=max(0.0, (now - min(due)).total_seconds()) if due else 0.0,
            slots_per_executor=slots.get(name),
        )
    return found


class AutoscalingService:
    """Refreshed by the queue sweep; read by `/metrics` (gauges) and `/metrics/pools/{pool}`.

    The queue itself is read once per refresh, by admission (`refresh_queue_depth`); this adds
    what the pools' sessions hold and their slots."""

    def __init__(
        self,
        *,
        db: Database,
        pools: PoolTokenService,
        admission: AdmissionService,
        metrics: ControllerMetrics,
    ) -> None:
        self._db = db
        self._pools = pools
        self._admission = admission
        self._metrics = metrics
        self.latest: dict[str, PoolDemand] = {}
        self._refreshed = -math.inf
        self._refreshing = asyncio.Lock()

    async def demand(self, pool: str, *, max_age: float = 5.0) -> PoolDemand | None:
        """One pool's demand, read again when the sweep's is older than `max_age` seconds (at
        start, or an idle replica): at most once per `max_age` however many ask at once (the
        route needs no key)."""
        async with self._refreshing:
            if time.monotonic() - self._refreshed > max_age:
                await self._refresh()
        return self.latest.get(pool)

    async def refresh(self) -> dict[str, PoolDemand]:
        """The queue sweep: count the queue (admission, the per-tool gauges), then divide it."""
        async with self._refreshing:
            return await self._refresh()

    async def _refresh(self) -> dict[str, PoolDemand]:
        await self._admission.refresh_queue_depth()
        queued = self._admission.queued
        now = datetime.now(UTC)
        tokens = [t for t in await self._pools.list() if t.revoked_at is None]
        async with self._db.transaction() as conn:
            running = await storage.running_by_pool(conn)
            sessions = await storage.session_pools(conn)
        scopes: dict[str, PoolScope] = {}
        # Newest token of a name last, so it wins (provisioned ones have no date: they win).
        for token in sorted(tokens, key=lambda t: t.created_at or now):
            scopes[token.name] = token.scope
        for seen in sessions:
            scopes.setdefault(
                seen.pool, PoolScope.from_json(seen.scope, pool=seen.pool, credential="session")
            )
        self._refreshed = time.monotonic()
        self.latest = pool_demand(
            scopes, queued, running, {s.pool: s.slots for s in sessions}, now=now
        )
        self._metrics.pools(self.latest.values())
        return self.latest
