"""What each tool's downstream has said about its health: circuit breakers (shared by every
replica in the `breakers` table) and pauses it asked for (quota spent). Dispatch asks it how many
steps of a tool may run now, and tells it what the results were."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from agent_reach.states import Transition
from agent_reach_controller.decide import breakers
from agent_reach_controller.decide.outcomes import AttemptResult
from agent_reach_controller.domain.records import BreakerState, StepChange
from agent_reach_controller.metrics import ControllerMetrics
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.storage import flow
from agent_reach_controller.storage.engine import Connection, Database

log = logging.getLogger(__name__)


class ToolHealth:
    """Breakers and pauses of the catalogue's tools, read and written in the caller's
    transaction (except `breaker_states`, for operators)."""

    def __init__(self, *, db: Database, registry: ToolRegistry, metrics: ControllerMetrics) -> None:
        self._db = db
        self._registry = registry
        self._metrics = metrics

    async def caps(
        self, conn: Connection, connectors: Sequence[str], now: datetime
    ) -> dict[str, int]:
        """Steps of each limited tool allowed to run at once: its concurrency, its breaker's."""
        tools = [t for t in self._registry.catalog.values() if t.connector in connectors]
        caps = {t.name: t.concurrency for t in tools if t.concurrency is not None}
        guarded = {t.name: t.breaker for t in tools if t.breaker is not None}
        states = await flow.load_breakers(conn, guarded) if guarded else {}
        for name, policy in guarded.items():
            allowed = breakers.admission(states.get(name), policy, now)
            if allowed is not None:
                caps[name] = min(allowed, caps.get(name, allowed))
        return caps

    async def start_probes(self, conn: Connection, tools: set[str], now: datetime) -> None:
        """An open breaker past its cooldown whose tool just got a step leased is half-open:
        that step probes. (A claim that read the breaker closed may lease a step just after
        another replica opened it: that step must not cut the cooldown short.)"""
        policies = {
            t: spec.breaker
            for t in tools
            if (spec := self._registry.catalog.get(t)) and spec.breaker is not None
        }
        if not policies:
            return
        states = await flow.load_breakers(conn, list(policies))
        probing = [
            replace(b, state=BreakerState.HALF_OPEN)
            for b in states.values()
            if breakers.probes_now(b, policies[b.tool], now)
        ]
        await flow.save_breakers(conn, probing, now=now)

    async def record_outcomes(
        self, conn: Connection, changes: Sequence[StepChange], now: datetime
    ) -> set[str]:
        """Feed accepted outcomes to their tools' breakers (retryable errors count as failures).

        Returns the tools whose breaker opened.
        """
        tally: dict[str, list[int]] = {}
        for change in changes:
            spec = self._registry.catalog.get(change.step.tool)
            if spec is None or spec.breaker is None:
                continue
            counts = tally.setdefault(spec.name, [0, 0])
            error = change.values.get("error") or {}
            # A downstream in trouble: retries, ambiguous outcomes, retryable errors at the end.
            failed = change.transition in (Transition.RETRY, Transition.MARK_UNKNOWN) or (
                change.transition is Transition.FAIL and bool(error.get("retryable"))
            )
            counts[1 if failed else 0] += 1
        if not tally:
            return set()
        await flow.ensure_breakers(conn, tally, now=now)
        states = await flow.load_breakers(conn, tally, lock=True)
        updated = []
        opened = set()
        for name, (ok_count, failed_count) in tally.items():
            policy = self._registry.catalog[name].breaker
            assert policy is not None
            current = states.get(name) or breakers.closed(name, now)
            after = breakers.record(
                current, policy, successes=ok_count, failures=failed_count, now=now
            )
            if after != current:
                updated.append(after)
                if after.state is not current.state:
                    if after.state is BreakerState.OPEN:
                        opened.add(name)
                    log.warning(
                        "circuit breaker of %s: %s -> %s",
                        name,
                        current.state,
                        after.state,
                        extra={"event": "breaker_changed", "tool": name},
                    )
        await flow.save_breakers(conn, updated, now=now)
        return opened

    async def learn_pauses(
        self,
        conn: Connection,
        applied: Sequence[tuple[AttemptResult, StepChange]],
        now: datetime,
    ) -> None:
        """A downstream that said "slow down" holds back every step of its tool, not just one."""
        longest: dict[str, float] = {}
        for result, change in applied:
            spec = self._registry.get(change.step.tool, change.step.tool_version)
            wait = result.hold_back(spec.retry.maximum_retry_after)
            if wait > 0:
                longest[change.step.tool] = max(wait, longest.get(change.step.tool, 0.0))
        for tool, wait in sorted(longest.items()):
            await flow.pause_tool(
                conn,
                tool,
                until=now + timedelta(seconds=wait),
                reason="the downstream said its quota is spent",
                now=now,
            )
            self._metrics.tool_paused(conn, tool)
            log.info(
                "holding back %s for %.1f s: its downstream asked to slow down",
                tool,
                wait,
                extra={"event": "tool_paused", "tool": tool},
            )

    async def breaker_states(self, only: str | None = None) -> dict[str, dict[str, Any]]:
        """Every guarded tool's breaker (or only the tool `only`'s), for operators (closed when
        it has no row yet)."""
        guarded = [
            t.name
            for t in self._registry.catalog.values()
            if t.breaker is not None and only in (None, t.name)
        ]
        async with self._db.transaction() as conn:
            states = await flow.load_breakers(conn, guarded)
        return {
            name: {
                "state": states[name].state.value if name in states else "closed",
                "calls": states[name].calls if name in states else 0,
                "failures": states[name].failures if name in states else 0,
                "opened_at": states[name].opened_at if name in states else None,
            }
            for name in guarded
        }

    async def pauses(
        self,
        conn: Connection,
        connectors: Sequence[str],
        now: datetime,
        *,
        active: dict[str, datetime] | None = None,
    ) -> dict[str, datetime]:
        """Tools of these connectors that their downstream asked to hold back, and until when
        (of `active`, every pause in force, if the caller has just read them)."""
        pauses = await flow.active_pauses(conn, now=now) if active is None else active
        catalog = self._registry.catalog
        return {
            tool: until
            for tool, until in pauses.items()
            if tool in catalog and catalog[tool].connector in connectors
        }
