"""A controller replica SIGKILLed while clients submit with Idempotency-Key and retry on errors
and timeouts, failing over to the other replica: exactly one task per key, nothing lost."""

from __future__ import annotations

import time

from tests.e2e.processes import Proc
from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv, KeyedClients, pace, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

SUBMIT_EVERY_S = 0.12  # per client: a steady stream that spans every kill
# Submit-and-wait: the reply comes once the task is over, so a kill often lands after the
# commit and before the reply, and the client's retry must find the task, not make another.
WAIT_S = 1.0


def test_controller_replica_killed_while_clients_retry(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.controller
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, delay=0.02, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)
        replicas: list[Proc] = [
            c.start_controller(f"controller-{r}", database_url=env.db_url(), tools=tools)
            for r in "ab"
        ]
        addresses = [(ctl.info["http"], ctl.info["grpc"]) for ctl in replicas]
        executors = [
            c.start_executor(f"executor-{r}", grpc=ctl.info["grpc"], slots=6)
            for r, ctl in zip("ab", replicas, strict=True)
        ]
        c.await_registered(executors)
        # Short client timeouts: a call to a dead replica fails over quickly.
        api = env.api(replicas, timeout=3)
        keys = [f"ctl-key-{n}" for n in range(p.keys)]
        clients = KeyedClients(
            api, keys, clients=p.clients, steps=p.steps_per_task, tool="ledger.post",
            every_s=SUBMIT_EVERY_S, wait_s=WAIT_S,
        )  # fmt: skip
        progress = env.progress()
        kills, generation = 0, 0

        try:
            while kills < p.kills:
                if pace(p.kill_every_s, unless=clients.done):
                    break
                index = env.rng.randrange(len(replicas))
                env.faults.sigkill(replicas[index])
                kills += 1
                time.sleep(p.down_s)  # the replica stays down this long
                generation += 1
                http, grpc = addresses[index]
                replicas[index] = c.start_controller(
                    f"controller-{'ab'[index]}-{generation}",
                    database_url=env.db_url(),
                    tools=tools,
                    http=http,
                    grpc=grpc,
                )
                env.faults.restarted(replicas[index])
        finally:
            clients.join()
        assert clients.done(), "a client did not finish submitting"
        env.wait_settled(
            progress, expected=p.keys * p.steps_per_task, within=p.recovery_bound_s + 60
        )
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
    run = Run.load(env.history.path)
    summary = check_all(run, recovery_bound_s=p.recovery_bound_s)
    assert kills >= 2, f"only {kills} replica kills happened while clients were submitting"
    accepted = run.accepted()
    assert set(accepted) == set(keys), "some keys were never accepted"
    assert len(run.tasks) == len(keys), f"{len(run.tasks)} tasks for {len(keys)} keys"
    failed_calls = [s for s in run.submits if s.get("outcome") != "accepted"]
    retried_keys = {s["key"] for s in failed_calls}
    env.figures.add(
        f"2 controller replicas, {p.clients} clients submitting {p.keys} tasks with "
        f"Idempotency-Key and ?wait={WAIT_S:g} (retry + fail-over on errors and timeouts), a "
        f"replica SIGKILLed every "
        f"{p.kill_every_s:g} s and restarted {p.down_s:g} s later ({kills} kills): "
        f"{len(failed_calls)} failed calls retried for {len(retried_keys)} keys "
        f"({len(run.found_on_retry())} found the task a lost reply had created), "
        f"{len(keys)} keys → {len(run.tasks)} tasks; {summary.standard()}"
    )
