"""Executors SIGKILLed repeatedly in a multi-thousand-step run: nothing lost, one effect each."""

from __future__ import annotations

import time

from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv, batches, pace, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink


def test_executors_sigkilled_repeatedly(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.kills
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, delay=p.call_delay_s, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools)
        grpc = ctl.info["grpc"]
        executors = [
            c.start_executor(f"executor-{i}", grpc=grpc, slots=p.slots) for i in range(p.executors)
        ]
        c.await_registered(executors)
        api = env.api([ctl])
        for first, count in batches(p.steps, p.steps_per_task):
            key = f"kills-{first}"
            api.submit(plan(key, [f"op-{first + i}" for i in range(count)], "ledger.post"), key=key)
        progress = env.progress()
        began = time.monotonic()
        kills, generation = 0, 0
        while kills < p.max_kills:
            # Every kill, the last one included, must catch work in flight.
            if pace(p.kill_every_s, unless=lambda: progress.nearly_done(p.steps)):
                break
            index = env.rng.randrange(len(executors))
            env.faults.sigkill(executors[index])
            generation += 1
            executors[index] = c.start_executor(
                f"executor-{index}-{generation}", grpc=grpc, slots=p.slots
            )
            env.faults.restarted(executors[index])
            kills += 1
        env.wait_settled(progress, expected=p.steps, within=p.recovery_bound_s + 60)
        elapsed = time.monotonic() - began
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
    summary = check_all(Run.load(env.history.path), recovery_bound_s=p.recovery_bound_s)
    assert kills >= 3, f"only {kills} kills happened before the run ended: make the run longer"
    redelivered = summary.count("no duplicate effects", "redeliveries")
    env.figures.add(
        f"{p.executors} executors, {p.steps:,} steps, one executor SIGKILLed every "
        f"{p.kill_every_s:g} s ({kills} kills in {elapsed:.0f} s): {summary.standard()}; "
        f"{redelivered} redeliveries absorbed by Idempotency-Key"
    )
