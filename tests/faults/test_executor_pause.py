"""An executor SIGSTOPped past its lease, then SIGCONTed: its late results are rejected, the steps
ran again elsewhere under a higher attempt, and the downstream applied each effect once."""

from __future__ import annotations

import re
import time

from tests.e2e.processes import Proc, wait_until
from tests.faults.checkers import Checker, Finding, Run, check_all
from tests.faults.harness import (
    LEASE_S,
    FaultEnv,
    Progress,
    batches,
    plan,
    sink_tool,
)
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

# A resumed executor's log line for a result it dropped because its lease was lost (or, its
# session having expired meanwhile, lost with the session).
DROPPED_LOST = re.compile(r'"event":\s*"step_dropped".*?"reason":\s*"lost')
# Stopped until the reaper took its leases back, then this much longer.
EXTRA_PAUSE_S = 1.5


def reran_elsewhere(victims: set[str]) -> Checker:
    """Steps a paused executor held whose lease expired and which another executor finished."""

    def check(run: Run) -> Finding:
        f = Finding("re-ran elsewhere")
        # A lease's owner is the session of the executor that took it (a lease event names both).
        holders = set(victims) | {
            (e.get("data") or {}).get("session")
            for events in run.step_events.values()
            for e in events
            if e["event"] == "lease" and (e.get("data") or {}).get("executor_id") in victims
        }
        for key, events in run.step_events.items():
            f.counts["victim_rejected"] += sum(
                e["event"] == "result_rejected"
                and (e.get("data") or {}).get("executor_id") in victims
                for e in events
            )
            step = run.steps.get(key)
            leases = [e for e in events if e["event"] == "lease"]
            expired = [
                e
                for e in events
                if e["event"] == "retry" and (e.get("data") or {}).get("lease_owner") in holders
            ]
            if not expired or step is None:
                continue
            f.counts["expired"] += 1
            last = leases[-1]
            owner = (last.get("data") or {}).get("executor_id")
            if step.status == "succeeded" and owner not in victims:
                f.counts["reran_elsewhere"] += 1
            if step.attempt <= expired[0]["attempt"] - 1:
                f.problem(f"{key}: lease expired at attempt {step.attempt}, yet no new attempt")
        return f

    return check


def expired_leases_of(progress: Progress, executor: str) -> int:
    """Leases of `executor` the reaper took back (lease expired: retried elsewhere). A lease's
    owner is the executor's session; the session names the executor."""
    sql = (
        "SELECT count(*) FROM events e JOIN executor_sessions s ON s.id = e.data->>'lease_owner' "
        "WHERE e.kind = 'retry' AND s.executor_id = %s"
    )
    return int(progress.scalar(sql, (executor,)) or 0)


def pause_round(
    env: FaultEnv, sink: Sink, progress: Progress, victim: Proc, *, total: int
) -> float:
    """SIGSTOP `victim` while it has calls in flight, keep it stopped until the reaper has taken
    its leases back and a little longer, SIGCONT it; returns how long it was stopped."""
    name = victim.info["executor_id"]

    def in_flight() -> bool:
        # A call is answered after `call_delay_s`: one that arrived just now is still in flight.
        now = time.monotonic()
        recent = [d for d in sink.requests("/ledger")[-200:] if now - d.at < 0.2]
        return any(d.headers.get("x-executor") == name for d in recent)

    wait_until(in_flight, within=30, what=f"{name} to have calls in flight")
    env.faults.sigstop(victim)
    stopped = time.monotonic()
    wait_until(
        lambda: expired_leases_of(progress, name) > 0,
        within=30,
        what=f"the leases of the paused {name} to expire",
    )
    time.sleep(EXTRA_PAUSE_S)  # the pause itself is the fault: others run its steps meanwhile
    env.faults.sigcont(victim)
    took = time.monotonic() - stopped
    # Its late results are rejected by the controller, or dropped by the executor itself once a
    # heartbeat tells it the leases are lost, before the next round.
    wait_until(
        lambda: (
            progress.rejected(name) > 0
            or DROPPED_LOST.search(victim.output()) is not None
            or progress.settled(total)
        ),
        within=15,
        what=f"the resumed {name} to report",
    )
    return took


def test_paused_executor_results_are_rejected(fault_env: FaultEnv) -> None:
    env, p = fault_env, fault_env.profile.pause
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, delay=p.call_delay_s, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools)
        executors = [
            c.start_executor(f"executor-{i}", grpc=ctl.info["grpc"], slots=p.slots)
            for i in range(p.executors)
        ]
        c.await_registered(executors)
        api = env.api([ctl])
        for first, count in batches(p.steps, p.steps_per_task):
            key = f"pause-{first}"
            api.submit(plan(key, [f"op-{first + i}" for i in range(count)], "ledger.post"), key=key)
        progress = env.progress()
        victims: set[str] = set()
        rounds = 0
        paused: list[float] = []
        while rounds < p.max_rounds and not progress.settled(p.steps):
            told = any(DROPPED_LOST.search(e.output()) for e in executors)
            if rounds >= p.rounds and (progress.rejected() > 0 or told):
                break
            victim = executors[rounds % len(executors)]
            victims.add(victim.info["executor_id"])
            paused.append(pause_round(env, sink, progress, victim, total=p.steps))
            rounds += 1
        env.wait_settled(progress, expected=p.steps, within=p.recovery_bound_s + 60)
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
        # A resumed executor whose heartbeat goes first learns its leases were lost and drops
        # their results itself; one whose report goes first has them rejected. Either is right.
        dropped = sum(
            len(DROPPED_LOST.findall(proc.output()))
            for proc in executors
            if proc.info.get("executor_id") in victims
        )
    summary = check_all(
        Run.load(env.history.path),
        recovery_bound_s=p.recovery_bound_s,
        extra=[reran_elsewhere(victims)],
    )
    rejected_from_victims = summary.count("re-ran elsewhere", "victim_rejected")
    assert rejected_from_victims + dropped > 0, (
        "no late result of a paused executor was rejected, nor dropped as lost by the executor"
    )
    reran = summary.count("re-ran elsewhere", "reran_elsewhere")
    assert reran > 0, "no step held by a paused executor was finished by another one"
    env.figures.add(
        f"{p.executors} executors, {p.steps:,} steps, an executor with calls in flight "
        f"SIGSTOPped past its lease ({LEASE_S:g} s; stopped {min(paused):.1f}-{max(paused):.1f} s) "
        f"then SIGCONTed, {rounds} times: {rejected_from_victims} late results rejected by "
        f"the controller, {dropped} dropped by the resumed executor (told its leases were "
        f"lost), {reran} steps re-ran elsewhere under a new attempt; "
        f"{summary.standard()}"
    )
