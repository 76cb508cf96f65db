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

A poll that claims after a wake-up, having found the queue empty before, takes a hand-off too
while its claim runs: a submit made then would otherwise find no poll waiting and queue its step
with a wake-up, whose claim would leave the next submit without a waiting poll in turn (one
submitter at a time then never got out of that cycle). The claim leaves room for one step (it
asks one fewer than the poll may take), and a submit that leases it a step waits, before its
commit, for that claim to end (CLAIM_WITHIN at most): it commits only if the claim drained the
queue (leased fewer steps than it asked), else older steps may still be queued, and it is made
again without hand-off. Polls that wait are offered steps before polls that claim.

A poller does not return while steps promised to it are in a transaction still running. If one
is lost all the same (its poll was cancelled, the executor went away), the lease is the session's
like any other: the heartbeat after that poll releases it, or the session's end does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_reach.states import StepStatus, TaskStatus, Transition
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.services.held import HeldLeases
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.sessions import Session
from agent_reach_controller.storage import claims
from agent_reach_controller.storage.advance_writes import NewTask
from agent_reach_controller.storage.engine import Connection, before_commit, on_commit, undone
from agent_reach_controller.storage.wakeups import Notifier
from agent_reach_controller.tools.catalog import ToolSpec

# How long a poller waits, at most, for the transactions that promised it steps to end.
SETTLE_WITHIN = 10.0
# How long a submit that leased a step to a claiming poll waits, at most, for that claim to end
# (past it the step is queued instead: a claim waiting for a connection held by the submit would
# otherwise never end).
CLAIM_WITHIN = 1.0


class HandOffRefused(Exception):
    """A submit's hand-off found a poller's session ended, a tool paused or a claiming poll's
    queue not drained: nothing was written."""


@dataclass(eq=False, slots=True, kw_only=True)
class Waiter:
    """A poll waiting (or claiming) on this replica for steps of its connectors."""

    session: Session
    connectors: frozenset[str]
    limit: int  # how many steps it may be handed
    poll_seq: int
    keys: tuple[str, ...]  # the wake-up counters it waits on
    since: tuple[int, ...]  # their values when it found the queue empty (or began its claim)
    offered: list[StepRow] = field(default_factory=list)
    promised: int = 0  # steps leased to it in transactions not yet ended
    open: bool = True
    # A poll claiming meanwhile: whether its claim drained the queue, once that claim has ended.
    claim: asyncio.Future[bool] | None = None

    @property
    def claiming(self) -> bool:
        """Whether it is a poll claiming meanwhile (not one waiting)."""
        return self.claim is not None

    def claimed(self, *, drained: bool) -> None:
        """Its claim has ended: the submits that leased it steps meanwhile may commit if
        `drained`, and are refused if not."""
        if self.claim is not None and not self.claim.done():
            self.claim.set_result(drained)

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

    def __init__(
        self, *, registry: ToolRegistry, notifier: Notifier, held: HeldLeases | None = None
    ) -> None:
        self._registry = registry
        self._notifier = notifier
        self._held = held  # where the rows of a one-step task's lease are kept for its report
        self._waiters: list[Waiter] = []
        self._nudges: set[asyncio.Task[None]] = set()
        self.handed = 0  # steps handed over

    @property
    def waiting(self) -> int:
        """How many polls wait here for steps now."""
        return sum(not w.claiming for w in self._waiters)

    @property
    def claiming(self) -> int:
        """How many polls take steps here while their claim runs."""
        return sum(w.claiming for w in self._waiters)

    @property
    def promised(self) -> int:
        """Steps promised to waiting polls by transactions not yet ended."""
        return sum(w.promised for w in self._waiters)

    @contextlib.asynccontextmanager
    async def offers_to(self, waiter: Waiter) -> AsyncIterator[Waiter]:
        """Offer steps to `waiter` for the life of the block; on leaving, wait (a bounded
        while) for those promised to it to arrive. A block that raises (its call was cancelled)
        waits for nothing: what was promised is the session's to release. A claim the block
        leaves without saying how it ended (`Waiter.claimed`) refuses what it was offered."""
        self._waiters.append(waiter)
        try:
            yield waiter
        except BaseException:
            waiter.open = False
            raise
        finally:
            self._waiters.remove(waiter)
            waiter.claimed(drained=False)
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

        before_commit(conn, functools.partial(_expect_taken, taken=taken, now=now))

        # The rows of a one-step task's lease are kept for its report (services/held.py).
        held = self._held if sum(1 for _ in new.rows()) == 1 else None

        async def deliver() -> None:
            for step, waiter in taken:
                waiter.promised -= 1
                if waiter.open:
                    leased = new.step_row(step.id, queued_at=now)
                    waiter.offered.append(leased)
                    if held is not None:
                        held.remember(new.task_row(), leased)
            self.handed += len(taken)
            await self._notifier.nudge()

        on_commit(conn, deliver)

    def _waiter_for(self, step: Mapping[str, Any]) -> Waiter | None:
        """A poller that can take `step` and has seen no wake-up since it found nothing (or
        began its claim), waiting ones first (they take it at once); the one chosen goes to the
        back of the line."""
        for waiter in sorted(self._waiters, key=lambda w: w.claiming):
            if waiter.takes(step) and self._notifier.snapshot(waiter.keys) == waiter.since:
                self._waiters.remove(waiter)
                self._waiters.append(waiter)
                return waiter
        return None

    def _withdraw(self, taken: Sequence[tuple[StepRow, Waiter]]) -> None:
        """The transaction did not commit: its promises are void."""
        for _, waiter in taken:
            waiter.promised -= 1
        nudge = asyncio.get_running_loop().create_task(self._notifier.nudge())
        self._nudges.add(nudge)
        nudge.add_done_callback(self._nudges.discard)


async def _expect_taken(
    conn: Connection, *, taken: Sequence[tuple[StepRow, Waiter]], now: datetime
) -> None:
    """The commit's guard: the steps go to their pollers only as a claim would lease them then
    (services/handoff.py), else `HandOffRefused`."""
    if not await _claims_drained({w for _, w in taken}):
        raise HandOffRefused
    claims.expect_hand_off(
        conn,
        sessions=[w.session.id for _, w in taken],
        tools=[s.tool for s, _ in taken],
        now=now,
        refusal=HandOffRefused,
    )


async def _claims_drained(waiters: Iterable[Waiter]) -> bool:
    """Whether the claims of those of `waiters` that were claiming all drained the queue, as
    they said within CLAIM_WITHIN of now (a claim that fills what it asked for may have left
    older steps queued: they go first)."""
    running = [w.claim for w in waiters if w.claim is not None]
    if running:
        await asyncio.wait(running, timeout=CLAIM_WITHIN)
    return all(claim.done() and claim.result() for claim in running)


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
