"""Reporting: executors hand back results; each is applied if its lease is current and the
caller's, and refused (with a reason it is told, and an event) otherwise.

A batch is one unit of work: the tasks of its steps locked, every result decided and applied in
one compare-and-set, the tasks advanced, breakers and learned pauses updated, wake-ups sent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from agent_reach.errors import DEFINITION_CHANGED, ErrorCode
from agent_reach.states import StepStatus, Transition
from agent_reach_controller.decide.outcomes import AttemptResult, decide_result
from agent_reach_controller.domain.records import StepChange, StepRow, TaskRow
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.expiry import ExpiryService
from agent_reach_controller.services.held import HeldLeases
from agent_reach_controller.services.leases import Refusal, record_refusal
from agent_reach_controller.services.sessions import Session, SessionService
from agent_reach_controller.services.tool_health import ToolHealth
from agent_reach_controller.services.unit_of_work import TaskWork, UnitOfWork

log = logging.getLogger(__name__)


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


class ReportingService:
    """Results from executors, applied at most once per attempt. Safe in every replica."""

    def __init__(
        self,
        *,
        work: UnitOfWork,
        sessions: SessionService | None,
        tool_health: ToolHealth,
        expiry: ExpiryService,
        held: HeldLeases | None = None,
    ) -> None:
        self._work = work
        # The rows of the leases this replica handed out, for reports that need no read.
        self.held = held
        self._registry = work.registry
        self.metrics: ControllerMetrics = work.metrics
        self.sessions = sessions
        self.tool_health = tool_health
        self._expiry = expiry

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
        caller = Caller(holder=session.id if session else executor_id, session=session)
        tried: list[bool] = []  # each run of `apply`: whether it decided on held rows

        async def apply(tx: TaskWork) -> tuple[list[Ack], set[str], set[str]]:
            if tried and tried[-1] and self.held is not None:
                self.held.refused += 1  # a task had changed: decided again, read under the lock
            if session is not None and self.sessions is not None:
                # A revoked or expired session's results count for nothing, even in flight: the
                # heartbeat is the commit's guard (on Postgres no statement of its own).
                await self.sessions.touch(tx.conn, session.id, now=tx.now, at_commit=True)
            held = self._kept_rows(results, caller)
            tried.append(held is not None and await tx.hold(*held))
            if not tried[-1]:
                await tx.lock_steps([r.step_key for r in results])
            acks, opened = await self._apply(tx, results, caller=caller)
            changed = {
                tx.steps[r.step_key].tool
                for r, ack in zip(results, acks, strict=True)
                if ack.accepted and _definition_changed(r)
            }
            return acks, opened, changed

        acks, opened, changed = await self._work.run(apply)
        for tool in sorted(changed):
            await self._disable_changed(tool)
        catalog = self._registry.catalog
        if any((b := catalog[t].breaker) and b.while_open == "fail_fast" for t in opened):
            await self._expiry.fail_fast_open()
        return acks

    def _kept_rows(
        self, results: Sequence[AttemptResult], caller: Caller
    ) -> tuple[dict[str, TaskRow], dict[int, StepRow]] | None:
        """The rows this replica kept from the leases of these results, if they accept every
        one (services/held.py); else None: the report reads under the lock."""
        if self.held is None:
            return None
        held = self.held.take([(r.step_key, r.attempt) for r in results], caller.holder)
        if held is None or not all(caller.holds(held[1][r.step_key], r) for r in results):
            return None
        return held

    async def _disable_changed(self, tool: str) -> None:
        """A remote tool's definition is no longer the one approved (an MCP server changed it):
        disable the tool until someone looks at it and enables it again (rug-pull defence)."""
        log.warning(
            "tool %s: its remote definition changed; disabled until re-approved",
            tool,
            extra={"event": "tool_definition_changed", "tool": tool},
        )
        with contextlib.suppress(LookupError):  # deleted meanwhile: nothing to disable
            await self._registry.set_enabled(
                tool, False, principal=DEFINITION_CHANGED_BY, tenant=None
            )

    async def _apply(
        self, tx: TaskWork, results: Sequence[AttemptResult], *, caller: Caller
    ) -> tuple[list[Ack], set[str]]:
        """Decide every result, apply the batch in one compare-and-set, ack each in order.

        Wakes the pollers of steps put back in the queue (retries) and of capped tools that
        freed a slot; also returns the tools whose breaker these results opened.
        """
        conn, now, current = tx.conn, tx.now, tx.steps
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
                decided.append((result, decide_result(step, result, await tx.decision(step)), ""))
            seen.add(result.step_key)
        moved = await tx.change([c for _, c, _ in decided if c])
        applied = [(r, c) for r, c, _ in decided if c is not None and c.step.id in moved]
        self.metrics.results(conn, applied)
        opened = await self.tool_health.record_outcomes(conn, [c for _, c in applied], now)
        await self.tool_health.learn_pauses(conn, applied, now)
        catalog = self._registry.catalog
        tx.wake(
            connectors={
                c.values.get("connector", c.step.connector)
                for _, c in applied
                if c.transition is Transition.RETRY
                or (
                    (spec := catalog.get(c.step.tool)) is not None
                    and (spec.concurrency is not None or spec.concurrency_per_key is not None)
                )
            }
        )
        acks = []
        for result, change, reason in decided:
            if change is not None and change.step.id in moved:
                acks.append(Ack(step_key=result.step_key, attempt=result.attempt, accepted=True))
                continue
            acks.append(
                await self._reject(
                    tx,
                    current.get(result.step_key),
                    result,
                    reason=reason or "stale_lease",
                    caller=caller,
                )
            )
        return acks, opened

    async def _reject(
        self,
        tx: TaskWork,
        step: StepRow | None,
        result: AttemptResult,
        *,
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
        await record_refusal(tx.conn, refusal, metrics=self.metrics, now=tx.now)
        return Ack(step_key=result.step_key, attempt=result.attempt, accepted=False, reason=reason)


# Who disables a tool whose remote definition changed, as its history and the audit log say.
DEFINITION_CHANGED_BY = "agent-reach (remote definition changed)"


def _definition_changed(result: AttemptResult) -> bool:
    """Whether a connector said the remote tool is no longer the one approved."""
    error = result.error
    return (
        error is not None
        and error.code == ErrorCode.TOOL_UNAVAILABLE
        and DEFINITION_CHANGED in error.message
    )
