"""The scenario the project exists for, on Postgres, with every process of the stack restarted
while the reminder waits for its time.

"If it rains in Wuhan tomorrow, remind me at 08:00 to take an umbrella": the weather is read, the
reminder written and read back (verified), and at "08:00" (in the user's zone; compressed here
to seconds from now) one message goes to the user's phone (a signed webhook) and inbox (SMTP),
each with its own record. Between the scheduling and the delivery the controller and the executor
are SIGKILLed and started again: the delivery still happens, once per channel, not early.
"""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_reach_cli import demo
from tests.e2e.processes import all_terminal, api, cluster, wait_until
from tests.support.server import free_port

pytestmark = pytest.mark.e2e
# Far enough ahead to verify the reminder and restart everything before it is due.
AHEAD = timedelta(seconds=20)


def test_the_umbrella_reminder_reaches_each_channel_once_across_restarts(
    postgres_url: str, tmp_path: Path
) -> None:
    demo_port, smtp_port = free_port(), free_port()
    demo_url = f"http://127.0.0.1:{demo_port}"
    env = {
        demo.ENV_URL: demo_url,
        demo.ENV_SMTP_HOST: "127.0.0.1",
        demo.ENV_SMTP_PORT: str(smtp_port),
        demo.ENV_WEBHOOK_SECRET: "whsec_" + base64.b64encode(os.urandom(24)).decode(),
    }
    with cluster(tmp_path, env=env) as c:
        service = c.spawn(
            "demo",
            [
                "demo-service",
                "--http",
                f"127.0.0.1:{demo_port}",
                "--smtp",
                f"127.0.0.1:{smtp_port}",
            ],
        )
        wait_until(lambda: "listening" in service.output(), within=30, what="the demo service")
        flags = ["--migrate", "--lease-seconds", "2"]
        ctl = c.controller(
            "controller", database_url=postgres_url, tools=demo.TOOLS_FILE, extra=flags
        )
        executor = c.executor("executor", controller=ctl, slots=4)
        due = datetime.now(UTC) + AHEAD
        with api(ctl) as client:
            plan = demo.umbrella_plan("Wuhan", demo_url=demo_url, at=due)
            answer = client.post("/v1/tasks", json=plan)
            assert answer.status_code == 202, answer.text
            task_id = answer.json()["task_id"]

            def scheduled() -> dict[str, Any] | None:
                steps = {
                    s["step_id"]: s for s in client.get(f"/v1/tasks/{task_id}").json()["steps"]
                }
                verified = (steps["remind"].get("receipt") or {}).get("meta", {}).get("verified")
                waiting = all(steps[f"tell[{n}]"]["status"] == "ready" for n in (0, 1))
                return steps if verified and waiting else None

            steps = wait_until(scheduled, within=30, what="the reminder to be verified and due")
        assert datetime.fromisoformat(steps["tell[0]"]["run_at"]) == due.replace(microsecond=0)
        executor.kill()
        ctl.kill()
        assert datetime.now(UTC) < due, "the stack took too long to reach the restart"
        http, grpc = ctl.info["http"], ctl.info["grpc"]
        again = c.controller(
            "controller-2",
            database_url=postgres_url,
            tools=demo.TOOLS_FILE,
            extra=[*flags, "--http", http, "--grpc", grpc],
        )
        c.executor("executor-2", controller=again, slots=4)
        with api(again) as client:
            [task] = wait_until(
                lambda: all_terminal(client, [task_id]), within=90, what="the task to end"
            )
        delivered = httpx.get(f"{demo_url}/deliveries").json()  # what the phone and inbox got
    assert task["status"] == "succeeded", task
    by_id = {s["step_id"]: s for s in task["steps"]}
    rows = by_id["tell"]["receipt"]["targets"]
    assert [(r["output"]["channel"], r["status"], r["attempts"]) for r in rows] == [
        ("webhook", "succeeded", 1),
        ("email", "succeeded", 1),
    ]
    for row in rows:  # not before 08:00
        assert datetime.fromisoformat(row["done_at"]) >= due.replace(microsecond=0)
    assert by_id["remind"]["receipt"]["meta"]["verified"] is True
    assert len(delivered["webhooks"]) == 1
    assert [e["to"] for e in delivered["emails"]] == [["you@example.org"]]
    assert (
        delivered["webhooks"][0]["data"]["message"]
        == by_id["weather"]["receipt"]["data"]["summary"]
    )
    # One trace: every step's receipt, restarts or not, names the task's trace.
    assert {s["receipt"]["meta"]["trace_id"] for s in task["steps"]} == {task["trace_id"]}
