"""A run that waits for a person: a dangerous call's approval, an unknown outcome's verdict, or
the tool's word that the model is told instead; nothing that ran before the pause runs again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.runs_stack import (
    profile,
    put_agent,
    run,
    stack,
    started,
    step_of,
)
from tests.integration.stack import key_for
from tests.support.models import (
    ScriptedModels,
    answer,
    call_tools,
)


async def test_a_dangerous_call_pauses_the_run_for_approval_and_nothing_runs_twice(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("pay_send", {"cents": 500})]), answer("Paid.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "payer", profile(models, tools=["pay.*"]))
            run_id = await started(api, {"agent": "payer", "input": "Pay 5 dollars."})
            waiting = await step_of(c, api, run_id, "awaiting_approval")
            [listed] = (await api.get("/v1/runs")).json()["runs"]
            assert listed["status"] == "waiting"  # the list says so too
            paused = (await api.get(f"/v1/runs/{run_id}")).json()
            assert paused["status"] == "waiting"
            assert paused["waiting_for"] == [
                {
                    "task_id": waiting.task_id,
                    "step_id": waiting.step_id,
                    "tool": "pay.send",
                    "status": "awaiting_approval",
                }
            ]
            approver = await key_for(c, roles=("approver",), name="carol")
            decided = await api.post(
                f"/v1/tasks/{waiting.task_id}/steps/{waiting.step_id}/approval",
                json={"decision": "approve", "reason": "ok"},
                headers=approver,
            )
            assert decided.status_code == 200, decided.text
            done = (await api.get(f"/v1/runs/{run_id}?wait=30")).json()
            paid = await c.queries.get(waiting.task_id)
    assert done["status"] == "succeeded", done
    assert models.count() == 2  # the model's first call was not made again after the pause
    [pay] = [s for s in paid.steps if s.tool == "pay.send"]
    assert (pay.status.value, pay.attempt) == ("succeeded", 1)


async def test_an_unknown_outcome_waits_for_a_person_then_the_model_reads_the_verdict(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("wire_send", {"to": "acme"})]), answer("The wire did not go.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "wirer", profile(models, tools=["wire.*"]))
            run_id = await started(api, {"agent": "wirer", "input": "Wire acme."})
            unknown = await step_of(c, api, run_id, "outcome_unknown")
            assert models.count() == 1
            paused = (await api.get(f"/v1/runs/{run_id}")).json()
            assert paused["status"] == "waiting"
            assert [w["status"] for w in paused["waiting_for"]] == ["outcome_unknown"]
            resolved = await api.post(
                f"/v1/tasks/{unknown.task_id}/steps/{unknown.step_id}/resolve",
                json={"action": "failed", "reason": "the bank has no such wire"},
            )
            assert resolved.status_code == 200, resolved.text
            done = (await api.get(f"/v1/runs/{run_id}?wait=30")).json()
    assert done["status"] == "succeeded", done
    [_, (_, second)] = models.requests
    [result] = [m for m in second["messages"] if m["role"] == "tool"]
    assert "the bank has no such wire" in result["content"]


async def test_a_tool_may_have_its_unknown_outcome_told_to_the_model_instead_of_a_person(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("wire_told", {"to": "acme"})]), answer("I could not confirm it.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "wirer", profile(models, tools=["wire.*"]))
            done = await run(api, {"agent": "wirer", "input": "Wire acme."})
            [first_round] = [
                t
                for t in (await c.queries.list_tasks(tenant="default", limit=10))
                if t.goal and t.goal.startswith("round 1 ")
            ]
            wired = await c.queries.get(first_round.task_id)
    assert done["status"] == "succeeded", done
    [_, (_, second)] = models.requests
    [result] = [m for m in second["messages"] if m["role"] == "tool"]
    assert "unverified" in result["content"]
    assert "may or may not have taken effect" in result["content"]
    [wire] = [s for s in wired.steps if s.tool == "wire.told"]
    assert (wire.status.value, wire.attempt) == ("failed", 1)  # never run again by itself
