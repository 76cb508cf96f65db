"""An executor's /readyz against a real controller: 503 until it has registered, 200 while it
is registered and its calls are answered, 503 when the controller stops accepting it and when
it drains; /metrics (the liveness probe) answers all along."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from agent_reach_controller.identity import keys
from agent_reach_controller.identity.pools import token_hash
from agent_reach_controller.server import running_controller
from agent_reach_controller.settings import ControllerSettings
from agent_reach_executor.__main__ import run_executor
from tests.executor.fake_controller import FnConnector, Probe
from tests.executor.test_worker import make_settings, wait_until
from tests.integration.stack import key_for, write_tools

ECHO = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}}]}


def provision(pools: Path, token: str, *connectors: str) -> None:
    """The controller's provisioning file (a Secret updated in place): this token's pool with
    these connectors, or no pool at all."""
    entry = {"name": "ready", "sha256": token_hash(token), "connectors": list(connectors)}
    pools.write_text(yaml.safe_dump({"tokens": [entry] if connectors else []}))


async def readyz_becomes(address: str, status: int, reason: str, *, within: float = 15.0) -> None:
    """Ask /readyz until it answers `status` and says `reason`; fail after `within` seconds
    with the last answer. /metrics, the liveness probe, answers all along."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(base_url=f"http://{address}") as http:
        while True:
            answer = await http.get("/readyz")
            assert (await http.get("/metrics")).status_code == 200
            if (answer.status_code, answer.text) == (status, f"{reason}\n"):
                assert answer.headers["content-type"] == "text/plain; charset=utf-8"
                return
            assert time.monotonic() < deadline, (status, reason, answer.status_code, answer.text)
            await asyncio.sleep(0.05)


async def test_readyz_follows_registration_refusal_and_the_drain(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agent_reach_executor")
    token = keys.new_key(keys.POOL_TOKEN_PREFIX).token
    pools = tmp_path / "pools.yaml"
    provision(pools, token)  # the controller does not know the executor's token yet
    config = ControllerSettings(
        database_url=sqlite_url,
        tools=[write_tools(tmp_path)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
        executor_tokens=pools,
    )
    probe = Probe()
    stop = asyncio.Event()
    async with running_controller(config) as (c, bound):
        settings = make_settings(bound.grpc, token=token, metrics="127.0.0.1:0", poll_wait=0.5)
        connectors: dict[str, Any] = {"echo": FnConnector("echo", probe)}
        run = asyncio.create_task(
            run_executor(settings, connectors=connectors, stop=stop, handle_signals=False)
        )
        try:

            def listening() -> list[Any]:
                return [r for r in caplog.records if getattr(r, "event", "") == "metrics_listening"]

            await wait_until(lambda: bool(listening()))
            address = listening()[0].address
            # Before it registers, and refused at Register: not ready, and it says why.
            await readyz_becomes(
                address,
                503,
                "not registered with a controller yet (last call: Register UNAUTHENTICATED)",
            )
            # The pool is provisioned: it registers, polls, and is ready.
            provision(pools, token, "echo")
            await readyz_becomes(address, 200, "ready: registered and polling")
            # The pool is withdrawn: the controller ends its session and refuses its calls.
            provision(pools, token)
            await readyz_becomes(
                address, 503, "calls to the controller fail: PollSteps UNAUTHENTICATED"
            )
            # Back, but no longer for this connector: its session has ended, and registering
            # again is refused.
            provision(pools, token, "sql")
            await readyz_becomes(
                address,
                503,
                "registration lost: registering again (last call: Register PERMISSION_DENIED)",
            )
            provision(pools, token, "echo")
            await readyz_becomes(address, 200, "ready: registered and polling")
            # SIGTERM's drain (the same `stop`): not ready at once, while a step still runs.
            async with httpx.AsyncClient(
                base_url=f"http://{bound.http}", headers=await key_for(c)
            ) as api:
                made = await api.post("/v1/tasks", json=ECHO)
                assert made.status_code == 202, made.text
                await wait_until(lambda: probe.running == 1, within=15)
                stop.set()
                await readyz_becomes(address, 503, "draining: taking no new steps")
                assert probe.running == 1
                probe.release.set()
                await asyncio.wait_for(run, 15)
                task = (await api.get(f"/v1/tasks/{made.json()['task_id']}")).json()
                assert task["status"] == "succeeded", task
            with pytest.raises(httpx.ConnectError):
                await readyz_becomes(address, 503, "draining: taking no new steps")  # it is gone
        finally:
            stop.set()
            probe.release.set()
            await asyncio.wait_for(run, 15)
