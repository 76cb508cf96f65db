"""Read after write: a write tool's `verify` reads the write back, as its own step, and the write's
receipt says whether it held (`meta.verified`); a mismatch fails it, writes again under the same
key, or asks a person, as the tool says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.runtime import Components
from agent_reach_controller.tools.catalog import ToolCatalog, ToolFileError, ToolSpec
from tests.integration.stack import (
    TOOLS,
    api_client,
    claim,
    components_for,
    failed,
    ok,
    start_task,
    steps_shown,
    write_tools,
)

READ_BACK = {
    "name": "refund.get",
    "description": "Reads a refund.",
    "connector": "echo",
    "input_schema": {
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
    },
}


def refund_tool(on_mismatch: str = "fail") -> dict[str, Any]:
    return {
        "name": "refund.issue",
        "description": "Refunds an order.",
        "connector": "echo",
        "risk": "write",
        "input_schema": {"type": "object", "properties": {"amount": {"type": "integer"}}},
        "verify": {
            "tool": "refund.get",
            "args": {"id": "output.id"},
            "condition": "check.status == 'refunded' && check.amount == args.amount",
            "on_mismatch": on_mismatch,
            "attempts": 2,
        },
    }


REFUND = {"step_id": "pay", "tool": "refund.issue", "args": {"amount": 5}}


async def one(c: Components, step_id: str) -> StepRow:
    [step] = await claim(c, wait=5)
    assert step.step_id == step_id
    return step


async def test_a_write_that_reads_back_right_is_verified(database_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool("retry")])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        task_id = await start_task(api, {"steps": [REFUND]})
        write = await one(c, "pay[0]")
        assert write.idempotency_key == f"{task_id}:pay"  # the step's key, not the link's
        await c.reporting.report(executor_id="t", results=[ok(write, {"id": "r1"})])
        check = await one(c, "pay[1]")
        assert check.tool == "refund.get"
        assert check.resolved_args == {"id": "r1"}  # made from the write's output
        await c.reporting.report(
            executor_id="t", results=[ok(check, {"status": "refunded", "amount": 5})]
        )
        steps = await steps_shown(api, task_id)
        receipt = steps["pay"]["receipt"]
        assert steps["pay"]["status"] == "succeeded"
        assert receipt["meta"]["verified"] is True
        assert receipt["data"] == {"id": "r1"}  # the write's output, not the check's
        assert steps["pay[2]"]["status"] == "skipped"  # no second write was needed
        assert steps["pay[3]"]["status"] == "skipped"


async def test_a_mismatch_fails_the_write_as_unverified(database_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool("fail")])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        task_id = await start_task(api, {"steps": [REFUND]})
        write = await one(c, "pay[0]")
        await c.reporting.report(executor_id="t", results=[ok(write, {"id": "r1"})])
        check = await one(c, "pay[1]")
        await c.reporting.report(
            executor_id="t", results=[ok(check, {"status": "pending", "amount": 5})]
        )
        steps = await steps_shown(api, task_id)
        assert set(steps) == {"pay", "pay[0]", "pay[1]"}  # `fail` writes once
        receipt = steps["pay"]["receipt"]
        assert steps["pay"]["status"] == "failed"
        assert receipt["error"]["code"] == "unverified"
        assert receipt["error"]["message"].startswith(
            "written (1 write) but not verified: the check's condition does not hold: check."
        )
        assert receipt["meta"]["verified"] is False


async def test_retry_writes_again_under_the_same_key_until_it_reads_back_right(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool("retry")])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        task_id = await start_task(api, {"steps": [REFUND]})
        first = await one(c, "pay[0]")
        await c.reporting.report(executor_id="t", results=[ok(first, {"id": "r1"})])
        check = await one(c, "pay[1]")
        await c.reporting.report(
            executor_id="t", results=[ok(check, {"status": "refunded", "amount": 3})]
        )
        again = await one(c, "pay[2]")
        assert again.idempotency_key == first.idempotency_key
        assert again.resolved_args == {"amount": 5}
        await c.reporting.report(executor_id="t", results=[ok(again, {"id": "r1"})])
        recheck = await one(c, "pay[3]")
        await c.reporting.report(
            executor_id="t", results=[ok(recheck, {"status": "refunded", "amount": 5})]
        )
        steps = await steps_shown(api, task_id)
        receipt = steps["pay"]["receipt"]
        assert steps["pay"]["status"] == "succeeded"
        assert receipt["meta"]["verified"] is True
        assert receipt["meta"]["attempts"] == 2


async def test_a_check_that_cannot_run_leaves_the_write_unverified(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool("retry")])
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        task_id = await start_task(api, {"steps": [REFUND]})
        write = await one(c, "pay[0]")
        await c.reporting.report(executor_id="t", results=[ok(write, {"id": "r1"})])
        check = await one(c, "pay[1]")
        await c.reporting.report(
            executor_id="t", results=[failed(check, "not_found", retryable=False)]
        )
        steps = await steps_shown(api, task_id)
        error = steps["pay"]["receipt"]["error"]
        assert error["code"] == "unverified"
        assert "the check (refund.get) did not run to the end" in error["message"]
        assert steps["pay[2]"]["status"] == "skipped"  # a write is not repeated blind


async def test_ask_leaves_the_verdict_to_a_person(sqlite_url: str, tmp_path: Path) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool("ask")])
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        task_id = await start_task(api, {"steps": [REFUND]})
        write = await one(c, "pay[0]")
        await c.reporting.report(executor_id="t", results=[ok(write, {"id": "r1"})])
        check = await one(c, "pay[1]")
        await c.reporting.report(executor_id="t", results=[ok(check, {"status": "pending"})])
        steps = await steps_shown(api, task_id)
        assert steps["pay"]["status"] == "outcome_unknown"
        url = f"/v1/tasks/{task_id}/steps/pay/resolve"
        retry = await api.post(url, json={"action": "retry", "reason": "again"})
        assert retry.status_code == 409, retry.text
        assert "never runs itself" in retry.json()["detail"]
        done = await api.post(
            url, json={"action": "succeeded", "reason": "the bank says yes", "output": {"id": "r1"}}
        )
        assert done.status_code == 200, done.text
        assert (await steps_shown(api, task_id))["pay"]["status"] == "succeeded"


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ([refund_tool()], "verify.tool 'refund.get' is not a known tool"),
        ([{**READ_BACK, "risk": "write"}, refund_tool()], "must be a plain read tool"),
        ([READ_BACK, {**refund_tool(), "risk": "read"}], "verify applies to tools with risk"),
        (
            [READ_BACK, {**refund_tool(), "verify": {**refund_tool()["verify"], "condition": "x"}}],
            "condition",
        ),
    ],
)
def test_the_catalogue_refuses_a_check_that_cannot_work(
    tools: list[dict[str, Any]], says: str
) -> None:
    with pytest.raises((ToolFileError, ValueError)) as raised:
        ToolCatalog([ToolSpec.model_validate(t) for t in tools])
    assert says in str(raised.value)


async def test_a_false_condition_skips_the_write_its_check_and_the_step(
    sqlite_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool("retry")])
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        look = {"step_id": "look", "tool": "echo.say"}
        guarded = {**REFUND, "depends_on": ["look"], "when": "steps.look.output.due == true"}
        task_id = await start_task(api, {"steps": [look, guarded]})
        first = await one(c, "look")
        await c.reporting.report(executor_id="t", results=[ok(first, {"due": False})])
        steps = await steps_shown(api, task_id)
        assert {k: v["status"] for k, v in steps.items()} == {
            "look": "succeeded",
            "pay": "skipped",
            "pay[0]": "skipped",
            "pay[1]": "skipped",
            "pay[2]": "skipped",
            "pay[3]": "skipped",
        }
        assert steps["pay"]["receipt"]["error"]["code"] == "condition_false"
        assert await claim(c) == []  # nothing was written
