"""A controller and two executors as separate processes over gRPC; one executor is SIGKILLed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.processes import Proc, all_terminal, api, cluster, wait_until
from tests.support.sink import Response, Sink

pytestmark = pytest.mark.e2e


def sink_tools(directory: Path, sink_url: str) -> Path:
    path = directory / "tools.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "name": "ledger.post",
                        "description": "Post an entry to the ledger.",
                        "connector": "http",
                        "config": {
                            "method": "POST",
                            "url": f"{sink_url}/ledger",
                            "allow_hosts": ["127.0.0.1"],  # the sink; refused otherwise
                        },
                        "input_schema": {
                            "type": "object",
                            "required": ["entry"],
                            "properties": {"entry": {"type": "integer"}},
                        },
                        "timeout": "10s",
                        "retry": {"initial_interval": "100ms", "maximum_attempts": 10},
                        "idempotent": True,
                    }
                ]
            }
        )
    )
    return path


def plan(n: int, offset: int) -> dict:
    return {
        "goal": f"post entries {offset}..{offset + n - 1}",
        "steps": [
            {"step_id": f"e{i}", "tool": "ledger.post", "args": {"entry": offset + i}}
            for i in range(n)
        ],
    }


def _leases_of(client: httpx.Client, executor: Proc) -> int:
    """Steps an executor process holds, as the controller's fleet listing shows them."""
    fleet = client.get("/v1/executors").json()["executors"]
    mine = f"-{executor.popen.pid}-"
    return sum(e["leases"] for e in fleet if mine in e["executor_id"])


def test_sigkilled_executor_loses_nothing_and_applies_each_effect_once(
    postgres_url: str, tmp_path: Path
) -> None:
    with Sink() as sink:
        # Slow enough that the executors hold steps when one of them is killed.
        sink.script("/ledger", [Response(status=200, json={"ok": True}, delay=0.15)])
        tools = sink_tools(tmp_path, sink.url)
        with cluster(tmp_path) as c:
            ctl = c.controller(
                "controller",
                database_url=postgres_url,
                tools=tools,
                extra=["--lease-seconds", "2", "--migrate"],
            )
            victim = c.executor("executor-a", controller=ctl, slots=8)
            c.executor("executor-b", controller=ctl, slots=8)
            with api(ctl) as client:
                task_ids = [
                    client.post("/v1/tasks", json=plan(20, 20 * k)).json()["task_id"]
                    for k in range(10)
                ]
                wait_until(
                    lambda: len(sink.requests("/ledger")) >= 30, within=60, what="work to start"
                )
                # The other executor may have done all of that alone while this one was still
                # starting: kill it only once it holds steps of its own.
                wait_until(
                    lambda: _leases_of(client, victim) > 0, within=60, what="the victim's leases"
                )
                victim.kill()
                tasks = wait_until(
                    lambda: all_terminal(client, task_ids), within=90, what="every task to finish"
                )
    steps = [s for t in tasks for s in t["steps"]]
    assert len(steps) == 200
    assert {s["status"] for s in steps} == {"succeeded"}
    keys = {s["idempotency_key"] for s in steps}
    assert len(keys) == 200
    # Every delivery, first try or re-run after the kill, carried its step's one key, so the
    # downstream applied exactly one effect per step...
    assert set(sink.deliveries_per_key()) == keys
    # ...and every succeeded step's effect did reach it.
    assert set(sink.effects()) == keys
    deliveries = len(sink.requests("/ledger"))
    assert deliveries > len(keys), "the kill should have caught requests in flight"
    print(
        f"200 steps, 1 of 2 executors SIGKILLed: 0 lost, 0 duplicate effects, "
        f"{deliveries - len(keys)} redeliveries absorbed by Idempotency-Key"
    )


def test_embedded_sqlite_happy_path(tmp_path: Path) -> None:
    with Sink() as sink:
        sink.script("/ledger", [Response(status=200, json={"ok": True})])
        tools = sink_tools(tmp_path, sink.url)
        with cluster(
            tmp_path, env={"AGENT_REACH_CONTROLLER_DATABASE_URL": f"sqlite:///{tmp_path}/dev.db"}
        ) as c:
            dev = c.dev("dev", tools=tools)
            with api(dev) as client:
                response = client.post("/v1/tasks", params={"wait": 30}, json=plan(5, 0))
                assert response.status_code == 200
                task = response.json()
            assert dev.terminate() == 0, dev.output()[-3000:]  # SIGTERM drains, exits cleanly
    assert task["status"] == "succeeded"
    assert len(sink.effects()) == 5
    assert len(sink.deliveries_per_key()) == 5
    headers = [r.headers for r in sink.requests("/ledger")]
    assert all(h.get("traceparent", "").split("-")[1] == task["trace_id"] for h in headers)


def test_controller_killed_and_restarted_mid_run(postgres_url: str, tmp_path: Path) -> None:
    with Sink() as sink:
        sink.script("/ledger", [Response(status=200, json={"ok": True}, delay=0.05)])
        tools = sink_tools(tmp_path, sink.url)
        with cluster(tmp_path) as c:
            args = ["--lease-seconds", "2", "--migrate"]
            ctl = c.controller("controller", database_url=postgres_url, tools=tools, extra=args)
            c.executor("executor", controller=ctl, slots=4)
            with api(ctl) as client:
                task_ids = [
                    client.post("/v1/tasks", json=plan(20, 20 * k)).json()["task_id"]
                    for k in range(5)
                ]
            wait_until(lambda: len(sink.requests("/ledger")) >= 10, within=60, what="work to start")
            ctl.kill()
            # Same addresses, so the running executor finds it again by itself.
            http_port, grpc_port = ctl.info["http"].rsplit(":")[1], ctl.info["grpc"].rsplit(":")[1]
            again = c.controller(
                "controller-2",
                database_url=postgres_url,
                tools=tools,
                extra=[
                    *args,
                    "--http",
                    f"127.0.0.1:{http_port}",
                    "--grpc",
                    f"127.0.0.1:{grpc_port}",
                ],
            )
            with api(again) as client:
                tasks = wait_until(
                    lambda: all_terminal(client, task_ids), within=90, what="every task"
                )
    steps = [s for t in tasks for s in t["steps"]]
    assert {s["status"] for s in steps} == {"succeeded"}
    assert set(sink.deliveries_per_key()) == {s["idempotency_key"] for s in steps}
