"""A step that outlives the liveness window many times over, on an executor whose every slot
keeps the CPU busy, finishes on its first attempt: one heartbeat per process keeps all its
leases, and a busy process still beats."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.e2e.processes import all_terminal, api, cluster, wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LIVENESS_S = 1.0
STEP_S = 3 * LIVENESS_S
STEPS = 4


def test_slow_cpu_bound_steps_on_a_busy_executor_are_never_stolen(tmp_path: Path) -> None:
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "name": "cpu.burn",
                        "description": "Keep a core busy for a while.",
                        "connector": "python",
                        "config": {"function": "tests.connectors.sample_functions:burn"},
                        "input_schema": {
                            "type": "object",
                            "properties": {"seconds": {"type": "number"}},
                        },
                        "timeout": "60s",
                        "idempotent": False,  # a lost lease would end in outcome_unknown
                    }
                ]
            }
        )
    )
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with cluster(tmp_path, env=env) as c:
        ctl = c.controller(
            "controller",
            database_url=f"sqlite:///{tmp_path}/slow.db",
            tools=tools,
            extra=["--migrate", "--lease-seconds", str(LIVENESS_S)],
        )
        ex = c.executor("executor", controller=ctl, slots=STEPS, extra=["--connectors", "python"])
        wait_until(lambda: "executor_registered" in ex.output(), within=60, what="registered")
        with api(ctl) as client:
            steps = [
                {"step_id": f"burn{i}", "tool": "cpu.burn", "args": {"seconds": STEP_S}}
                for i in range(STEPS)
            ]
            task_id = client.post("/v1/tasks", json={"steps": steps}).json()["task_id"]
            (task,) = wait_until(
                lambda: all_terminal(client, [task_id]), within=120, what="the burn to end"
            )
            events = client.get(f"/v1/tasks/{task_id}/events").json()["events"]
    assert task["status"] == "succeeded", task
    assert [s["attempt"] for s in task["steps"]] == [1] * STEPS
    assert not [e for e in events if e["kind"] in ("retry", "mark_unknown")]
