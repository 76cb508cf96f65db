"""Retention: what finished long enough ago is deleted, a small batch per transaction, by a
background sweep on every replica (two replicas skip each other's rows); and, separately, the
oldest sealed audit entries, behind a checkpoint the chain is verified from."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta

from agent_reach_controller.audit import log as audit
from agent_reach_controller.storage import retention as storage
from agent_reach_controller.storage.engine import Database

log = logging.getLogger(__name__)


class RetentionService:
    def __init__(
        self,
        *,
        db: Database,
        days: float,
        batch: int,
        audit_days: float = 0.0,
        max_batches: int = 20,
    ) -> None:
        self._db = db
        self._keep = timedelta(days=days) if days > 0 else None
        self._keep_audit = timedelta(days=audit_days) if audit_days > 0 else None
        self._batch = batch
        self._max_batches = max_batches  # per run: the next run goes on where this one stopped

    @property
    def enabled(self) -> bool:
        return self._keep is not None or self._keep_audit is not None

    async def prune(self, *, now: datetime | None = None) -> dict[str, int]:
        """One run: batches until nothing is left past retention or `max_batches` are done."""
        now = now or datetime.now(UTC)
        total: Counter[str] = Counter()
        if self._keep_audit is not None:
            _, removed = await audit.prune(
                self._db, before=now - self._keep_audit, limit=self._batch * self._max_batches
            )
            total["audit_log"] += removed
        if self._keep is not None:
            await self._prune_tasks(now - self._keep, total)
        pruned = {table: n for table, n in total.items() if n}
        if pruned:
            log.info(
                "retention: deleted %s",
                ", ".join(f"{n} {table}" for table, n in sorted(pruned.items())),
                extra={"event": "retention_pruned", "deleted": pruned},
            )
        return pruned

    async def _prune_tasks(self, before: datetime, total: Counter[str]) -> None:
        for _ in range(self._max_batches):
            async with self._db.transaction() as conn:
                deleted = await storage.prune_finished_tasks(conn, before=before, limit=self._batch)
            total.update(deleted)
            if deleted.get("tasks", 0) < self._batch:
                break
        for _ in range(self._max_batches):
            async with self._db.transaction() as conn:
                deleted = await storage.prune_finished_runs(conn, before=before, limit=self._batch)
            total.update(deleted)
            if deleted.get("runs", 0) < self._batch:
                break
        async with self._db.transaction() as conn:
            total["webhook_outbox"] += await storage.prune_webhook_deliveries(
                conn, before=before, limit=self._batch * self._max_batches
            )
