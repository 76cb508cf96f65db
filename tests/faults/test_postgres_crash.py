"""Postgres crash-restarted repeatedly mid-run: while it is down the API answers 503 with
Retry-After (never a 500); afterwards controllers and executors reconnect by themselves and
every task finishes."""

from __future__ import annotations

import threading
import time

from tests.faults.checkers import Checker, Finding, Run, check_all
from tests.faults.harness import Api, FaultEnv, batches, pace, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

POLL_EVERY_S = 0.1
MAX_POLLS = 20_000
MAX_KEYED = 2_000


def poll(api: Api, task_id: str, stop: threading.Event) -> None:
    """Ask readiness and a task over and over, recording every answer (bounded)."""
    for _ in range(MAX_POLLS):
        if stop.wait(POLL_EVERY_S):
            return
        api.probe("/readyz")
        api.probe(f"/v1/tasks/{task_id}")


def submit_steadily(api: Api, stop: threading.Event, accepted: list[str]) -> None:
    """One-step tasks with Idempotency-Keys, each retried (after Retry-After) until accepted."""
    for n in range(MAX_KEYED):
        if stop.wait(0.2):
            return
        key = f"pg-keyed-{n}"
        api.submit(plan(key, [key], "ledger.post"), key=key, within=60)
        accepted.append(key)


AFTER_OUTAGE_S = 5.0


def outage_windows(run: Run, *, after_s: float = 0.0) -> list[tuple[int, int]]:
    """(crash, start + after_s) pairs, monotonic ns."""
    windows: list[tuple[int, int]] = []
    down: int | None = None
    for r in run.faults:
        if r["action"] == "pg_crash":
            down = r["t"]
        elif r["action"] == "pg_start" and down is not None:
            windows.append((down, r["t"] + int(after_s * 1e9)))
            down = None
    return windows


def outage_answers() -> Checker:
    """What clients heard while Postgres was down."""

    def check(run: Run) -> Finding:
        f = Finding("answers during outages")
        windows = outage_windows(run)
        for r in [*run.answers, *run.submits]:
            if any(a <= r["t"] <= b for a, b in windows):
                f.counts["during"] += 1
                f.counts[f"during_{r.get('status', r.get('outcome'))}"] += 1
        if not f.counts["during_503"]:
            f.problem("no answer given while Postgres was down was a 503")
        return f

    return check


def test_postgres_crash_restarted_repeatedly(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.postgres
    stop = threading.Event()
    keyed: list[str] = []
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, delay=p.call_delay_s, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools)
        executors = [
            c.start_executor(f"executor-{i}", grpc=ctl.info["grpc"], slots=p.slots)
            for i in range(p.executors)
        ]
        c.await_registered(executors)
        api = env.api([ctl], timeout=5)
        task_ids = []
        for first, count in batches(p.steps, p.steps_per_task):
            key = f"pg-{first}"
            ops = [f"op-{first + i}" for i in range(count)]
            task_ids.append(api.submit(plan(key, ops, "ledger.post"), key=key))
        progress = env.progress()
        threads = [
            threading.Thread(target=poll, args=(api, task_ids[0], stop), daemon=True),
            threading.Thread(target=submit_steadily, args=(api, stop, keyed), daemon=True),
        ]
        for thread in threads:
            thread.start()
        crashes = 0
        try:
            while crashes < p.crashes:
                if pace(p.up_s, unless=lambda: progress.nearly_done(p.steps)):
                    break
                env.faults.pg_crash()
                crashes += 1
                time.sleep(p.down_s)  # the outage itself
                env.faults.pg_start()
        finally:
            env.faults.heal_all()
        env.wait_settled(progress, expected=p.steps, within=p.recovery_bound_s + 60)
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
            assert not thread.is_alive(), f"{thread.name} did not stop"
        env.wait_settled(progress, expected=p.steps + len(keyed), within=60)
        # Nobody's heartbeat could be recorded while Postgres was down: an outage must not
        # pass for dead executors (no lease released, so no step run twice). A lease whose poll
        # reply was lost to the outage goes back too, but as never run: not counted here.
        lost = progress.scalar(
            "SELECT count(*) FROM events WHERE kind <> 'result_rejected' "
            "AND data->'error'->>'code' = 'lease_lost' "
            "AND data->'error'->>'message' NOT LIKE '%%never reached its executor%%'"
        )
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
    summary = check_all(
        Run.load(env.history.path),
        recovery_bound_s=p.recovery_bound_s,
        extra=[outage_answers()],
    )
    assert crashes >= 2, f"only {crashes} crashes happened before the run ended"
    assert lost == 0, f"{lost} leases were released as lost because of a database outage"
    during = summary.findings["answers during outages"].counts
    api_counts = summary.findings["API answers"].counts
    env.figures.add(
        f"{p.executors} executors, {p.steps:,} steps + {len(keyed)} keyed one-step submits, "
        f"Postgres crashed (-m immediate) {crashes} times for {p.down_s:g} s every "
        f"{p.up_s + p.down_s:g} s: {during['during']} API answers during outages — "
        f"{during['during_503']} answered 503 with Retry-After, "
        f"{api_counts['server_errors']} answered 500; "
        f"{lost} leases released as lost; "
        f"{summary.standard()}"
    )
