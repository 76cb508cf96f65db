"""Circuit breaker: a downstream failing hard opens it (GET /v1/tools/breakers), calls stop while
it is open, after the cooldown one probe runs (and fails: open again), the downstream recovers,
the next probe succeeds, the breaker closes and every step finishes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tests.e2e.processes import wait_until
from tests.faults.checkers import Run, check_all
from tests.faults.harness import Api, FaultEnv, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

TOOL = "flaky.post"
MINIMUM_CALLS = 5
PROBES = 1
GRACE_S = 0.5  # calls leased just before the breaker opened may still land this long after


def breaker(api: Api) -> dict[str, Any]:
    state: dict[str, Any] = api.get("/v1/tools/breakers")["breakers"][TOOL]
    return state


def calls_between(sink: Sink, start: datetime, end: datetime) -> int:
    lo, hi = start.timestamp(), end.timestamp()
    return sum(lo <= d.wall < hi for d in sink.requests("/flaky"))


def test_breaker_opens_probes_and_closes(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.breaker
    cooldown = timedelta(seconds=p.cooldown_s)
    with Sink() as sink, env.cluster() as c:
        sink.script("/flaky", [Response(status=503)])
        spec = sink_tool(
            TOOL,
            f"{sink.url}/flaky",
            max_attempts=30,
            initial="100ms",
            maximum="500ms",
            breaker={
                "failure_rate": 0.5,
                "minimum_calls": MINIMUM_CALLS,
                "window": "60s",
                "cooldown": f"{p.cooldown_s:g}s",
                "probes": PROBES,
            },
        )
        tools = env.tools([spec], sink=sink)
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools)
        executors = [
            c.start_executor(f"executor-{i}", grpc=ctl.info["grpc"], slots=4) for i in range(2)
        ]
        c.await_registered(executors)
        api = env.api([ctl])
        env.history.record("fault", action="downstream_down", target="/flaky")
        api.submit(plan("breaker", [f"b-{i}" for i in range(p.steps)], TOOL), key="breaker")

        first = wait_until(
            lambda: (b := breaker(api))["state"] == "open" and b, within=30, what="it to open"
        )
        opened = datetime.fromisoformat(first["opened_at"])
        env.history.record("breaker", **first)
        failures_to_open = calls_between(sink, datetime.fromtimestamp(0, opened.tzinfo), opened)
        # Open: nothing reaches the downstream until the cooldown ends and a probe is let out.
        second = wait_until(
            lambda: (b := breaker(api))["opened_at"] != first["opened_at"] and b,
            within=p.cooldown_s + 30,
            what="the first probe to fail and open it again",
        )
        reopened = datetime.fromisoformat(second["opened_at"])
        env.history.record("breaker", **second)
        while_open = calls_between(sink, opened + timedelta(seconds=GRACE_S), opened + cooldown)
        first_probes = calls_between(sink, opened + cooldown, reopened)
        sink.script("/flaky", [Response(json={"ok": True}, echo=True)])
        env.history.record("heal", action="downstream_up", target="/flaky")
        closed = wait_until(
            lambda: (b := breaker(api))["state"] == "closed" and b,
            within=p.cooldown_s + 30,
            what="a probe to succeed and close it",
        )
        env.history.record("breaker", **closed)
        progress = env.progress()
        env.wait_settled(progress, expected=p.steps, within=p.recovery_bound_s + 30)
        progress.close()
        still_open = calls_between(sink, reopened + timedelta(seconds=GRACE_S), reopened + cooldown)
        observe(env.history, api)
        record_sink(env.history, sink)
    summary = check_all(Run.load(env.history.path), recovery_bound_s=p.recovery_bound_s)
    assert while_open == 0, f"{while_open} calls reached the downstream while the breaker was open"
    assert still_open == 0, f"{still_open} calls reached the downstream while it was open again"
    assert 1 <= first_probes <= PROBES, f"{first_probes} probes after the first cooldown"
    assert summary.count("nothing lost", "steps_succeeded") == p.steps
    env.figures.add(
        f"circuit breaker, {p.steps} steps on a downstream answering 503: opened after "
        f"{failures_to_open} failed calls (minimum {MINIMUM_CALLS}), 0 calls while open "
        f"(cooldown {p.cooldown_s:g} s, twice), {first_probes} probe failed → open again, "
        f"downstream recovered → probe succeeded → closed, {p.steps} of {p.steps} succeeded; "
        f"{summary.standard()}"
    )
