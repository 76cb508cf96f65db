"""Ambiguous commits: a proxy between the controller and Postgres forwards COMMIT, then cuts the
connection before the answer (the write happened, the controller was told it failed). Nothing
is lost, no transition happens twice, a retried submit finds its one task."""

from __future__ import annotations

import threading
from collections import Counter

from tests.e2e.processes import wait_until
from tests.faults.checkers import Run, check_all
from tests.faults.harness import Api, FaultEnv, batches, pace, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.proxy import CommitCut, PgProxy
from tests.support.sink import Response, Sink


def writes(statements: tuple[str, ...]) -> bool:
    """Whether a transaction wrote anything (its COMMIT is worth cutting)."""
    return any(s.lower().startswith(("insert", "update", "delete", "with")) for s in statements)


def kind_of(cut: CommitCut) -> str:
    """Which use case a cut transaction belonged to, from its statements."""
    text = " ".join(cut.statements).lower()
    if "insert into idempotency_keys" in text or "insert into tasks" in text:
        return "submit"
    if "as materialized" in text or ("update steps set status" in text and "lease_owner" in text):
        return "claim"
    if "jsonb_to_recordset" in text and "update tasks" in text:
        return "report/reap (task finished)"
    if "jsonb_to_recordset" in text:
        return "report/reap"
    if "update steps set lease_expires_at" in text:
        return "heartbeat"
    return "other write"


def submit_keyed(api: Api, count: int, stop: threading.Event) -> None:
    for n in range(count):
        if stop.wait(0.05):
            return
        key = f"commit-keyed-{n}"
        api.submit(plan(key, [key], "ledger.post"), key=key, within=90)


def test_ambiguous_commits_change_nothing_twice(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.commit
    stop = threading.Event()
    with (
        Sink() as sink,
        PgProxy(("127.0.0.1", env.pg.port), on_fault=env.faults.proxy_event) as proxy,
        env.cluster() as c,
    ):
        sink.script("/ledger", [Response(json={"ok": True}, delay=p.call_delay_s, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)
        ctl = c.start_controller(
            "controller", database_url=env.db_url(port=proxy.port), tools=tools
        )
        executors = [
            c.start_executor(f"executor-{i}", grpc=ctl.info["grpc"], slots=p.slots)
            for i in range(p.executors)
        ]
        c.await_registered(executors)
        api = env.api([ctl])
        progress = env.progress()  # straight to Postgres, not through the proxy
        proxy.arm_commit_cuts(p.cuts, every=p.cut_every, only=writes)
        keyed = threading.Thread(
            target=submit_keyed, args=(api, p.keyed_submits, stop), daemon=True
        )
        keyed.start()
        for first, count in batches(p.steps, p.steps_per_task):
            key = f"commit-{first}"
            ops = [f"op-{first + i}" for i in range(count)]
            api.submit(plan(key, ops, "ledger.post"), key=key, within=90)
        total = p.steps + p.keyed_submits
        for _ in range(p.drops):
            if pace(2.0, unless=lambda: progress.nearly_done(total)):
                break
            proxy.drop_all()
        keyed.join(timeout=120)
        assert not keyed.is_alive(), "the keyed submitter did not finish"
        # Commits go on after the work (the reaper's transactions), so every cut is made.
        wait_until(lambda: proxy.cuts_left == 0, within=60, what="every armed COMMIT cut")
        proxy.disarm()
        env.wait_settled(progress, expected=total, within=p.recovery_bound_s + 60)
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
        cuts = list(proxy.cuts)
        commits = proxy.commits_seen
    stop.set()
    run = Run.load(env.history.path)
    summary = check_all(run, recovery_bound_s=p.recovery_bound_s)
    kinds = Counter(kind_of(cut) for cut in cuts)
    assert len(cuts) == p.cuts
    refused = Counter(
        s.get("status") or s.get("outcome") for s in run.submits if s.get("outcome") != "accepted"
    )
    by_kind = ", ".join(f"{n} {k}" for k, n in kinds.most_common())
    env.figures.add(
        f"{p.executors} executors, {p.steps:,} steps + {p.keyed_submits} keyed submits through a "
        f"proxy to Postgres: {len(cuts)} of {commits:,} COMMITs cut after forwarding ({by_kind}), "
        f"{p.drops} drops of every connection; submits retried after "
        f"{sum(refused.values())} failed answers ({dict(refused)}), "
        f"{len(run.found_on_retry())} found the task a cut COMMIT had created, "
        f"each key has one task; "
        f"{summary.standard()}"
    )
