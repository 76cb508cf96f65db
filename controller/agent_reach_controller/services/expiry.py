"""Expiry: what time ends. Leases that ran out, queued steps past `schedule_to_start`,
approvals nobody gave in time, tasks past their deadline, and the queued steps of tools whose
breaker is open and set to fail fast.

Each is a sweep any replica may run at any time: every step is decided again under its task's
lock (a unit of work), so two replicas sweeping at once settle each step once.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from agent_reach.states import StepStatus
from agent_reach_controller.decide import approvals, breakers
from agent_reach_controller.decide.outcomes import breaker_open, decide_lease_expiry, not_started
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.operator import OperatorService, deadline_error
from agent_reach_controller.services.unit_of_work import UnitOfWork
from agent_reach_controller.storage import flow, steps
from agent_reach_controller.storage import tasks as task_store

log = logging.getLogger(__name__)


class ExpiryService:
    """The sweeps that end or re-queue work whose time has come."""

    def __init__(self, *, work: UnitOfWork, operator: OperatorService) -> None:
        self._work = work
        self._db = work.db
        self._registry = work.registry
        self.metrics: ControllerMetrics = work.metrics
        self._operator = operator

    async def reap_expired(self, *, limit: int = 500) -> int:
        """Re-queue (or fail) running steps whose lease expired. Any replica may run this."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            expired = await steps.expired_leases(conn, now=now, limit=limit)
        reaped = await self._work.settle(
            [s.id for s in expired],
            now=now,
            due=lambda s: (
                s.status is StepStatus.RUNNING
                and s.lease_expires_at is not None
                and s.lease_expires_at < now
            ),
            decide=decide_lease_expiry,
        )
        self.metrics.leases_expired(reaped)
        if reaped:
            log.warning(
                "handled %d steps whose lease expired (re-queued, failed or held for an operator)",
                reaped,
                extra={"event": "lease_expired"},
            )
        return reaped

    async def expire_unstarted(self, *, limit: int = 500) -> int:
        """Fail (or hand to their fallback) queued steps past their `schedule_to_start`."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            late = await steps.unstarted_steps(conn, now=now, limit=limit)
        expired = await self._work.settle(
            late,
            now=now,
            due=lambda s: (
                s.status is StepStatus.READY and s.start_by is not None and s.start_by < now
            ),
            decide=not_started,
        )
        if expired:
            log.warning(
                "%d queued steps were not started in time (schedule_to_start)",
                expired,
                extra={"event": "schedule_to_start_expired"},
            )
        return expired

    async def expire_approvals(self, *, limit: int = 500) -> int:
        """Reject steps nobody approved in time (every replica may run this)."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            late = await steps.overdue_approvals(conn, now=now, limit=limit)
        return await self._work.settle(
            late,
            now=now,
            due=lambda s: (
                s.status is StepStatus.AWAITING_APPROVAL
                and s.decide_by is not None
                and s.decide_by < now
            ),
            decide=approvals.expired,
        )

    async def fail_fast_open(self, *, limit: int = 500) -> int:
        """End the queued steps of tools whose breaker is open and set to fail fast."""
        now = datetime.now(UTC)
        guarded = {
            t.name: t.breaker
            for t in self._registry.catalog.values()
            if t.breaker is not None and t.breaker.while_open == "fail_fast"
        }
        if not guarded:
            return 0
        async with self._db.transaction() as conn:
            states = await flow.load_breakers(conn, guarded)
            shut = sorted(
                name
                for name, policy in guarded.items()
                if breakers.admission(states.get(name), policy, now) == 0
            )
            queued = await steps.queued_steps_of(conn, shut, limit=limit) if shut else []
        ended = await self._work.settle(
            queued,
            now=now,
            due=lambda s: s.status is StepStatus.READY and s.tool in shut,
            decide=breaker_open,
        )
        if ended:
            log.warning(
                "%d queued steps failed fast: their tool's circuit breaker is open",
                ended,
                extra={"event": "breaker_fail_fast"},
            )
        return ended

    async def expire_deadlines(self, *, limit: int = 100) -> int:
        """End tasks whose deadline has passed, every unfinished step with a receipt saying so.

        Any replica may run this: each task is ended under its row lock, once.
        """
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            overdue = await task_store.overdue_tasks(conn, now=now, limit=limit)
        for task_id, deadline in overdue:
            await self._operator.end(task_id, error=deadline_error(deadline))
        return len(overdue)
