"""Leasing: executors long-poll for ready steps and are handed leases, within every rule.

A claim for tools nobody governs is one statement; paused tools, concurrency caps and rate limits
each add at most one. A leased step that may not run after all (its tool withdrawn, its approval
not for these arguments, its submitter's key revoked, its cap spent) is ended with a receipt
instead of being handed out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from agent_reach.errors import ErrorCode
from agent_reach.states import StepStatus
from agent_reach_controller.decide import approvals
from agent_reach_controller.decide.outcomes import not_permitted
from agent_reach_controller.decide.ratelimits import Rate, bucket_key
from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.caps import CapService, TenantCapsLookup
from agent_reach_controller.services.handoff import HandOff, Waiter, governed
from agent_reach_controller.services.held import HeldLeases
from agent_reach_controller.services.leases import HeartbeatOutcome, LeaseKeeper
from agent_reach_controller.services.limiter import RateLimiter
from agent_reach_controller.services.sessions import Session
from agent_reach_controller.services.tool_health import ToolHealth
from agent_reach_controller.services.unit_of_work import UnitOfWork
from agent_reach_controller.storage import claims, flow
from agent_reach_controller.storage import tasks as task_store
from agent_reach_controller.storage.engine import Connection
from agent_reach_controller.storage.wakeups import ready_key
from agent_reach_controller.tools.catalog import ToolSpec
from agent_reach_controller.tools.environments import needs_approval, sandbox_refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseTimings:
    # How long a lease outlives its holder's last heartbeat: an executor session's liveness.
    lease: timedelta = timedelta(seconds=30)
    max_poll_wait: float = 20.0
    # Upper bound on a poller's sleep between checks when no wake-up arrives (a safety net).
    recheck: float = 2.0


class GrantCheck(Protocol):
    async def refusal(self, key_id: str | None, tool: str) -> str | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Guards:
    """What leasing asks besides the queue: rate-limit buckets, whether submitters still may,
    and each tenant's caps on side effects (`services/caps.py`)."""

    limiter: RateLimiter
    grants: GrantCheck | None = None
    tenant_caps: TenantCapsLookup | None = None


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


# Pollers whose last claim drained the queue, remembered per replica (a bound, not a cache size
# that matters: an entry is used once, by that poller's next poll).
_DRAINED_KEPT = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Drained:
    """A claim leased fewer steps than asked, nothing governed: the queue it saw was empty."""

    since: tuple[int, ...]  # the wake-up counters read just before that claim
    due: datetime | None  # when its earliest deferred step becomes due

    def still_quiet(self) -> bool:
        return self.due is None or self.due > datetime.now(UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Leased:
    """What a claim's transaction leased, before the steps that may not run are dropped."""

    steps: list[StepRow]
    holder: str  # the leases' owner: the session, or the executor without one
    at: datetime
    due: datetime | None = None  # when the next deferred step becomes due
    drained: bool = False  # leased fewer than asked, nothing governed: the queue looked empty


class LeasingService:
    """The executor's side of taking work: poll, claim, heartbeat. Safe in every replica."""

    def __init__(  # noqa: PLR0913 - its collaborators, all by keyword
        self,
        *,
        work: UnitOfWork,
        timings: LeaseTimings,
        guards: Guards,
        leases: LeaseKeeper,
        tool_health: ToolHealth,
        hand_off: HandOff | None = None,
        held: HeldLeases | None = None,
    ) -> None:
        self._work = work
        self._hand_off = hand_off
        self._held = held  # where a one-step task's lease is kept for its report
        self._db = work.db
        self._registry = work.registry
        self._notifier = work.notifier
        self.metrics: ControllerMetrics = work.metrics
        self.timings = timings
        self._guards = guards
        self.leases = leases
        self.tool_health = tool_health
        self._drained: dict[tuple[str, tuple[str, ...]], Drained] = {}
        # Connectors with a tool paused, and until when: their claims read the pauses first.
        self._paused_until: dict[tuple[str, ...], datetime] = {}
        # Claims made in one round trip under assumptions, and claims that read first.
        self.claim_paths: Counter[str] = Counter()
        self.effect_caps = CapService(
            db=work.db, registry=work.registry, tenant_caps=guards.tenant_caps
        )

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
        leased = await self._lease(
            executor_id=executor_id,
            connectors=connectors,
            limit=limit,
            session=session,
            poll_seq=poll_seq,
        )
        return await self._hand_out(leased.steps, holder=leased.holder, now=leased.at)

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

    async def _lease(
        self,
        *,
        executor_id: str,
        connectors: Sequence[str],
        limit: int,
        session: Session | None = None,
        poll_seq: int = 0,
    ) -> Leased:
        """One transaction: lease what is ready; say when the next deferred step is due, and
        whether the claim drained the queue (leased fewer than `limit`, no governance in play).

        A session that ended leases nothing (its heartbeat tells it to register again).
        """
        if limit <= 0 or not connectors:
            return Leased(steps=[], holder=executor_id, at=datetime.now(UTC))
        claim_of = functools.partial(
            self._claim_input,
            executor_id=executor_id,
            connectors=connectors,
            limit=limit,
            session=session,
            poll_seq=poll_seq,
        )
        tools = self._ungoverned(connectors)
        if tools is not None:
            try:
                return await self._claim_assuming(claim_of(), tools)
            except claims.AssumptionFailed:
                self.claim_paths["assumption_failed"] += 1  # read both and claim again
        self.claim_paths["read_first"] += 1
        async with self._db.transaction() as conn:
            # A tool disabled or paused a moment ago is refused now: both read in one go.
            revision, active = await flow.revision_and_pauses(conn, now=datetime.now(UTC))
            await self._registry.refresh(conn, revision=revision)
            claim = claim_of()  # its scope's tool exclusions from the catalogue just refreshed
            now = claim.now
            rules = await self._governance(conn, connectors, now, pauses=active)
            self._remember_pauses(connectors, rules.pauses)
            alone: dict[str, TaskRow] = {}
            if not rules.active:
                # One statement: the lease, the tasks it starts, their events, the next deferred
                # step's time; with the COMMIT, unless a breaker's probe may follow.
                probes = any(
                    t.breaker is not None
                    for t in self._registry.catalog.values()
                    if t.connector in connectors
                )
                claimed, due, alone = await claims.claim_ready(conn, claim, last=not probes)
                drained = len(claimed) < limit
            else:
                # Rate limits, caps and breakers change with time alone: never "drained".
                claimed, due, drained = await self._claim_governed(conn, claim, rules), None, False
                if claimed:
                    await task_store.mark_tasks_running(conn, {s.task_id for s in claimed}, now=now)
                else:
                    due = await claims.next_due(conn, connectors, now=now)
                    paused = rules.pauses.values()
                    due = min([due, *paused] if due else paused, default=None)
            if claimed:
                await self.tool_health.start_probes(conn, {s.tool for s in claimed}, now)
        self._keep(claimed, alone)
        return Leased(steps=claimed, holder=claim.executor_id, at=now, due=due, drained=drained)

    def _keep(self, claimed: Sequence[StepRow], alone: Mapping[str, TaskRow]) -> None:
        """Keep, for their reports, the rows of the committed leases of one-step tasks (not of
        a tool with a breaker: its report writes the breaker's row before the commit)."""
        if self._held is None or not alone:
            return
        catalog = self._registry.catalog
        for step in claimed:
            task = alone.get(step.task_id)
            spec = catalog.get(step.tool)
            if task is not None and spec is not None and spec.breaker is None:
                self._held.remember(task, step)

    def _ungoverned(self, connectors: Sequence[str]) -> list[str] | None:
        """The tools of these connectors if a claim may skip reading the catalogue revision and
        the pauses first (Postgres; no tool with a concurrency cap, breaker, per-key cap or rate
        limit; no pause of theirs in force when last read), else None."""
        if not self._db.is_postgres:
            return None
        key = tuple(connectors)
        if (until := self._paused_until.get(key)) is not None:
            if until > datetime.now(UTC):
                return None
            del self._paused_until[key]
        tools = [t for t in self._registry.catalog.values() if t.connector in connectors]
        if any(governed(t) for t in tools):
            return None
        return [t.name for t in tools]

    def _remember_pauses(self, connectors: Sequence[str], pauses: dict[str, datetime]) -> None:
        """Until when claims for these connectors must read the pauses first."""
        if not pauses:
            return
        if len(self._paused_until) >= _DRAINED_KEPT:
            self._paused_until.clear()
        self._paused_until[tuple(connectors)] = max(pauses.values())

    async def _claim_assuming(self, claim: claims.ClaimInput, tools: Sequence[str]) -> Leased:
        """The ungoverned claim as one statement, its transaction's only one: it assumes this
        replica's catalogue is current and none of `tools` is paused, and the statement checks
        both (claims.AssumptionFailed when not, having leased nothing)."""
        assumed = claims.Assumed(revision=self._registry.revision, tools=tools)
        async with self._db.transaction() as conn:
            claimed, due, alone = await claims.claim_ready(conn, claim, last=True, assumed=assumed)
        self.claim_paths["assumed"] += 1
        self._keep(claimed, alone)
        drained = len(claimed) < claim.limit
        return Leased(
            steps=claimed, holder=claim.executor_id, at=claim.now, due=due, drained=drained
        )

    async def _hand_out(
        self, claimed: list[StepRow], *, holder: str, now: datetime, handed_off: bool = False
    ) -> list[StepRow]:
        """The steps leased to `holder` that may run (see _drop_refused), counted as leased."""
        if not claimed:
            return claimed
        claimed = await self._drop_refused(claimed, executor_id=holder)
        self.metrics.leased(claimed, now=now, handed_off=handed_off)
        return claimed

    async def _drop_refused(self, claimed: list[StepRow], *, executor_id: str) -> list[StepRow]:
        """End, instead of handing out, leased steps that may not run after all.

        A step that needs an approval in its environment (`needs_approval`) needs one for this
        step, this tool version and these exact arguments; in `sandbox` a tool that writes must
        have a sandbox target; a submitter's key must still be live and granted the tool; the
        rest are charged against their caps, once per step. Checked after the lease commits
        (refusals are rare); if this replica dies in between, the lease expires and the next
        claim checks again.
        """
        await self._registry.ensure((s.tool, s.tool_version) for s in claimed)
        refused: dict[int, tuple[str, ErrorCode]] = {}
        for step in claimed:
            reason = _withdrawn(self._registry.catalog.get(step.tool), step.tool)
            if reason is not None:
                refused[step.id] = (reason, ErrorCode.TOOL_UNAVAILABLE)
                continue
            tool = self._registry.get(step.tool, step.tool_version)
            reason = sandbox_refusal(tool, step.environment)
            if reason is None and needs_approval(tool, step.environment):
                reason = approvals.mismatch(step)
            if reason is None and self._guards.grants is not None:
                reason = await self._guards.grants.refusal(step.key_id, step.tool)
            if reason is not None:
                refused[step.id] = (reason, ErrorCode.FORBIDDEN)
        refused |= await self.effect_caps.charge([s for s in claimed if s.id not in refused])
        if not refused:
            return claimed
        await self._work.settle(
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
        """Claim, waiting up to `wait` seconds for a step to become ready or due.

        An executor polls again as soon as it is handed steps. When its last claim drained the
        queue and no wake-up has come since, a claim now would lease nothing: the poll goes
        straight to waiting (each wait is still capped by `recheck` and the next due step). A
        session's poll may be handed new steps while it waits, and while it claims again after
        a wake-up (services/handoff.py).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(wait, 0.0), self.timings.max_poll_wait)
        keys = [ready_key(c) for c in connectors]
        holder = (session.id if session else executor_id, tuple(connectors))
        quiet = self._drained.pop(holder, None)
        lease = functools.partial(
            self._lease,
            executor_id=executor_id,
            connectors=connectors,
            session=session,
            poll_seq=poll_seq,
        )
        # A session's poll may be handed new steps as they are submitted here, while it waits
        # or claims (services/handoff.py).
        new_waiter = None
        if session is not None and self._hand_off is not None:
            new_waiter = functools.partial(
                Waiter,
                session=session,
                connectors=frozenset(connectors),
                poll_seq=poll_seq,
                keys=tuple(keys),
            )
        looked_empty = quiet is not None  # its last look found the queue empty
        while True:
            since = self._notifier.snapshot(keys)
            if quiet is not None and quiet.since == since and quiet.still_quiet():
                claimed: list[StepRow] = []
                due, drained, empty = quiet.due, False, True
            else:
                # A step submitted meanwhile may be handed to it too, if its last look found the
                # queue empty (a first look may find a backlog: a claim that fills refuses it).
                offers = None
                if new_waiter is not None and looked_empty and limit > 1:
                    offers = new_waiter(limit=1, since=since, claim=loop.create_future())
                claimed, due, drained = await self._claim(lease, limit=limit, offers=offers)
                empty = drained
            quiet = None
            looked_empty = empty
            remaining = deadline - loop.time()
            if claimed or remaining <= 0:
                if claimed and drained:
                    self._remember_drained(holder, Drained(since=since, due=due))
                return claimed
            pause = min(remaining, self.timings.recheck)
            if due is not None:
                pause = min(pause, max(0.0, (due - datetime.now(UTC)).total_seconds()))
            if not (empty and new_waiter is not None and self._hand_off is not None):
                await self._notifier.wait(keys, since, within=pause)
                continue

            # The queue is empty for this poller: it waits to be handed steps.
            waiting = new_waiter(limit=limit, since=since)
            async with self._hand_off.offers_to(waiting):
                await self._notifier.wait(keys, since, within=pause, until=waiting.settled)
            claimed = await self._hand_out(
                waiting.offered, holder=waiting.session.id, now=datetime.now(UTC), handed_off=True
            )
            if claimed:
                if self._notifier.snapshot(keys) == since:  # still nothing queued for it
                    self._remember_drained(holder, Drained(since=since, due=due))
                return claimed

    async def _claim(
        self, lease: Callable[..., Awaitable[Leased]], *, limit: int, offers: Waiter | None
    ) -> tuple[list[StepRow], datetime | None, bool]:
        """Claim up to `limit` steps: those that may run, when the next deferred step is due,
        and whether the claim drained the queue.

        With `offers` (a claiming waiter, room for one step), the claim asks for one step fewer
        while a step submitted meanwhile may be handed to this poll (services/handoff.py): what
        it claims and what it is handed never exceed `limit`.
        """
        if offers is None or self._hand_off is None:
            leased = await lease(limit=limit)
            claimed = await self._hand_out(leased.steps, holder=leased.holder, now=leased.at)
            return claimed, leased.due, leased.drained
        async with self._hand_off.offers_to(offers):
            leased = await lease(limit=limit - 1)
            offers.claimed(drained=leased.drained)
        claimed = await self._hand_out(leased.steps, holder=leased.holder, now=leased.at)
        handed = await self._hand_out(
            offers.offered, holder=leased.holder, now=datetime.now(UTC), handed_off=True
        )
        return claimed + handed, leased.due, leased.drained

    def _remember_drained(self, holder: tuple[str, tuple[str, ...]], drained: Drained) -> None:
        if len(self._drained) >= _DRAINED_KEPT:
            self._drained.clear()
        self._drained[holder] = drained

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


def _withdrawn(live: ToolSpec | None, name: str) -> str | None:
    """Why a step's tool may no longer run at all: deleted or disabled since it was submitted."""
    if live is None:
        return f"tool {name!r} was deleted from the catalogue; the step did not run"
    if not live.enabled:
        return f"tool {name!r} is disabled; the step did not run"
    return None
