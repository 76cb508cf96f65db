"""Circuit breaker rules: open on a failure rate, probe after the cooldown, close on success."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_reach_controller.decide.breakers import admission, closed, probes_now, record
from agent_reach_controller.domain.records import BreakerState
from agent_reach_controller.tools.catalog import BreakerPolicy

T0 = datetime(2026, 11, 30, tzinfo=UTC)
POLICY = BreakerPolicy(failure_rate=0.5, minimum_calls=4, window=60.0, cooldown=30.0, probes=2)


def test_opens_only_past_the_minimum_calls_and_the_rate() -> None:
    b = record(closed("t", T0), POLICY, successes=0, failures=3, now=T0)
    assert b.state is BreakerState.CLOSED  # 3 calls < minimum 4
    b = record(b, POLICY, successes=1, failures=0, now=T0)
    assert b.state is BreakerState.OPEN  # 3 of 4 failed
    assert admission(b, POLICY, T0 + timedelta(seconds=29)) == 0
    assert admission(b, POLICY, T0 + timedelta(seconds=30)) == 2


def test_a_healthy_rate_stays_closed_and_the_window_resets() -> None:
    b = record(closed("t", T0), POLICY, successes=3, failures=2, now=T0)
    assert b.state is BreakerState.CLOSED
    later = T0 + timedelta(seconds=61)
    b = record(b, POLICY, successes=0, failures=3, now=later)
    assert (b.state, b.calls, b.failures) == (BreakerState.CLOSED, 3, 3)  # old calls forgotten
    assert admission(b, POLICY, later) is None


def test_half_open_closes_on_success_and_reopens_on_failure() -> None:
    half = record(closed("t", T0), POLICY, successes=0, failures=4, now=T0)
    from dataclasses import replace

    half = replace(half, state=BreakerState.HALF_OPEN)
    assert record(half, POLICY, successes=1, failures=0, now=T0).state is BreakerState.CLOSED
    again = record(half, POLICY, successes=0, failures=1, now=T0 + timedelta(seconds=40))
    assert again.state is BreakerState.OPEN
    assert again.opened_at == T0 + timedelta(seconds=40)
    opened = record(closed("t", T0), POLICY, successes=0, failures=4, now=T0)
    assert record(opened, POLICY, successes=5, failures=0, now=T0) == opened  # late answers


def test_a_step_leased_before_the_cooldown_ends_is_no_probe() -> None:
    # A claim that read the breaker closed leases a step just after another replica opened it
    # (CI saw the breaker re-opened 48 ms after opening, with no probe sent): that lease must
    # not make it half-open, or the in-flight call's failure re-opens it early.
    opened = record(closed("t", T0), POLICY, successes=0, failures=4, now=T0)
    assert opened.state is BreakerState.OPEN
    assert not probes_now(opened, POLICY, T0 + timedelta(milliseconds=48))
    assert probes_now(opened, POLICY, T0 + timedelta(seconds=30))
    assert not probes_now(closed("t", T0), POLICY, T0 + timedelta(seconds=30))
