"""A rolling upgrade, as Kubernetes does one: 2 controllers and 3 executors under a steady stream
of keyed submits, every component stopped gracefully (SIGTERM) and started again one after the
other, and a newer release's expand migration (columns added) applied in the middle. Nothing is
lost or done twice, no step is left `outcome_unknown`, and callers see no 5xx but 503 with
Retry-After."""

from __future__ import annotations

from collections import Counter

import psycopg

from tests.e2e.processes import Proc
from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv, KeyedClients, pace, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

SUBMIT_EVERY_S = 0.1  # per client
WAIT_S = 1.0  # submit-and-wait: a stop often lands between the commit and the reply
# What a newer release's expand migration does while this one runs: columns added, with defaults.
EXPAND = [
    f"ALTER TABLE {table} ADD COLUMN rollout_probe text DEFAULT 'n+1'"
    for table in ("tasks", "steps", "events", "executor_sessions", "audit_log")
]


def test_rolling_restart_of_every_component_with_an_expand_migration(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.rolling
    controller_env = {"AGENT_REACH_CONTROLLER_SHUTDOWN_DELAY": str(p.shutdown_delay_s)}
    exits: dict[str, int] = {}
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, delay=0.02, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)

        def start_controller(
            name: str, http: str = "127.0.0.1:0", grpc: str = "127.0.0.1:0"
        ) -> Proc:
            return c.start_controller(
                name, database_url=env.db_url(), tools=tools, http=http, grpc=grpc,
                env=controller_env, lease_s=None,
            )  # fmt: skip

        controllers = [start_controller(f"controller-{r}") for r in "ab"]
        every_controller = list(controllers)
        addresses = [(ctl.info["http"], ctl.info["grpc"]) for ctl in controllers]
        grpc_all = ",".join(grpc for _, grpc in addresses)
        executors = [
            c.start_executor(f"executor-{i}", grpc=grpc_all, slots=6) for i in range(p.executors)
        ]
        c.await_registered(executors)
        api = env.api(controllers, timeout=5)
        keys = [f"roll-key-{n}" for n in range(p.keys)]
        clients = KeyedClients(
            api, keys, clients=p.clients, steps=p.steps_per_task, tool="ledger.post",
            every_s=SUBMIT_EVERY_S, wait_s=WAIT_S,
        )  # fmt: skip
        progress = env.progress()

        def stopped(proc: Proc) -> None:
            exits[proc.name] = proc.terminate(timeout=60)
            env.faults.restarted(proc)

        restarts = 0
        try:
            for index in range(len(controllers)):
                pace(p.pause_s, unless=clients.done)
                stopped(controllers[index])
                http, grpc = addresses[index]
                controllers[index] = start_controller(
                    f"controller-{'ab'[index]}-new", http=http, grpc=grpc
                )
                every_controller.append(controllers[index])
                restarts += 1
            with psycopg.connect(env.db_url().replace("+psycopg", ""), autocommit=True) as admin:
                for statement in EXPAND:
                    admin.execute(statement)
            for index in range(len(executors)):
                pace(p.pause_s, unless=clients.done)
                stopped(executors[index])
                executors[index] = c.start_executor(f"executor-{index}-new", grpc=grpc_all, slots=6)
                c.await_registered([executors[index]])
                restarts += 1
        finally:
            clients.join()
        assert clients.done(), "a client did not finish submitting"
        env.wait_settled(
            progress, expected=p.keys * p.steps_per_task, within=p.recovery_bound_s + 60
        )
        unknown = progress.scalar("SELECT count(*) FROM steps WHERE status = 'outcome_unknown'")
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
    # A graceful rollout logs no error: a statement the migration broke would (gRPC's
    # "Unexpected ... raised by servicer method"), even if retries hid it from the callers.
    errors = [
        line
        for proc in every_controller
        for line in proc.output().splitlines()
        if '"level": "error"' in line
    ]
    assert not errors, "\n".join(errors[:3])
    run = Run.load(env.history.path)
    summary = check_all(run, recovery_bound_s=p.recovery_bound_s)
    assert len(exits) == 2 + p.executors
    assert all(code == 0 for code in exits.values()), f"unclean exits: {exits}"
    assert unknown == 0, f"{unknown} steps left outcome_unknown by a graceful stop"
    assert set(run.accepted()) == set(keys), "some keys were never accepted"
    assert len(run.tasks) == len(keys), f"{len(run.tasks)} tasks for {len(keys)} keys"
    refused = Counter(
        str(s.get("status") or s.get("outcome"))
        for s in run.submits
        if s.get("outcome") != "accepted"
    )
    retried = ", ".join(f"{n} {what}" for what, n in sorted(refused.items())) or "none"
    env.figures.add(
        f"rolling restart: 2 controllers (shutdown delay {p.shutdown_delay_s:g} s) and "
        f"{p.executors} executors stopped with SIGTERM and started again one by one "
        f"({restarts} restarts, all exit 0) under {p.clients} clients submitting {p.keys} "
        f"keyed tasks, a 5-table expand migration in the middle: submits retried ({retried}), "
        f"0 outcome_unknown; {summary.standard()}"
    )
