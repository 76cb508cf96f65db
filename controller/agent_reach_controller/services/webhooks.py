"""Approval requests and task ends announced to webhooks, through an outbox.

An approval request is written to `webhook_outbox` in the same transaction that makes the step
wait for approval, and a task's end (`task.finished`, to the URL its submit named) in the one
that ends it, so nothing is announced for a change that rolled back, nor lost by a crash after
the commit. Senders in every replica take due rows (SKIP LOCKED on Postgres), moving their
due time forward first so that a sender dying mid-send only delays the retry, then POST them.

Delivery is at least once, signed as Standard Webhooks prescribe (`webhook-id`,
`webhook-timestamp`, `webhook-signature`; the `standardwebhooks` package signs, and verifies on
the receiving side); receivers drop repeats by `webhook-id`. A non-2xx answer or a failed call is
tried again with capped, jittered backoff until the approval expires or the attempts run out.
The URL may carry a token: it never reaches a log, an error row or a receipt.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from standardwebhooks.webhooks import Webhook

from agent_reach.times import rfc3339
from agent_reach_controller.domain.records import StepChange, TaskRow
from agent_reach_controller.storage import webhooks as outbox
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.webhooks import OutboxRow
from agent_reach_controller.tools.catalog import RetryPolicy, backoff_delay

log = logging.getLogger(__name__)
APPROVAL_REQUESTED = "approval.requested"
TASK_FINISHED = "task.finished"
USER_AGENT = "agent-reach-webhooks/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookTarget:
    """Where requests go and how hard to try."""

    url: str
    secret: str | None = None
    timeout: float = 10.0
    max_attempts: int = 25
    backoff: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(initial_interval=1.0, maximum_interval=300.0)
    )


# Delivered and given-up requests stay this long (to look into), then the sender deletes them.
KEEP_FINISHED = timedelta(days=7)
PRUNE_EVERY_S = 600.0


def approval_request(change: StepChange, task: TaskRow) -> dict[str, Any]:
    """What an approver needs to decide, and where to answer: the body of the webhook."""
    step = change.step
    approval = change.values["approval"]
    args = step.resolved_args if step.resolved_args is not None else step.args
    decide_by: datetime = change.values["decide_by"]
    return {
        "type": APPROVAL_REQUESTED,
        "task_id": step.task_id,
        "step_id": step.step_id,
        "tool": step.tool,
        "tool_version": step.tool_version,
        "args": args,
        "args_hash": approval["args_hash"],
        "requested_by": task.principal,
        "tenant": task.tenant,
        "environment": step.environment,
        "trace_id": task.trace_id,
        "requested_at": approval["requested_at"],
        "decide_by": rfc3339(decide_by),
        "decide_at": f"/v1/tasks/{step.task_id}/steps/{step.step_id}/approval",
    }


def task_finished(task: TaskRow) -> dict[str, Any]:
    """What a task's webhook is told when it ends: which task, how, and where to read it."""
    return {
        "type": TASK_FINISHED,
        "task_id": task.task_id,
        "status": task.status,
        "source": task.source,
        "tenant": task.tenant,
        "trace_id": task.trace_id,
        "finished_at": rfc3339(task.finished_at) if task.finished_at else None,
        "task_url": f"/v1/tasks/{task.task_id}",
        "replies_url": None if task.source == "plan" else f"/v1/tasks/{task.task_id}/replies",
    }


class WebhookSender:
    """The outbox of approval requests and task ends, and its sender.

    `approvals` is the approval webhook (None: approval requests are not announced); `tasks`
    signs and paces deliveries to tasks' own webhooks (its `url` is unused: each has its own).
    """

    def __init__(
        self,
        db: Database,
        target: WebhookTarget | None,
        *,
        tasks: WebhookTarget | None = None,
    ) -> None:
        self._db = db
        self._approvals = target
        self._tasks = tasks
        self._signers = {
            kind: Webhook(t.secret) if t is not None and t.secret else None
            for kind, t in ((APPROVAL_REQUESTED, target), (TASK_FINISHED, tasks))
        }
        self._timeout = max(t.timeout for t in (target, tasks) if t is not None)
        self._client = httpx.AsyncClient(
            timeout=self._timeout,
            follow_redirects=False,
            headers={"User-Agent": USER_AGENT},
        )
        self._rng = random.Random()
        self.delivered = 0
        self.failed_attempts = 0

    async def close(self) -> None:
        await self._client.aclose()

    @property
    def announces_approvals(self) -> bool:
        return self._approvals is not None

    async def finished(self, conn: Connection, tasks: Sequence[TaskRow]) -> None:
        """A `task.finished` delivery for each of these tasks that names a webhook, written
        inside the caller's transaction (the one that ends them)."""
        if self._tasks is None:
            return
        now = datetime.now(UTC)
        for task in tasks:
            if task.webhook_url:
                await outbox.add_requests(
                    conn,
                    [(TASK_FINISHED, task_finished(task), None)],
                    now=now,
                    url=task.webhook_url,
                )

    def _target(self, row: OutboxRow) -> WebhookTarget | None:
        return self._tasks if row.url is not None else self._approvals

    async def enqueue(
        self, conn: Connection, requests: Sequence[tuple[dict[str, Any], datetime]]
    ) -> None:
        """Write (payload, expires_at) approval rows inside the caller's transaction."""
        if not requests or self._approvals is None:
            return
        now = datetime.now(UTC)
        await outbox.add_requests(
            conn,
            [(payload["type"], payload, expires_at) for payload, expires_at in requests],
            now=now,
        )

    async def deliver_due(self, *, limit: int = 20) -> int:
        """Send what is due now; returns how many were acknowledged."""
        now = datetime.now(UTC)
        taken = await self._take(now, limit)
        if not taken:
            return 0
        answers = await asyncio.gather(*(self._send(row) for row in taken))
        await self._record(list(zip(taken, answers, strict=True)))
        return sum(1 for error in answers if error is None)

    async def _take(self, now: datetime, limit: int) -> list[OutboxRow]:
        async with self._db.transaction() as conn:
            rows = await outbox.due_requests(conn, now=now, limit=limit)
            # A lease: nobody else sends these until this attempt had its chance.
            await outbox.lease_requests(
                conn,
                [r.id for r in rows],
                due_at=now + timedelta(seconds=self._timeout * 2 + 5),
            )
        return rows

    async def _send(self, row: OutboxRow) -> str | None:
        """POST one delivery; None when acknowledged, else why not (no URL, no body)."""
        target = self._target(row)
        url = row.url or (target.url if target is not None else None)
        if target is None or not url:
            return "no webhook is configured for it"
        body = json.dumps(row.payload, separators=(",", ":"), ensure_ascii=False)
        message_id = f"msg_{'task' if row.url else 'approval'}_{row.id}"
        sent_at = datetime.now(UTC)
        headers = {
            "Content-Type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(int(sent_at.timestamp())),
        }
        signer = self._signers[TASK_FINISHED if row.url else APPROVAL_REQUESTED]
        if signer is not None:
            headers["webhook-signature"] = signer.sign(message_id, sent_at, body)
        try:
            response = await self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return type(exc).__name__  # an exception's text may quote the URL
        if response.is_success:
            return None
        return f"HTTP {response.status_code}"

    async def _record(self, outcomes: list[tuple[OutboxRow, str | None]]) -> None:
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            for row, error in outcomes:
                attempts = row.attempts + 1
                if error is None:
                    self.delivered += 1
                    await outbox.mark_delivered(conn, row.id, now=now)
                    continue
                self.failed_attempts += 1
                target = self._target(row) or WebhookTarget(url="")
                due = now + timedelta(
                    seconds=backoff_delay(target.backoff, attempts, rng=self._rng)
                )
                give_up = attempts >= target.max_attempts or (
                    row.expires_at is not None and due >= row.expires_at
                )
                log.warning(
                    "%s webhook delivery %s failed (attempt %d): %s%s",
                    row.kind,
                    row.id,
                    attempts,
                    error,
                    "; giving up" if give_up else "",
                    extra={"event": "webhook_failed"},
                )
                await outbox.mark_failed(
                    conn,
                    row.id,
                    due_at=due,
                    error=error[:300],
                    given_up_at=now if give_up else None,
                )

    async def prune(self, *, kept: timedelta = KEEP_FINISHED) -> int:
        """Delete requests delivered or given up more than `kept` ago; returns how many."""
        before = datetime.now(UTC) - kept
        async with self._db.transaction() as conn:
            return await outbox.delete_finished(conn, before=before)

    async def run_forever(self, *, interval: float = 0.5) -> None:
        """Deliver due requests for the life of the process; prune finished ones now and then."""
        loop = asyncio.get_running_loop()
        pruned_at = -math.inf
        while True:
            try:
                while await self.deliver_due() > 0:
                    pass
                if loop.time() - pruned_at >= PRUNE_EVERY_S:
                    pruned_at = loop.time()
                    await self.prune()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook sender failed; retrying", extra={"event": "webhook_error"})
            await asyncio.sleep(interval)
