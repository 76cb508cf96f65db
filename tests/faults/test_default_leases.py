"""With the controller's default lease settings (what a deployment gets, not the suite's 2 s):
a SIGKILLed executor's slow steps run elsewhere within seconds, and a SIGKILLed controller costs
no re-run when executors know every replica."""

from __future__ import annotations

import time
from collections import Counter

from tests.e2e.processes import wait_until
from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

STEPS = 40
# The bound for "a dead executor's steps move on": the default liveness is 6 s, the
# reaper looks every second, then each step runs for CALL_S on the survivor. 15 s is the bound
# asked for (more than twice what a healthy run takes here).
KILL_BOUND_S = 15.0
CALL_S = 2.0


def test_a_killed_executors_slow_steps_finish_elsewhere_with_default_leases(
    fault_env: FaultEnv,
) -> None:
    env = fault_env
    with Sink() as sink, env.cluster() as c:
        sink.script("/slow", [Response(json={"ok": True}, delay=CALL_S, echo=True)])
        tools = env.tools([sink_tool("slow.post", f"{sink.url}/slow")], sink=sink)
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools, lease_s=None)
        grpc = ctl.info["grpc"]
        victim = c.start_executor("victim", grpc=grpc, slots=STEPS)
        c.await_registered([victim])
        api = env.api([ctl])
        api.submit(plan("slow", [f"op-{i}" for i in range(STEPS)], "slow.post"), key="slow")
        # The victim holds every step, each call in flight at the downstream.
        wait_until(
            lambda: len({d.key for d in sink.requests("/slow")}) == STEPS,
            within=60,
            what="the victim to start every step",
        )
        survivor = c.start_executor("survivor", grpc=grpc, slots=STEPS)
        c.await_registered([survivor])
        killed_at = time.monotonic()
        env.faults.sigkill(victim)
        progress = env.progress()
        env.wait_settled(progress, expected=STEPS, within=KILL_BOUND_S + 60)
        took = time.monotonic() - killed_at
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
        by_executor = Counter(d.headers.get("x-executor") for d in sink.requests("/slow"))
    summary = check_all(Run.load(env.history.path), recovery_bound_s=KILL_BOUND_S)
    assert by_executor == {"victim": STEPS, "survivor": STEPS}, by_executor
    env.figures.add(
        f"default leases: executor holding {STEPS} {CALL_S:g}-second steps SIGKILLed; every "
        f"step terminal {summary.recovery_s:.1f} s after the kill (bound {KILL_BOUND_S:g} s; "
        f"{took:.1f} s to observe): {summary.standard()}"
    )


def test_a_killed_controller_costs_no_rerun_when_executors_know_every_replica(
    fault_env: FaultEnv,
) -> None:
    env = fault_env
    with Sink() as sink, env.cluster() as c:
        sink.script("/slow", [Response(json={"ok": True}, delay=CALL_S, echo=True)])
        tools = env.tools([sink_tool("slow.post", f"{sink.url}/slow")], sink=sink)
        replicas = [
            c.start_controller(
                f"controller-{r}", database_url=env.db_url(), tools=tools, lease_s=None
            )
            for r in "ab"
        ]
        both = ",".join(r.info["grpc"] for r in replicas)
        executors = [c.start_executor(f"executor-{i}", grpc=both, slots=STEPS) for i in range(2)]
        c.await_registered(executors)
        api = env.api([replicas[1]])
        api.submit(plan("ctl", [f"op-{i}" for i in range(STEPS)], "slow.post"), key="ctl")
        wait_until(
            lambda: len({d.key for d in sink.requests("/slow")}) >= STEPS // 2,
            within=60,
            what="the executors to hold steps",
        )
        killed_at = time.monotonic()
        env.faults.sigkill(replicas[0])
        progress = env.progress()
        env.wait_settled(progress, expected=STEPS, within=KILL_BOUND_S + 60)
        took = time.monotonic() - killed_at
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
        deliveries = sink.deliveries_per_key()
    summary = check_all(Run.load(env.history.path), recovery_bound_s=KILL_BOUND_S)
    reruns = {key: n for key, n in deliveries.items() if n > 1}
    assert len(deliveries) == STEPS
    assert not reruns, f"steps that ran more than once: {reruns}"
    env.figures.add(
        f"default leases: 2 controllers, 2 executors each given both addresses, one controller "
        f"SIGKILLed while they held {STEPS} steps: 0 re-runs, all terminal {took:.1f} s later: "
        f"{summary.standard()}"
    )
