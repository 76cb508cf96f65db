"""Dispatch use cases: lease ready steps, extend leases, record results, reap expired leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from agent_reach.errors import ErrorCode
from agent_reach.states import StepStatus, Transition
from agent_reach_controller.decide import approvals, breakers
from agent_reach_controller.decide.outcomes import (
    AttemptResult,
    Budget,
    Decision,
    breaker_open,
    decide_lease_expiry,
    decide_result,
    not_permitted,
    not_started,
)
from agent_reach_controller.decide.ratelimits import Rate, bucket_key
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.caps import CapService, TenantCapsLookup
from agent_reach_controller.services.leases import (
    HeartbeatOutcome,
    LeaseKeeper,
    Refusal,
    record_refusal,
)
from agent_reach_controller.services.limiter import MemoryLimiter, RateLimiter, SqlLimiter
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.sessions import Session, SessionService
from agent_reach_controller.services.tasks import TaskService
from agent_reach_controller.services.tool_health import ToolHealth
from agent_reach_controller.storage import claims, flow, steps
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.records import StepChange, StepRow
from agent_reach_controller.storage.wakeups import Notifier, ready_key
from agent_reach_controller.tools.catalog import ToolSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTimings:
    # How long a lease outlives its holder's last heartbeat: an executor session's liveness.
    lease: timedelta = timedelta(seconds=30)
    max_poll_wait: float = 20.0
    # Upper bound on a poller's sleep between checks when no wake-up arrives (a safety net).
    recheck: float = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    step_key: int
    attempt: int
    accepted: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who reports results: a lease holder, with its session if it has one."""

    holder: str
    session: Session | None = None

    def holds(self, step: StepRow, result: AttemptResult) -> bool:
        """Whether the step's lease is the caller's (and, for a session, the token its own)."""
        if step.lease_owner != self.holder:
            return False
        return self.session is None or self.session.issued(
            result.lease_token, result.step_key, result.attempt
        )


class QueueFullError(Exception):
    """More steps wait for executors than the controller is configured to queue."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"{depth:,} steps are waiting for executors; the limit is {limit:,}")


@dataclass(slots=True)
class Admission:
    keep: bool = True


class GrantCheck(Protocol):
    async def refusal(self, key_id: str | None, tool: str) -> str | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Guards:
    """What dispatch asks besides the queue: rate-limit buckets, whether submitters still may,
    and each tenant's caps on side effects (`state/caps.py`).

    `limiter` defaults to Postgres when several replicas may dispatch, else this process.
    """

    limiter: RateLimiter
    grants: GrantCheck | None = None
    tenant_caps: TenantCapsLookup | None = None
    metrics: ControllerMetrics | None = None  # where dispatch reports what it does
    # Executor sessions, whose liveness is their leases' (None: holders have no sessions).
    sessions: SessionService | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Governance:
    """What limits a claim: paused tools, caps per tool and per key value, rate limits."""

    pauses: dict[str, datetime]
    caps: dict[str, int]
    per_key: dict[str, int]
    rates: dict[str, Rate]

    @property
    def active(self) -> bool:
        return bool(self.pauses or self.caps or self.per_key or self.rates)


class DispatchService:
    """The controller side of the executor protocol. Safe to run in every replica at once."""

    def __init__(
        self,
        *,
        db: Database,
        registry: ToolRegistry,
        tasks: TaskService,
        notifier: Notifier,
        timings: LeaseTimings,
        guards: Guards | None = None,
    ) -> None:
        self._db = db
        # Postgres when several replicas may dispatch; in this process for embedded SQLite.
        self._guards = guards or Guards(limiter=SqlLimiter() if db.is_postgres else MemoryLimiter())
        self.sessions = self._guards.sessions
        self.metrics = self._guards.metrics or ControllerMetrics()
        self._registry = registry
        self.effect_caps = CapService(
            db=db, registry=registry, tenant_caps=self._guards.tenant_caps
        )
        self._tasks = tasks
        self._notifier = notifier
        self.timings = timings
        self.leases = LeaseKeeper(
            db=db,
            sessions=self.sessions,
            lease_seconds=timings.lease.total_seconds(),
            metrics=self.metrics,
            settle=self._settle,
        )
        self.tool_health = ToolHealth(db=db, registry=registry, metrics=self.metrics)
        self._rng = random.Random()
        # Ready steps across all replicas, refreshed by the background loop (admission control).
        self.queue_depth = 0
        # Admitted but not committed yet, and kept in total: a refresh's count cannot see the
        # first, nor those kept while it reads, so it adds them back (see refresh_queue_depth).
        self._admitting = 0
        self._kept = 0

    def _decision(self, tool: ToolSpec, now: datetime, budget: Budget | None) -> Decision:
        return Decision(
            tool=tool,
            now=now,
            rng=self._rng,
            budget=budget or Budget(),
            tool_named=self._registry.catalog.get,
        )

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
            queued = await steps.queue_by_tool(conn, now=now)
        counted = sum(q.depth for q in queued)
        self.queue_depth = counted + self._admitting + (self._kept - kept_before)
        self.metrics.queue(queued, tools=self._registry.catalog, now=now)
        return self.queue_depth

    async def claim(
        self,
        *,
        executor_id: str,
        connectors: Sequence[str],
        limit: int,
        session: Session | None = None,
        poll_seq: int = 0,
    ) -> list[StepRow]:
        """Lease up to `limit` ready steps now; empty when there are none."""
        claimed, _ = await self._claim(
            executor_id=executor_id,
            connectors=connectors,
            limit=limit,
            session=session,
            poll_seq=poll_seq,
        )
        return claimed

    def _claim_input(
        self,
        *,
        executor_id: str,
        connectors: Sequence[str],
        limit: int,
        session: Session | None,
        poll_seq: int,
    ) -> claims.ClaimInput:
        now = datetime.now(UTC)
        if session is None:
            return claims.ClaimInput(
                executor_id=executor_id,
                connectors=connectors,
                limit=limit,
                now=now,
                lease_expires_at=now + self.timings.lease,
            )
        scope = session.scope
        return claims.ClaimInput(
            executor_id=session.id,
            connectors=connectors,
            limit=limit,
            now=now,
            lease_expires_at=None,  # the session's liveness is the lease's
            exclude_tools=[
                t.name
                for t in self._registry.catalog.values()
                if t.connector in connectors and not scope.allows_tool(t.name)
            ],
            tenant=scope.tenant,
            lease_seq=poll_seq or None,
            executor=session.executor_id,
        )

    async def _claim(
        self,
        *,
        executor_id: str,
        connectors: Sequence[str],
        limit: int,
        session: Session | None = None,
        poll_seq: int = 0,
    ) -> tuple[list[StepRow], datetime | None]:
        """One transaction: lease what is ready, or say when the next deferred step is due.

        A session that ended leases nothing (its heartbeat tells it to register again).
        """
        if limit <= 0 or not connectors:
            return [], None
        async with self._db.transaction() as conn:
            # A tool disabled or paused a moment ago is refused now: both read in one go.
            revision, active = await flow.revision_and_pauses(conn, now=datetime.now(UTC))
            await self._registry.refresh(conn, revision=revision)
            claim = self._claim_input(
                executor_id=executor_id,
                connectors=connectors,
                limit=limit,
                session=session,
                poll_seq=poll_seq,
            )
            now = claim.now
            rules = await self._governance(conn, connectors, now, pauses=active)
            if rules.active:
                claimed = await self._claim_governed(conn, claim, rules)
            else:
                claimed = await claims.claim_ready(conn, claim)
            if not claimed:
                due = await claims.next_due(conn, connectors, now=now)
                paused = rules.pauses.values()
                return [], min([due, *paused] if due else paused, default=None)
            await steps.mark_tasks_running(conn, {s.task_id for s in claimed}, now=now)
            await self.tool_health.start_probes(conn, {s.tool for s in claimed}, now)
        claimed = await self._drop_refused(claimed, executor_id=claim.executor_id)
        self.metrics.leased(claimed, now=now)
        return claimed, None

    async def _drop_refused(self, claimed: list[StepRow], *, executor_id: str) -> list[StepRow]:
        """End, instead of handing out, leased steps that may not run after all.

        A dangerous step needs an approval that is for this step, this tool version and these
        exact arguments; a submitter's key must still be live and granted the tool; the rest are
        charged against their caps, once per step. Checked after the lease commits (refusals are
        rare); if this replica dies in between, the lease expires and the next claim checks again.
        """
        await self._registry.ensure((s.tool, s.tool_version) for s in claimed)
        refused: dict[int, tuple[str, ErrorCode]] = {}
        for step in claimed:
            reason = _withdrawn(self._registry.catalog.get(step.tool), step.tool)
            if reason is not None:
                refused[step.id] = (reason, ErrorCode.TOOL_UNAVAILABLE)
                continue
            if self._registry.get(step.tool, step.tool_version).risk == "dangerous":
                reason = approvals.mismatch(step)
            if reason is None and self._guards.grants is not None:
                reason = await self._guards.grants.refusal(step.key_id, step.tool)
            if reason is not None:
                refused[step.id] = (reason, ErrorCode.FORBIDDEN)
        refused |= await self.effect_caps.charge([s for s in claimed if s.id not in refused])
        if not refused:
            return claimed
        await self._settle(
            list(refused),
            now=datetime.now(UTC),
            due=lambda s: (
                s.status is StepStatus.RUNNING and s.lease_owner == executor_id and s.id in refused
            ),
            decide=lambda s, ctx: not_permitted(s, ctx, *refused[s.id]),
        )
        log.warning(
            "%d leased steps were not run: tool withdrawn, not approved, not permitted, or capped",
            len(refused),
            extra={"event": "step_forbidden"},
        )
        return [s for s in claimed if s.id not in refused]

    async def _governance(
        self,
        conn: Connection,
        connectors: Sequence[str],
        now: datetime,
        *,
        pauses: dict[str, datetime] | None = None,
    ) -> Governance:
        """What limits the next lease of these connectors' tools (`pauses`: every pause in
        force, if just read)."""
        tools = [t for t in self._registry.catalog.values() if t.connector in connectors]
        return Governance(
            pauses=await self.tool_health.pauses(conn, connectors, now, active=pauses),
            caps=await self.tool_health.caps(conn, connectors, now),
            per_key={t.name: t.concurrency_per_key.limit for t in tools if t.concurrency_per_key},
            rates={t.name: Rate.of(t.rate_limit) for t in tools if t.rate_limit is not None},
        )

    async def _claim_governed(
        self, conn: Connection, claim: claims.ClaimInput, rules: Governance
    ) -> list[StepRow]:
        """Lease within concurrency caps and rate limits; defer steps a bucket refuses.

        A refused step gets a durable `not_before` at the time its bucket will admit it (the
        n-th refused step of a bucket one interval later than the (n-1)-th), so it waits in
        the queue without holding an executor slot, and pollers wake when it is due. A step
        whose tool or key is at its cap stays queued, and a finishing step wakes the pollers.
        """
        free, free_keys = await claims.room(conn, rules.caps, rules.per_key)
        skip = sorted({*rules.pauses, *(tool for tool, left in free.items() if left <= 0)})
        full_keys = sorted(key for key, left in free_keys.items() if left <= 0)
        picked: list[int] = []
        limited: list[tuple[int, str, Rate]] = []
        candidates = await claims.pick_ready(conn, claim, skip_tools=skip, skip_keys=full_keys)
        for candidate in candidates:
            tool = candidate.tool
            if free.get(tool, 1) <= 0:
                continue
            held = claims.held_key(tool, candidate.concurrency_key)
            if tool in rules.per_key and free_keys.get(held, rules.per_key[tool]) <= 0:
                continue
            if tool in free:
                free[tool] -= 1
            if tool in rules.per_key:
                free_keys[held] = free_keys.get(held, rules.per_key[tool]) - 1
            rate = rules.rates.get(tool)
            if rate is None:
                picked.append(candidate.key)
            else:
                limited.append((candidate.key, bucket_key(tool, candidate.rate_key), rate))
        if limited:
            waits = await self._guards.limiter.acquire(
                conn, [(bucket, rate) for _, bucket, rate in limited], claim.now.timestamp()
            )
            behind: Counter[str] = Counter()
            deferred: dict[int, datetime] = {}
            for (key, bucket, rate), wait in zip(limited, waits, strict=True):
                if wait <= 0:
                    picked.append(key)
                    continue
                later = wait + behind[bucket] * rate.interval
                behind[bucket] += 1
                deferred[key] = claim.now + timedelta(seconds=later)
            await claims.defer_steps(conn, deferred)
            self.metrics.rate_limited(conn, [c.tool for c in candidates if c.key in deferred])
        return await claims.lease_steps(conn, picked, claim)

    async def poll(
        self,
        *,
        executor_id: str,
        connectors: Sequence[str],
        limit: int,
        wait: float,
        session: Session | None = None,
        poll_seq: int = 0,
    ) -> list[StepRow]:
        """Claim, waiting up to `wait` seconds for a step to become ready or due."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait, 0.0), self.timings.max_poll_wait)
        keys = [ready_key(c) for c in connectors]
        while True:
            since = self._notifier.snapshot(keys)
            claimed, due = await self._claim(
                executor_id=executor_id,
                connectors=connectors,
                limit=limit,
                session=session,
                poll_seq=poll_seq,
            )
            remaining = deadline - loop.time()
            if claimed or remaining <= 0:
                return claimed
            pause = min(remaining, self.timings.recheck)
            if due is not None:
                pause = min(pause, max(0.0, (due - datetime.now(UTC)).total_seconds()))
            await self._notifier.wait(keys, since, within=pause)

    async def heartbeat(
        self,
        *,
        executor_id: str,
        leases: Sequence[tuple[int, int]],
        session: Session | None = None,
        forged: Sequence[tuple[int, int]] = (),
        polls_completed: int = 0,
    ) -> HeartbeatOutcome:
        """Extend the caller's leases; say which were cancelled and which it no longer holds
        (see LeaseKeeper: a session keeps all its leases with one write)."""
        if session is None:
            return await self.leases.extend(
                holder=executor_id,
                leases=leases,
                expires=datetime.now(UTC) + self.timings.lease,
            )
        return await self.leases.heartbeat(
            session=session, leases=leases, forged=forged, polls_completed=polls_completed
        )

    async def report(
        self,
        *,
        executor_id: str,
        results: Sequence[AttemptResult],
        session: Session | None = None,
    ) -> list[Ack]:
        """Apply each result whose lease is current and held by the caller; reject the rest.

        A session's results must also quote the lease token it was handed with the step.
        """
        if not results:
            return []
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            if session is not None and self.sessions is not None:
                # A revoked or expired session's results count for nothing, even in flight.
                await self.sessions.touch(conn, session.id, now=now)
            keys = [r.step_key for r in results]
            task_ids = await steps.lock_tasks_of_steps(conn, keys)
            current = await steps.load_steps_by_key(conn, keys)
            await self._registry.ensure(
                [(s.tool, s.tool_version) for s in current.values()], conn=conn
            )
            # Read once under the lock: step changes never touch task rows.
            tasks = await steps.load_tasks(conn, task_ids)
            acks, requeued, opened = await self._apply(
                conn,
                current,
                results,
                now=now,
                caller=Caller(holder=session.id if session else executor_id, session=session),
                budgets=await self._tasks.budgets(conn, tasks),
            )
            advanced = await self._tasks.advance(conn, task_ids, now=now, tasks=tasks)
            wake = await self._notifier.publish(
                conn,
                connectors=advanced.ready_connectors | requeued,
                tasks=advanced.finished_tasks,
            )
        await self._notifier.after_commit(wake)
        catalog = self._registry.catalog
        if any((b := catalog[t].breaker) and b.while_open == "fail_fast" for t in opened):
            await self.fail_fast_open()
        return acks

    async def _apply(
        self,
        conn: Connection,
        current: dict[int, StepRow],
        results: Sequence[AttemptResult],
        *,
        now: datetime,
        caller: Caller,
        budgets: dict[str, Budget],
    ) -> tuple[list[Ack], set[str], set[str]]:
        """Decide every result, apply the batch in one compare-and-set, ack each in order.

        Also returns the connectors of steps put back in the queue (retries), to wake pollers,
        and the tools whose breaker these results opened.
        """
        decided: list[tuple[AttemptResult, StepChange | None, str]] = []
        seen: set[int] = set()
        for result in results:
            step = current.get(result.step_key)
            if result.step_key in seen:
                decided.append((result, None, "duplicate"))
            elif (
                step is None
                or step.status is not StepStatus.RUNNING
                or step.attempt != result.attempt
            ):
                decided.append((result, None, "stale_lease"))
            elif not caller.holds(step, result):
                decided.append((result, None, "not_lease_holder"))
            else:
                tool = self._registry.get(step.tool, step.tool_version)
                decision = decide_result(
                    step, result, self._decision(tool, now, budgets.get(step.task_id))
                )
                decided.append((result, decision, ""))
            seen.add(result.step_key)
        moved = await steps.change_steps(conn, [c for _, c, _ in decided if c], now=now)
        applied = [(r, c) for r, c, _ in decided if c is not None and c.step.id in moved]
        self.metrics.results(conn, applied)
        opened = await self.tool_health.record_outcomes(conn, [c for _, c in applied], now)
        await self.tool_health.learn_pauses(conn, applied, now)
        # Pollers to wake: of steps back in the queue, and of capped tools that freed a slot.
        catalog = self._registry.catalog
        requeued = {
            c.values.get("connector", c.step.connector)
            for _, c in applied
            if c.transition is Transition.RETRY
            or (
                (spec := catalog.get(c.step.tool)) is not None
                and (spec.concurrency is not None or spec.concurrency_per_key is not None)
            )
        }
        acks = []
        for result, change, reason in decided:
            if change is not None and change.step.id in moved:
                acks.append(Ack(step_key=result.step_key, attempt=result.attempt, accepted=True))
                continue
            acks.append(
                await self._reject(
                    conn,
                    current.get(result.step_key),
                    result,
                    now=now,
                    reason=reason or "stale_lease",
                    caller=caller,
                )
            )
        return acks, requeued, opened

    async def _reject(
        self,
        conn: Connection,
        step: StepRow | None,
        result: AttemptResult,
        *,
        now: datetime,
        reason: str,
        caller: Caller,
    ) -> Ack:
        refusal = Refusal(
            step=step,
            attempt=result.attempt,
            reason=reason,
            holder=caller.holder,
            call="report",
            session=caller.session,
        )
        await record_refusal(conn, refusal, metrics=self.metrics, now=now)
        return Ack(step_key=result.step_key, attempt=result.attempt, accepted=False, reason=reason)

    async def reap_expired(self, *, limit: int = 500) -> int:
        """Re-queue (or fail) running steps whose lease expired. Any replica may run this."""
        now = datetime.now(UTC)
        async with self._db.transaction() as conn:
            expired = await steps.expired_leases(conn, now=now, limit=limit)
        reaped = await self._settle(
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
        expired = await self._settle(
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
        return await self._settle(
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
        ended = await self._settle(
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

    async def _settle(
        self,
        keys: Sequence[int],
        *,
        now: datetime,
        due: Callable[[StepRow], bool],
        decide: Callable[[StepRow, Decision], StepChange],
    ) -> int:
        """Decide these steps (those still `due` once their tasks are locked) and advance."""
        if not keys:
            return 0
        async with self._db.transaction() as conn:
            task_ids = await steps.lock_tasks_of_steps(conn, keys)
            current = await steps.load_steps_by_key(conn, keys)
            await self._registry.ensure(
                [(s.tool, s.tool_version) for s in current.values()], conn=conn
            )
            tasks = await steps.load_tasks(conn, task_ids)
            budgets = await self._tasks.budgets(conn, tasks)
            changes = [
                decide(
                    step,
                    self._decision(
                        self._registry.get(step.tool, step.tool_version),
                        now,
                        budgets.get(step.task_id),
                    ),
                )
                for step in current.values()
                if due(step)
            ]
            moved = await steps.change_steps(conn, changes, now=now)
            self.metrics.settled(conn, [c for c in changes if c.step.id in moved])
            connectors = {
                c.values.get("connector", c.step.connector) for c in changes if c.step.id in moved
            }
            advanced = await self._tasks.advance(conn, task_ids, now=now, tasks=tasks)
            wake = await self._notifier.publish(
                conn,
                connectors=connectors | advanced.ready_connectors,
                tasks=advanced.finished_tasks,
            )
        await self._notifier.after_commit(wake)
        return len(moved)


def _withdrawn(live: ToolSpec | None, name: str) -> str | None:
    """Why a step's tool may no longer run at all: deleted or disabled since it was submitted."""
    if live is None:
        return f"tool {name!r} was deleted from the catalogue; the step did not run"
    if not live.enabled:
        return f"tool {name!r} is disabled; the step did not run"
    return None
