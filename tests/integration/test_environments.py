"""Environments end to end: in prod a write waits for a person unless its tool is exempted; in
sandbox a write goes to its tool's sandbox target (a real executor's HTTP call lands there) or is
refused; a tenant's own environment beats the controller's; every task says where it ran."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from agent_reach_controller.identity.policy import DEFAULT
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.rpc.convert import assignment_to_proto
from agent_reach_controller.runtime import Components
from agent_reach_controller.server import running_controller
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.storage.schema import steps
from agent_reach_executor import ExecutorSettings, run_executor
from tests.integration.stack import (
    TOOLS,
    api_client,
    components_for,
    failed,
    key_for,
    ok,
    start_task,
    write_tools,
)
from tests.support.sink import Response, Sink

SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}}}
PAY = {
    "name": "pay.send",
    "description": "Moves money.",
    "connector": "echo",
    "risk": "write",
    "idempotent": True,
    "input_schema": SCHEMA,
}
NOTE = {**PAY, "name": "note.add", "description": "Adds a note.", "exempt_from_prod_approval": True}
# A write with a sandbox target: the echo connector answers with `config.output` when it has one,
# so a step's receipt says which config it ran with.
POST = {
    **PAY,
    "name": "ledger.post",
    "description": "Posts to the ledger.",
    "config": {"output": "live ledger"},
    "sandbox": {"output": "sandbox ledger"},
}
PLAN = {
    "steps": [
        {"step_id": "look", "tool": "echo.say", "args": {"text": "ok"}},
        {"step_id": "pay", "tool": "pay.send", "args": {"to": "acct-1"}},
        {"step_id": "note", "tool": "note.add", "args": {"to": "acct-1"}},
    ]
}
ENV_TOOLS = [*TOOLS, PAY, NOTE, POST]
ROLES = DEFAULT.model_dump(mode="json")["roles"]


async def until(check: Any, *, within: float = 10.0) -> Any:
    """`check()`'s first truthy answer, asked again until `within` seconds have passed."""
    deadline = time.monotonic() + within
    while not (found := await check()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
    return found


async def as_agent(c: Components, body: Any, **key: Any) -> tuple[str, dict[str, str]]:
    """A task submitted over HTTP by a new operator key; (its id, that key's headers)."""
    headers = await key_for(c, roles=("operator",), name="agent", **key)
    async with api_client(c) as client:
        return await start_task(client, body, headers=headers), headers


async def statuses(c: Components, task_id: str) -> dict[str, str]:
    view = await c.queries.get(task_id)
    return {s.step_id: s.status.value for s in view.steps}


async def run_ready(c: Components) -> list[str]:
    """Act as an executor for what is ready now: echo each step back; the step ids run."""
    leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=20)
    await c.reporting.report(executor_id="x", results=[ok(s, {"ran": s.tool}) for s in leased])
    return sorted(s.step_id for s in leased)


async def test_prod_makes_a_write_wait_for_approval_unless_its_tool_is_exempted(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(
        database_url, write_tools(tmp_path, ENV_TOOLS), environment="prod"
    ) as c:
        task_id, agent = await as_agent(c, PLAN)
        assert await run_ready(c) == ["look", "note"]  # the exempted write runs at once
        assert (await statuses(c, task_id))["pay"] == "awaiting_approval"
        approver = await key_for(c, roles=("approver",), name="carol")
        async with api_client(c) as client:
            url = f"/v1/tasks/{task_id}/steps/pay/approval"
            mine = await client.post(url, json={"decision": "approve"}, headers=agent)
            assert mine.json()["code"] == "separation_of_duties"  # the same rules as dangerous
            approved = await client.post(url, json={"decision": "approve"}, headers=approver)
            assert approved.status_code == 200, approved.text
            assert await run_ready(c) == ["pay"]
            task = (await client.get(f"/v1/tasks/{task_id}", headers=agent)).json()
            events = (await client.get(f"/v1/tasks/{task_id}/events", headers=agent)).json()
            trace = (await client.get(f"/v1/tasks/{task_id}/trace", headers=agent)).json()
    assert (task["status"], task["environment"]) == ("succeeded", "prod")
    assert {s["step_id"]: s["receipt"]["meta"]["environment"] for s in task["steps"]} == {
        "look": "prod",
        "pay": "prod",
        "note": "prod",
    }
    [created] = [e for e in events["events"] if e["kind"] == "task_created"]
    assert created["data"]["environment"] == "prod"
    tags = {
        span["operationName"]: {t["key"]: t["value"] for t in span["tags"]}
        for span in trace["data"][0]["spans"]
    }
    assert tags["submit_task"]["agent_reach.environment"] == "prod"
    assert tags["dispatch_step pay.send"]["agent_reach.environment"] == "prod"


async def test_dev_lets_every_write_run_at_once(database_url: str, tmp_path: Path) -> None:
    async with components_for(
        database_url, write_tools(tmp_path, ENV_TOOLS)
    ) as c:  # the default: dev
        task_id, _ = await as_agent(c, PLAN)
        assert await run_ready(c) == ["look", "note", "pay"]
        view = await c.queries.get(task_id)
    assert view.task.environment == "dev"
    assert {s.receipt["meta"]["environment"] for s in view.steps if s.receipt} == {"dev"}


async def test_a_prod_write_is_held_to_its_approval_like_a_dangerous_step(
    database_url: str, tmp_path: Path
) -> None:
    """At lease the approval must be for these arguments; nobody deciding in time rejects it."""
    settings = {"environment": "prod", "approval_timeout_seconds": 0.05}
    async with components_for(database_url, write_tools(tmp_path, ENV_TOOLS), **settings) as c:
        task_id, _ = await as_agent(c, PLAN)
        rejected = await until(c.expiry.expire_approvals)
        assert rejected == 1
        pay = next(s for s in (await c.queries.get(task_id)).steps if s.step_id == "pay")
        assert pay.status.value == "rejected"
        assert pay.error["message"].startswith("not approved in time")

    async with components_for(
        database_url, write_tools(tmp_path, ENV_TOOLS), environment="prod"
    ) as c:
        task_id, _ = await as_agent(c, PLAN)
        approver = await key_for(c, roles=("approver",), name="carol")
        async with api_client(c) as client:
            url = f"/v1/tasks/{task_id}/steps/pay/approval"
            assert (
                await client.post(url, json={"decision": "approve"}, headers=approver)
            ).is_success
        async with c.db.transaction() as conn:  # changed behind the approval's back
            await conn.execute(
                sa.update(steps)
                .where(steps.c.task_id == task_id, steps.c.step_id == "pay")
                .values(resolved_args={"to": "attacker"})
            )
        assert "pay" not in await run_ready(c)
        pay = next(s for s in (await c.queries.get(task_id)).steps if s.step_id == "pay")
    assert (pay.status.value, pay.error["code"]) == ("failed", "forbidden")
    assert "not the ones that were approved" in pay.error["message"]


async def test_a_tenants_own_environment_beats_the_controllers(
    database_url: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    tenants = {"lab": {"environment": "dev"}, "trial": {"environment": "sandbox"}}
    policy.write_text(yaml.safe_dump({"roles": ROLES, "tenants": tenants}))
    tools = write_tools(tmp_path, ENV_TOOLS)
    async with components_for(database_url, tools, environment="prod", policy=policy) as c:
        in_prod, _ = await as_agent(c, PLAN)  # tenant "default": the controller's prod
        in_lab, _ = await as_agent(c, PLAN, tenant="lab")
        assert await run_ready(c) == ["look", "look", "note", "note", "pay"]
        assert (await statuses(c, in_prod))["pay"] == "awaiting_approval"
        assert (await statuses(c, in_lab))["pay"] == "succeeded"
        trial = await key_for(c, roles=("operator",), name="eve", tenant="trial")
        async with api_client(c) as client:
            refused = await client.post("/v1/tasks", json=PLAN, headers=trial)
        views = [await c.queries.get(t) for t in (in_prod, in_lab)]
    assert [v.task.environment for v in views] == ["prod", "dev"]
    assert refused.status_code == 422  # trial's sandbox: pay.send has nowhere safe to write


async def test_a_plan_in_the_sandbox_is_refused_where_a_write_has_no_target(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(
        database_url, write_tools(tmp_path, ENV_TOOLS), environment="sandbox"
    ) as c:
        headers = await key_for(c, roles=("operator",), name="agent")
        async with api_client(c) as client:
            refused = await client.post("/v1/tasks", json=PLAN, headers=headers)
            listed = (await client.get("/v1/tasks", headers=headers)).json()["tasks"]
    assert refused.status_code == 422, refused.text
    pay, note = refused.json()["errors"]  # an exemption from prod's approvals is no target
    assert (pay["pointer"], pay["code"]) == ("/steps/1/tool", "forbidden")
    assert "'pay.send'" in pay["detail"]
    assert "sandbox environment" in pay["detail"]
    assert (note["pointer"], note["code"]) == ("/steps/2/tool", "forbidden")
    assert listed == []  # nothing was stored


async def test_a_turn_in_the_sandbox_refuses_only_the_call_without_a_target(
    database_url: str, tmp_path: Path
) -> None:
    turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "echo_say", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "pay_send", "arguments": "{}"}},
            {
                "id": "c3",
                "type": "function",
                "function": {"name": "ledger_post", "arguments": "{}"},
            },
        ],
    }
    async with components_for(
        database_url, write_tools(tmp_path, ENV_TOOLS), environment="sandbox"
    ) as c:
        task_id, headers = await as_agent(c, turn)
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert sorted(s.step_id for s in leased) == ["c1", "c3"]
        post = next(s for s in leased if s.step_id == "c3")
        # What the executor is handed: the sandbox config, not the live one.
        sent = assignment_to_proto(post, c.registry.get(post.tool, post.tool_version))
        assert sent.environment == "sandbox"
        assert json.loads(sent.config_json) == {"output": "sandbox ledger"}
        await c.reporting.report(executor_id="x", results=[ok(s, {"ok": 1}) for s in leased])
        async with api_client(c) as client:
            task = (await client.get(f"/v1/tasks/{task_id}", headers=headers)).json()
    by_id = {s["step_id"]: s for s in task["steps"]}
    assert {k: s["status"] for k, s in by_id.items()} == {
        "c1": "succeeded",
        "c2": "failed",
        "c3": "succeeded",
    }
    error = by_id["c2"]["receipt"]["error"]
    assert error["code"] == "forbidden"
    assert "'pay.send'" in error["message"]
    assert "sandbox environment" in error["message"]
    assert by_id["c2"]["receipt"]["meta"]["environment"] == "sandbox"
    assert task["environment"] == "sandbox"


async def test_a_sandbox_write_that_slipped_past_the_submit_is_refused_at_lease(
    database_url: str, tmp_path: Path
) -> None:
    """A submit path that did not check (here: the intake called directly) still writes
    nothing live: the lease refuses the step."""
    async with components_for(database_url, write_tools(tmp_path, ENV_TOOLS)) as c:
        body = {"steps": [{"step_id": "pay", "tool": "pay.send", "args": {}}]}
        plan = parse_plan(body, c.catalog)  # checked for dev
        done = await c.intake.submit(SubmitInput(plan=plan, request=body, environment="sandbox"))
        assert await run_ready(c) == []
        [pay] = (await c.queries.get(done.task_id)).steps
    assert (pay.status.value, pay.error["code"]) == ("failed", "forbidden")
    assert "sandbox" in pay.error["message"]


@pytest.mark.parametrize(("environment", "rerouted"), [("dev", True), ("sandbox", False)])
async def test_a_fallback_is_taken_only_where_it_may_run(
    database_url: str, tmp_path: Path, environment: str, rerouted: bool
) -> None:
    """In the sandbox a read tool's fallback that writes without a target is not taken (in
    prod one that would need an approval the step has not got is not taken either)."""
    flaky = {
        "name": "rates.read",
        "description": "Reads rates.",
        "connector": "echo",
        "input_schema": SCHEMA,
        "retry": {"maximum_attempts": 1},
        "fallback": "pay.send",
    }
    tools = write_tools(tmp_path, [*ENV_TOOLS, flaky])
    async with components_for(database_url, tools, environment=environment) as c:
        body = {"steps": [{"step_id": "r", "tool": "rates.read", "args": {}}]}
        task_id, _ = await as_agent(c, body)
        [step] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
        await c.reporting.report(
            executor_id="x", results=[failed(step, "invalid_arguments", retryable=False)]
        )
        [after] = (await c.queries.get(task_id)).steps
    if rerouted:
        assert (after.tool, after.status.value) == ("pay.send", "ready")
    else:
        assert (after.tool, after.status.value) == ("rates.read", "failed")


async def test_a_bad_sandbox_is_refused_when_the_tool_is_saved(
    database_url: str, tmp_path: Path
) -> None:
    reader = {**TOOLS[0], "name": "echo.read"}
    async with (
        components_for(database_url, write_tools(tmp_path, ENV_TOOLS)) as c,
        api_client(c) as api,
    ):
        writes = await api.post("/v1/tools", json={**reader, "sandbox": {"write": True}})
        empty = await api.post("/v1/tools", json={**PAY, "name": "pay.other", "sandbox": {}})
        good = await api.post("/v1/tools", json={**reader, "sandbox": {"output": "x"}})
    assert writes.status_code == 422, writes.text
    assert "sandbox.write: true needs risk" in writes.text
    assert empty.status_code == 422, empty.text
    assert "at least one config key" in empty.text
    assert good.status_code == 201, good.text
    assert good.json()["sandbox"] == {"output": "x"}


async def test_a_real_executor_sends_a_sandbox_write_to_the_sandbox_target(
    database_url: str, tmp_path: Path
) -> None:
    with Sink() as sink:
        sink.script("/sandbox/ledger", [Response(json={"where": "sandbox"})])
        ledger = {
            "name": "ledger.entry",
            "description": "Posts an entry to the ledger.",
            "connector": "http",
            "risk": "write",
            "idempotent": True,
            "config": {
                "method": "POST",
                "url": f"{sink.url}/live/ledger",
                "allow_hosts": ["127.0.0.1"],  # the sink; refused otherwise
            },
            "sandbox": {"url": f"{sink.url}/sandbox/ledger"},
            "input_schema": {"type": "object", "properties": {"entry": {"type": "integer"}}},
        }
        settings = ControllerSettings(
            database_url=database_url,
            tools=[write_tools(tmp_path, [ledger])],
            http="127.0.0.1:0",
            grpc="127.0.0.1:0",
            environment="sandbox",
        )
        async with running_controller(settings) as (c, bound):
            _, token = await c.pools.create(name="pool", created_by="test")
            body = {"steps": [{"step_id": "e", "tool": "ledger.entry", "args": {"entry": 7}}]}
            plan = parse_plan(body, c.catalog, environment="sandbox")
            task = await c.intake.submit(SubmitInput(plan=plan, request=body))
            stop = asyncio.Event()
            worker = asyncio.create_task(
                run_executor(
                    ExecutorSettings(
                        controller=bound.grpc, token=token, connectors=["http"], drain_grace=1
                    ),
                    stop=stop,
                    handle_signals=False,
                )
            )
            try:
                view = await c.queries.wait(task.task_id, within=30)
            finally:
                stop.set()
                await worker
        assert sink.requests("/live/ledger") == []
        [delivery] = sink.requests("/sandbox/ledger")
    assert delivery.body == b'{"entry":7}'
    assert view.task.environment == "sandbox"  # the controller's, as the intake fixed it
    [step] = view.steps
    assert step.status.value == "succeeded", step.error
    assert step.receipt["meta"]["environment"] == "sandbox"
