"""Admission control: a submit is refused (429) when more steps wait than the limit allows.

Each replica counts the queue in the background and reserves room for every submit at once, so
concurrent submits cannot all squeeze through before the next count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_reach_controller.domain.records import QueuedGroup
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.storage import steps
from agent_reach_controller.storage.engine import Database


class QueueFullError(Exception):
    """More steps wait for executors than the controller is configured to queue."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"{depth:,} steps are waiting for executors; the limit is {limit:,}")


@dataclass(slots=True)
class Admission:
    keep: bool = True


class AdmissionService:
    """The queue's depth as this replica knows it, and reservations against its limit."""

    def __init__(self, *, db: Database, registry: ToolRegistry, metrics: ControllerMetrics) -> None:
        self._db = db
        self._registry = registry
        self.metrics = metrics
        # Ready steps across all replicas, refreshed by the background loop (admission control).
        self.queue_depth = 0
        # The queue as the last refresh read it, by tool, connector and tenant (autoscaling
        # divides it among the executor pools).
        self.queued: list[QueuedGroup] = []
        # Admitted but not committed yet, and kept in total: a refresh's count cannot see the
        # first, nor those kept while it reads, so it adds them back (see refresh_queue_depth).
        self._admitting = 0
        self._kept = 0

    @contextlib.contextmanager
    def admit(self, steps: int, *, limit: int | None) -> Iterator[Admission]:
        """Admission control: reserve room for `steps` more queued steps, or QueueFullError.

        The reservation counts at once (concurrent submits cannot all squeeze through before
        the next refresh) and is given back if the body raises or `keep` is set false (an
        idempotent replay added nothing). Each replica counts its own submits between
        refreshes, so N replicas may overshoot by what they accept in one refresh interval.
        """
        admission = Admission()
        if limit is None:
            yield admission
            return
        if self.queue_depth + steps > limit:
            raise QueueFullError(self.queue_depth, limit)
        self.queue_depth += steps
        self._admitting += steps
        try:
            yield admission
        except BaseException:
            self.queue_depth -= steps
            raise
        finally:
            self._admitting -= steps
        if admission.keep:
            self._kept += steps
        else:
            self.queue_depth -= steps

    async def refresh_queue_depth(self) -> int:
        """Count the queue for admission control, and set its gauges (one grouped query).

        The count misses submits still in their transaction and may miss those that commit
        while it reads; both are added back, so the limit holds. One that committed before the
        snapshot counts twice until the next refresh: admission errs on the side of refusing.
        """
        now = datetime.now(UTC)
        kept_before = self._kept
        async with self._db.transaction() as conn:
            queued = await steps.queued_groups(conn, now=now)
        self.queued = queued
        counted = sum(q.depth for q in queued)
        self.queue_depth = counted + self._admitting + (self._kept - kept_before)
        self.metrics.queue(queued, tools=self._registry.catalog, now=now)
        return self.queue_depth
