"""Hand-off: a new task's ready step goes straight to a poller that is waiting for its connector.

An executor's poll that finds the queue empty waits on this replica. A submit on the same
replica that makes a step of that connector ready may then lease the step to the waiting poller
in the submit's own transaction: the row is inserted already leased, with its lease event and its
task started, and handed over once the transaction commits. No claim statement, no commit of its
own, no wake-up: one commit fewer per task and a start as soon as the submit is durable (Temporal
calls this a sync match).

It happens only where a claim would lease that step at once, and in the same way:
- on Postgres, to a poller with a session whose scope takes the step's tool and tenant and that
  has room for it;
- for a tool with no concurrency cap, per-key cap, breaker or rate limit;
- when the poller has seen no wake-up since it found the queue empty (else older steps may be
  queued for it: they go first);
- and, checked by the commit itself, while the pollers' sessions live and no tool of the handed
  steps is paused. A submit whose check fails raises `HandOffRefused`, having written nothing,
  and is made again without hand-off.

A poller does not return while steps promised to it are in a transaction still running. If one
is lost all the same (its poll was cancelled, the executor went away), the lease is the session's
like any other: the heartbeat after that poll releases it, or the session's end does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_reach.states import StepStatus, TaskStatus, Transition
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.sessions import Session
from agent_reach_controller.storage import claims
from agent_reach_controller.storage.advance_writes import NewTask
from agent_reach_controller.storage.engine import Connection, before_commit, on_commit, undone
from agent_reach_controller.storage.wakeups import Notifier
from agent_reach_controller.tools.catalog import ToolSpec

# How long a poller waits, at most, for the transactions that promised it steps to end.
SETTLE_WITHIN = 10.0


class HandOffRefused(Exception):
    """A submit's hand-off found a poller's session ended or a tool paused: nothing was written."""


@dataclass(eq=False, slots=True, kw_only=True)
class Waiter:
    """A poll waiting on this replica for steps of its connectors."""

    session: Session
    connectors: frozenset[str]
    limit: int
    poll_seq: int
    keys: tuple[str, ...]  # the wake-up counters it waits on
    since: tuple[int, ...]  # their values when it found the queue empty
    offered: list[StepRow] = field(default_factory=list)
    promised: int = 0  # steps leased to it in transactions not yet ended
    open: bool = True

    def settled(self) -> bool:
        """Whether it has steps and none still on their way."""
        return bool(self.offered) and not self.promised

    def takes(self, step: Mapping[str, Any]) -> bool:
        """Whether it has room for this step (a row as decided) and may run it."""
        scope = self.session.scope
        return (
            self.open
            and len(self.offered) + self.promised < self.limit
            and step["connector"] in self.connectors
            and (scope.tenant is None or scope.tenant == step["tenant"])
            and scope.allows_tool(step["tool"])
        )

    @property
    def who(self) -> dict[str, str]:
        """How the lease event names the holder (as a claim's does)."""
        return {"executor_id": self.session.executor_id, "session": self.session.id}


def governed(tool: ToolSpec) -> bool:
    """Whether leasing a step of this tool reads more than the queue: a concurrency cap, a
    per-key cap, a breaker or a rate limit (claims read those first; nothing is handed off)."""
    return (
        tool.concurrency is not None
        or tool.concurrency_per_key is not None
        or tool.breaker is not None
        or tool.rate_limit is not None
    )


class HandOff:
    """The pollers waiting on this replica, and the leases submits offer them."""

    def __init__(self, *, registry: ToolRegistry, notifier: Notifier) -> None:
        self._registry = registry
        self._notifier = notifier
        self._waiters: list[Waiter] = []
        self._nudges: set[asyncio.Task[None]] = set()
        self.handed = 0  # steps handed over

    @property
    def waiting(self) -> int:
        """How many polls wait here for steps now."""
        return len(self._waiters)

    @property
    def promised(self) -> int:
        """Steps promised to waiting polls by transactions not yet ended."""
        return sum(w.promised for w in self._waiters)

    @contextlib.asynccontextmanager
    async def offers_to(self, waiter: Waiter) -> AsyncIterator[Waiter]:
        """Offer steps to `waiter` for the life of the block; on leaving, wait (a bounded
        while) for those promised to it to arrive. A block that raises (its call was cancelled)
        waits for nothing: what was promised is the session's to release."""
        self._waiters.append(waiter)
        try:
            yield waiter
        except BaseException:
            waiter.open = False
            raise
        finally:
            self._waiters.remove(waiter)
        try:
            await self._settle(waiter)
        finally:
            waiter.open = False

    async def _settle(self, waiter: Waiter) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WITHIN
        while waiter.promised and (left := deadline - loop.time()) > 0:
            since = self._notifier.snapshot(())
            await self._notifier.wait((), since, within=left, until=lambda: not waiter.promised)

    async def offer(self, conn: Connection, new: NewTask, now: datetime) -> None:
        """Lease what a waiting poller can take of `new`'s ready steps, in its transaction."""
        if not self._waiters:
            return
        taken: list[tuple[StepRow, Waiter]] = []
        for key, row in new.rows():
            if row["status"] != StepStatus.READY or (row.get("not_before") or now) > now:
                continue
            if governed(self._registry.get(row["tool"], row["tool_version"])):
                continue
            waiter = self._waiter_for(row)
            if waiter is not None:
                waiter.promised += 1
                taken.append((new.step_row(key), waiter))
        if not taken:
            return
        undone(conn, lambda: self._withdraw(taken))
        await new.change_steps([_lease(step, waiter, now) for step, waiter in taken], now=now)
        task = new.task_row()
        if task.status is TaskStatus.PENDING:
            await new.set_task_status(task, TaskStatus.RUNNING, now=now)
        new.want_keys(step.id for step, _ in taken)

        async def guard(conn: Connection) -> None:
            claims.expect_hand_off(
                conn,
                sessions=[w.session.id for _, w in taken],
                tools=[s.tool for s, _ in taken],
                now=now,
                refusal=HandOffRefused,
            )

        before_commit(conn, guard)

        async def deliver() -> None:
            for step, waiter in taken:
                waiter.promised -= 1
                if waiter.open:
                    waiter.offered.append(new.step_row(step.id, queued_at=now))
            self.handed += len(taken)
            await self._notifier.nudge()

        on_commit(conn, deliver)

    def _waiter_for(self, step: Mapping[str, Any]) -> Waiter | None:
        """A poller that can take `step` and has seen no wake-up since it found nothing; the
        one chosen goes to the back of the line."""
        for i, waiter in enumerate(self._waiters):
            if waiter.takes(step) and self._notifier.snapshot(waiter.keys) == waiter.since:
                self._waiters.append(self._waiters.pop(i))
                return waiter
        return None

    def _withdraw(self, taken: Sequence[tuple[StepRow, Waiter]]) -> None:
        """The transaction did not commit: its promises are void."""
        for _, waiter in taken:
            waiter.promised -= 1
        nudge = asyncio.get_running_loop().create_task(self._notifier.nudge())
        self._nudges.add(nudge)
        nudge.add_done_callback(self._nudges.discard)


def _lease(step: StepRow, waiter: Waiter, now: datetime) -> StepChange:
    """The lease a claim by `waiter` would take (storage/claims.py, CLAIM_READY)."""
    return StepChange(
        step=step,
        transition=Transition.LEASE,
        values={
            "lease_owner": waiter.session.id,
            "lease_expires_at": None,  # the session's liveness is the lease's
            "lease_seq": waiter.poll_seq or None,
            "started_at": now,
        },
        event_data=waiter.who,
    )
