"""Circuit breakers: closed → open on a failure rate → half-open probes after a cooldown → closed.

The state lives in the `breakers` table so every replica sees the same breaker. These functions
are the pure rules over its row (`storage.records.Breaker`); `storage/flow.py` reads and writes
the rows under a row lock.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from agent_reach_controller.domain.records import Breaker, BreakerState
from agent_reach_controller.tools.catalog import BreakerPolicy


def closed(tool: str, now: datetime) -> Breaker:
    return Breaker(tool=tool, state=BreakerState.CLOSED, window_started_at=now, calls=0, failures=0)


def record(
    breaker: Breaker, policy: BreakerPolicy, *, successes: int, failures: int, now: datetime
) -> Breaker:
    """The breaker after these outcomes of its tool's calls."""
    if breaker.state is BreakerState.OPEN:
        return breaker  # answers to calls made before it opened do not move it
    if breaker.state is BreakerState.HALF_OPEN:
        if failures:
            return _open(breaker, now)
        return closed(breaker.tool, now) if successes else breaker
    if now - breaker.window_started_at > timedelta(seconds=policy.window):
        breaker = closed(breaker.tool, now)
    calls, failed = breaker.calls + successes + failures, breaker.failures + failures
    if calls >= policy.minimum_calls and failed / calls >= policy.failure_rate:
        return _open(breaker, now)
    return replace(breaker, calls=calls, failures=failed)


def _open(breaker: Breaker, now: datetime) -> Breaker:
    return replace(breaker, state=BreakerState.OPEN, opened_at=now, calls=0, failures=0)


def probes_now(breaker: Breaker, policy: BreakerPolicy, now: datetime) -> bool:
    """Whether a step of the tool leased at `now` is a probe: the breaker is open and its
    cooldown is over. A step leased under an older read that still saw the breaker closed is
    no probe (its answer, like any to a call made before the breaker opened, moves nothing)."""
    return breaker.state is BreakerState.OPEN and admission(breaker, policy, now) != 0


def admission(breaker: Breaker | None, policy: BreakerPolicy, now: datetime) -> int | None:
    """How many of the tool's steps may run at once: None no limit, 0 none (open), else probes."""
    if breaker is None or breaker.state is BreakerState.CLOSED:
        return None
    opened = breaker.opened_at or now
    if breaker.state is BreakerState.OPEN and now < opened + timedelta(seconds=policy.cooldown):
        return 0
    return policy.probes
