"""Scheduled steps survive every component: steps due a few seconds after their submit, the
controller and the executor SIGKILLed between the submit and the due time and started again;
every step runs once, none before its time, all soon after it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.faults.checkers import Run, check_all
from tests.faults.harness import FaultEnv, pace, plan, sink_tool
from tests.faults.recording import observe, record_sink
from tests.support.sink import Response, Sink

TASKS = 30
LEAD_S = 8.0  # from the last submit to the due time: the kills and restarts happen inside it
DOWN_S = 2.0
# After the due time, every step must have run within this (2x the slack these machines need:
# a restarted executor registers, its first long poll finds the steps due).
RECOVERY_BOUND_S = 20.0


def test_scheduled_steps_run_once_at_their_time_across_restarts(fault_env: FaultEnv) -> None:
    env = fault_env
    with Sink() as sink, env.cluster() as c:
        sink.script("/ledger", [Response(json={"ok": True}, echo=True)])
        tools = env.tools([sink_tool("ledger.post", f"{sink.url}/ledger")], sink=sink)
        ctl = c.start_controller("controller", database_url=env.db_url(), tools=tools)
        executor = c.start_executor("executor", grpc=ctl.info["grpc"], slots=8)
        c.await_registered([executor])
        api = env.api([ctl], timeout=5)
        due = datetime.now(UTC) + timedelta(seconds=LEAD_S + 3)
        keys = [f"due-{n}" for n in range(TASKS)]
        for key in keys:
            body = plan(key, [f"{key}-op"], "ledger.post")
            body["steps"][0]["run_at"] = due.isoformat()
            api.submit(body, key=key)
        assert datetime.now(UTC) < due - timedelta(seconds=LEAD_S / 2), "submits took too long"
        # Both processes die with the steps queued for later, and come back before they are due.
        env.faults.sigkill(executor)
        env.faults.sigkill(ctl)
        pace(DOWN_S, unless=lambda: False)
        ctl = c.start_controller(
            "controller-2", database_url=env.db_url(), tools=tools, grpc=ctl.info["grpc"]
        )
        env.faults.restarted(ctl)
        executor = c.start_executor("executor-2", grpc=ctl.info["grpc"], slots=8)
        env.faults.restarted(executor)
        api = env.api([ctl], timeout=5)
        assert sink.requests("/ledger") == [], "a step ran before its time"
        progress = env.progress()
        env.wait_settled(progress, expected=TASKS, within=LEAD_S + RECOVERY_BOUND_S + 30)
        settled_at = time.time()
        progress.close()
        observe(env.history, api)
        record_sink(env.history, sink)
        deliveries = sink.requests("/ledger")
    run = Run.load(env.history.path)
    summary = check_all(run, recovery_bound_s=None)
    assert {task["status"] for task in run.tasks.values()} == {"succeeded"}
    assert len(deliveries) == TASKS, f"{len(deliveries)} deliveries for {TASKS} steps"
    assert len({d.key for d in deliveries}) == TASKS, "a step ran twice"
    starts = [d.wall - due.timestamp() for d in deliveries]
    assert min(starts) >= 0, f"a step ran {-min(starts):.2f} s before its time"
    assert max(starts) <= RECOVERY_BOUND_S, f"the last step ran {max(starts):.1f} s late"
    env.figures.add(
        f"scheduled: {TASKS} steps due {LEAD_S:g}+ s after their submits, controller and executor "
        f"SIGKILLed and restarted {DOWN_S:g} s later before the due time: none ran early, "
        f"{len(deliveries)} ran once each, first {min(starts):.2f} s / last {max(starts):.2f} s "
        f"after the due time (bound {RECOVERY_BOUND_S:g} s), settled "
        f"{settled_at - due.timestamp():.1f} s after it; {summary.standard()}"
    )
