"""Leases after they are taken: heartbeats, their holders' sessions ending, foreign claims.

A session's leases live as long as the session: one heartbeat per executor process keeps all of
them, nothing is written per step. When a session ends (its heartbeats stopped, its token was
revoked) what it held goes back to the queue as for a lost lease; a lease the executor never
received (the poll reply died with a controller) goes back at its next heartbeat, as not run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from agent_reach.states import StepStatus
from agent_reach_controller.decide.outcomes import (
    Decision,
    decide_lease_expiry,
    decide_undelivered,
)
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.sessions import Session, SessionService
from agent_reach_controller.storage import events as event_log
from agent_reach_controller.storage import sessions as session_rows
from agent_reach_controller.storage import steps
from agent_reach_controller.storage.engine import Connection, Database

log = logging.getLogger(__name__)

Decide = Callable[[StepRow, Decision], StepChange]
# UnitOfWork.settle: decide the steps still `due` once their tasks are locked, and advance.
Settle = Callable[..., Awaitable[int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatOutcome:
    extended: list[tuple[int, int]]
    cancelled: list[tuple[int, int]]
    lost: list[tuple[int, int]]
    expires_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """A report or heartbeat quoting a lease the caller may not act on."""

    step: StepRow | None
    attempt: int
    reason: str
    holder: str
    call: str
    session: Session | None = None

    @property
    def who(self) -> dict[str, str]:
        """How events name the caller: the executor, and its session if it has one."""
        if self.session is None:
            return {"executor_id": self.holder}
        return {"executor_id": self.session.executor_id, "session": self.session.id}


class LeaseKeeper:
    """Heartbeats and the end of sessions. Safe to run in every replica at once."""

    def __init__(
        self,
        *,
        db: Database,
        sessions: SessionService | None,
        lease_seconds: float,
        metrics: ControllerMetrics,
        settle: Settle,
    ) -> None:
        self._db = db
        self.sessions = sessions
        self._lease_seconds = lease_seconds
        self._metrics = metrics
        self._settle = settle
        # Since when every transaction here has worked (monotonic), or None during an outage:
        # nobody's heartbeat can be recorded then, so sessions do not expire until storage has
        # been back for a whole lease (see `reap_sessions`).
        self._storage_ok_since: float | None = time.monotonic()
        self._last_sweep = time.monotonic()

    async def heartbeat(
        self,
        *,
        session: Session,
        leases: Sequence[tuple[int, int]],
        forged: Sequence[tuple[int, int]] = (),
        polls_completed: int = 0,
    ) -> HeartbeatOutcome:
        """Keep a session alive; say which of its leases were cancelled and which it lost.

        Its leases the executor does not list, taken by a poll it says has completed, are
        released at once. Leases quoted with a token this session was not given (`forged`), or
        held by someone else, are refused, counted and recorded.
        """
        assert self.sessions is not None
        now = datetime.now(UTC)
        listed = {key for key, _ in leases}
        async with self._db.transaction() as conn:
            expires = await self.sessions.touch(conn, session.id, now=now)
            current = await steps.load_steps_by_key(conn, {k for k, _ in [*leases, *forged]})
            held = await session_rows.held_leases(conn, session.id)
            extended: list[tuple[int, int]] = []
            cancelled: list[tuple[int, int]] = []
            lost: list[tuple[int, int]] = list(forged)
            refusals = [
                Refusal(
                    step=current.get(k),
                    attempt=a,
                    reason="not_lease_holder",
                    holder=session.id,
                    call="heartbeat",
                    session=session,
                )
                for k, a in forged
            ]
            for key, attempt in leases:
                step = current.get(key)
                mine = step is not None and step.attempt == attempt
                if mine and step is not None and step.lease_owner == session.id:
                    if step.status is StepStatus.RUNNING:
                        extended.append((key, attempt))
                        continue
                    if step.status is StepStatus.CANCELLED:
                        cancelled.append((key, attempt))
                        continue
                elif held_by_another(step, attempt, session.id):
                    refusals.append(
                        Refusal(
                            step=step,
                            attempt=attempt,
                            reason="not_lease_holder",
                            holder=session.id,
                            call="heartbeat",
                            session=session,
                        )
                    )
                lost.append((key, attempt))
            for refusal in refusals:
                await record_refusal(conn, refusal, metrics=self._metrics, now=now)
            undelivered = {
                key: attempt
                for key, attempt, seq in held
                if key not in listed and seq is not None and seq <= polls_completed
            }
        if undelivered:
            await self.release(
                undelivered,
                owner=session.id,
                why="its executor never received them",
                decide=decide_undelivered,
            )
        return HeartbeatOutcome(
            extended=sorted(extended), cancelled=cancelled, lost=lost, expires_at=expires
        )

    async def extend(
        self, *, holder: str, leases: Sequence[tuple[int, int]], expires: datetime
    ) -> HeartbeatOutcome:
        """A holder without a session (in-process): extend each lease it holds, row by row."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            extended = await steps.extend_leases(
                conn, executor_id=holder, leases=leases, expires_at=expires
            )
            rest = [lease for lease in leases if lease not in extended]
            current = await steps.load_steps_by_key(conn, (key for key, _ in rest))
            cancelled, lost = [], []
            for key, attempt in rest:
                step = current.get(key)
                cancelled_here = step is not None and step.status is StepStatus.CANCELLED
                if cancelled_here and step is not None and step.attempt == attempt:
                    cancelled.append((key, attempt))
                    continue
                if held_by_another(step, attempt, holder):
                    refusal = Refusal(
                        step=step,
                        attempt=attempt,
                        reason="not_lease_holder",
                        holder=holder,
                        call="heartbeat",
                    )
                    await record_refusal(conn, refusal, metrics=self._metrics, now=now)
                lost.append((key, attempt))
        return HeartbeatOutcome(
            extended=sorted(extended), cancelled=cancelled, lost=lost, expires_at=expires
        )

    # -- the end of sessions ----------------------------------------------------------------------

    def storage_down(self) -> None:
        """Storage failed here: hold session expiry until it has been back for a whole lease."""
        self._storage_ok_since = None

    def _storage_settled(self) -> bool:
        """Whether storage has worked for a whole lease (call after a successful statement).

        A long gap since the previous sweep counts as an outage too (a database that hung
        instead of failing, a stalled process): heartbeats may have gone unrecorded meanwhile.
        """
        now = time.monotonic()
        if self._storage_ok_since is None or now - self._last_sweep > self._lease_seconds / 2:
            self._storage_ok_since = now
        self._last_sweep = now
        return now - self._storage_ok_since >= self._lease_seconds

    async def reap_sessions(self, *, limit: int = 500) -> int:
        """End sessions whose heartbeats stopped; re-queue (or fail) what they held.

        Any replica may run this. After a storage outage nobody's heartbeat could be recorded,
        so expiry waits until storage has been back for a whole lease (no re-run for an outage).
        """
        if self.sessions is None:
            return 0
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            orphans = await session_rows.orphaned_steps(conn, limit=limit)
            settled = self._storage_settled()
            expired = await self.sessions.end_expired(conn, now=now) if settled else []
            held = await steps.load_steps_by_key(
                conn, [*orphans, *await session_rows.held_steps(conn, expired)]
            )
        self._metrics.sessions_ended("expired", len(expired))
        if expired:
            log.warning(
                "%d executor sessions stopped heartbeating; releasing their leases",
                len(expired),
                extra={"event": "session_expired", "sessions": expired},
            )
        released = await self._release_all(held.values(), why="its session ended")
        self._metrics.leases_expired(released)
        return released

    async def _release_all(self, held: Iterable[StepRow], *, why: str) -> int:
        rows = list(held)
        released = 0
        for owner in sorted({s.lease_owner or "" for s in rows}):
            mine = {s.id: s.attempt for s in rows if s.lease_owner == owner}
            released += await self.release(mine, owner=owner, why=why)
        return released

    async def release(
        self,
        leases: dict[int, int],
        *,
        owner: str,
        why: str,
        decide: Decide = decide_lease_expiry,
    ) -> int:
        """Treat these leases of `owner` as lost (as when a lease expires), if still its."""
        released: int = await self._settle(
            list(leases),
            now=datetime.now(UTC),
            due=lambda s: (
                s.status is StepStatus.RUNNING
                and s.lease_owner == owner
                and leases.get(s.id) == s.attempt
            ),
            decide=decide,
        )
        if released:
            log.warning(
                "released %d leases of %s: %s",
                released,
                owner,
                why,
                extra={"event": "leases_released", "holder": owner, "reason": why},
            )
        return released


def held_by_another(step: StepRow | None, attempt: int, holder: str) -> bool:
    """Whether this attempt is running under someone else's lease (a foreign claim on it)."""
    return (
        step is not None
        and step.status is StepStatus.RUNNING
        and step.attempt == attempt
        and step.lease_owner != holder
    )


async def record_refusal(
    conn: Connection, refusal: Refusal, *, metrics: ControllerMetrics, now: datetime
) -> None:
    """Count a refused report or heartbeat, and record it in the step's events if it has one:
    the audit trail shows every late, repeated or foreign claim on a lease."""
    step = refusal.step
    if step is not None:
        await event_log.append_events(
            conn,
            [
                event_log.NewEvent(
                    task_id=step.task_id,
                    step_id=step.step_id,
                    kind="result_rejected",
                    attempt=refusal.attempt,
                    data={**refusal.who, "reason": refusal.reason, "call": refusal.call},
                    created_at=now,
                )
            ],
        )
    metrics.rejected(conn, refusal.reason)
    log.log(
        logging.WARNING if refusal.reason == "not_lease_holder" else logging.INFO,
        "refused a %s for step %s attempt %s from %s: %s",
        refusal.call,
        f"{step.task_id}/{step.step_id}" if step else "(unknown)",
        refusal.attempt,
        refusal.holder,
        refusal.reason,
        extra={
            "event": "result_rejected",
            "task_id": step.task_id if step else None,
            "step_id": step.step_id if step else None,
            "reason": refusal.reason,
        },
    )
