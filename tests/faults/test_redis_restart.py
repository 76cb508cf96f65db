"""Redis killed and restarted empty while a rate limit is being enforced.

Two executors with 16 slots between them could call the downstream far faster than the tool's
rate limit allows; the controller keeps its buckets in a private Redis, which is SIGKILLed
mid-run and later started again, empty. While it is down Postgres decides; when it is back, its
buckets start empty. The downstream must never see more than `burst + rate·W` calls in any
window of W seconds (plus a small allowance for executor jitter), nothing may be lost, and every
step must succeed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.e2e.processes import wait_until
from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv, pace, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.redisserver import PrivateRedis
from tests.support.sink import Response, Sink

TOOL = "limited.post"
# Calls admitted back to back may reach the downstream a few milliseconds apart in either order.
JITTER_CALLS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    rate: float
    burst: int
    steps: int
    outages: int
    down_s: float
    up_s: float
    recovery_bound_s: float


PROFILES = {
    "ci": Limits(rate=40.0, burst=5, steps=400, outages=2, down_s=1.5, up_s=2.0,
                 recovery_bound_s=20.0),
    "long": Limits(rate=60.0, burst=10, steps=3_000, outages=8, down_s=3.0, up_s=4.0,
                   recovery_bound_s=40.0),
}  # fmt: skip


def busiest(times: list[float], window: float) -> int:
    """The most calls in any window of `window` seconds."""
    times = sorted(times)
    most, j = 0, 0
    for i, start in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] <= start + window:
            j += 1
        most = max(most, j - i)
    return most


def test_rate_limits_hold_while_redis_is_killed_and_restarted_empty(
    fault_env: FaultEnv,
) -> None:
    env = fault_env
    p = PROFILES[env.profile.name]
    with PrivateRedis() as redis, Sink() as sink, env.cluster() as c:
        sink.script("/limited", [Response(json={"ok": True}, echo=True)])
        spec = sink_tool(TOOL, f"{sink.url}/limited", rate_limit={"rate": p.rate, "burst": p.burst})
        tools = env.tools([spec], sink=sink)
        ctl = c.start_controller(
            "controller",
            database_url=env.db_url(),
            tools=tools,
            env={"AGENT_REACH_CONTROLLER_REDIS_URL": redis.url()},
        )
        executors = [
            c.start_executor(f"executor-{i}", grpc=ctl.info["grpc"], slots=8) for i in range(2)
        ]
        c.await_registered(executors)
        api = env.api([ctl])
        api.submit(plan("limited", [f"r-{i}" for i in range(p.steps)], TOOL), key="limited")
        progress = env.progress()
        for _ in range(p.outages):
            # The run goes on between outages: that is the fault schedule.
            if pace(p.up_s, unless=lambda: progress.settled(p.steps)):
                break
            env.history.record("fault", action="sigkill", target="redis")
            redis.kill()
            pace(p.down_s, unless=lambda: False)
            redis.start()
            env.history.record("heal", action="restart", target="redis")
        env.wait_settled(progress, expected=p.steps, within=p.steps / p.rate + 60)
        progress.close()
        log = ctl.output()
        wait_until(lambda: "rate_limit_fallback" in log, within=1, what="a Postgres fallback")
        observe(env.history, api)
        record_sink(env.history, sink)
        calls = [d.wall for d in sink.requests("/limited")]
    summary = check_all(Run.load(env.history.path), recovery_bound_s=p.recovery_bound_s)
    assert summary.count("nothing lost", "steps_succeeded") == p.steps
    worst = []
    for window in (0.5, 1.0, 2.0, 5.0):
        bound = p.burst + p.rate * window
        seen = busiest(calls, window)
        worst.append((seen / bound, window, seen, bound))
        assert seen <= bound + JITTER_CALLS, (
            f"{seen} calls in a {window:g} s window; the limit allows {bound:g}"
        )
    span = max(calls) - min(calls)
    average = (len(calls) - p.burst) / span if span > 0 else float("inf")
    ratio, window, seen, bound = max(worst)
    env.figures.add(
        f"rate limit {p.rate:g}/s burst {p.burst}, {p.steps} steps on 2 executors x 8 slots, "
        f"Redis SIGKILLed and restarted empty {p.outages}x ({p.down_s:g} s down): busiest "
        f"{window:g} s window {seen} calls of {bound:g} allowed ({ratio:.0%}), average "
        f"{average:.1f} calls/s of {p.rate:g}; {summary.standard()}"
    )
