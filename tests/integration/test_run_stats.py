"""An agent's figures per version (`GET /v1/agents/{name}/stats`) after scripted runs, against
what the runs themselves say, counted by hand: a real controller and executor, both backends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.runs_stack import profile, put_agent, run, stack
from tests.support.models import ScriptedModels, answer, call_tools

PRICES = {"input": 2.0, "output": 8.0}


async def waiting(api: httpx.AsyncClient, run_id: str) -> None:
    """Until the run waits for a person (30 s at most)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        if (await api.get(f"/v1/runs/{run_id}")).json()["status"] == "waiting":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never waited")


async def stats(api: httpx.AsyncClient, name: str, **params: str) -> list[dict[str, Any]]:
    got = await api.get(f"/v1/agents/{name}/stats", params=params)
    assert got.status_code == 200, got.text
    assert got.json()["agent"] == name
    return list(got.json()["versions"])


async def test_an_agents_figures_per_version_are_those_of_its_ended_runs(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        # v1, run 1: calls a tool twice, then max_rounds (2 rounds, 2 tool steps, no error).
        call_tools([("echo_say", {"text": "n0"})]),
        call_tools([("echo_say", {"text": "n1"})]),
        # v1, run 2: a call it may not use (refused: a failed tool step), then an answer.
        call_tools([("vault_read", {})]),
        answer("I could not read the vault."),
        # v1, run 3: an answer with a number nothing showed (an ungrounded claim), 1 round.
        answer("Order 98765 ships tomorrow."),
        # v2, run 4: one tool call, then an answer (grounded: the echo said 4242).
        call_tools([("echo_say", {"text": "4242"})]),
        answer("The echo said 4242."),
        # v2, run 5: a dangerous call waits for approval: not ended, not counted.
        call_tools([("pay_send", {"cents": 5})]),
        # v1 again, pinned after v2 exists: one answer.
        answer("Pinned."),
    ]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            v1 = (await put_agent(api, "helper", profile(models, prices=PRICES)))["version"]
            one = await run(api, {"agent": "helper", "input": "Go.", "limits": {"max_rounds": 2}})
            two = await run(api, {"agent": "helper", "input": "Read the vault."})
            three = await run(api, {"agent": "helper", "input": "Where is my order?"})
            more = profile(models, prices=PRICES, tools=["echo.*", "pay.*"], temperature=0.5)
            v2 = (await put_agent(api, "helper", more))["version"]
            four = await run(api, {"agent": "helper", "input": "Echo 4242."})
            five = await api.post("/v1/runs", json={"agent": "helper", "input": "Pay."})
            await waiting(api, five.json()["run_id"])
            pinned = await run(api, {"agent": "helper", "input": "Again.", "version": v1})
            every = await stats(api, "helper")
            only_v1 = await stats(api, "helper", version=v1)
            unused = await stats(api, "helper", version="0000000000")
            _, other_key = await c.keys.create(
                name="other", tenant="other", roles=["admin"], created_by="test"
            )
            other = await api.get(
                "/v1/agents/helper/stats", headers={"Authorization": f"Bearer {other_key}"}
            )
            nobody = await api.get("/v1/agents/nobody/stats")
            ended = c.metrics.total("agent_reach_runs_ended_total", agent="helper")
    assert (one["end_reason"], two["end_reason"], three["end_reason"]) == (
        "max_rounds",
        "answered",
        "answered",
    )
    assert three["ungrounded_claims"] == ["98765"]
    assert four["agent_version"] == v2
    assert pinned["agent_version"] == v1  # a run may name an earlier version
    assert v1 != v2
    assert [row["version"] for row in every] == [v2, v1]  # newest first
    newest, oldest = every
    v1_runs = [one, two, three, pinned]
    assert oldest == only_v1[0]
    assert oldest["runs"] == 4
    assert oldest["completed"] == 3
    assert oldest["completion_rate"] == pytest.approx(3 / 4)
    assert oldest["average_rounds"] == pytest.approx((2 + 2 + 1 + 1) / 4)
    assert oldest["tool_steps"] == 3
    assert oldest["tool_errors"] == 1
    assert oldest["tool_error_rate"] == pytest.approx(1 / 3)
    assert oldest["ungrounded"] == 1
    assert oldest["ungrounded_claim_rate"] == pytest.approx(1 / 3)
    assert oldest["tokens_per_run"] == pytest.approx(
        {
            "input": sum(r["tokens"]["input"] for r in v1_runs) / 4,
            "output": sum(r["tokens"]["output"] for r in v1_runs) / 4,
        }
    )
    assert oldest["cost_per_run"] == pytest.approx(sum(r["cost"] for r in v1_runs) / 4)
    assert oldest["cost_per_run"] > 0
    # v2: the waiting run is left out.
    assert newest["runs"] == 1
    assert newest["completion_rate"] == 1.0
    assert newest["average_rounds"] == 2.0
    assert (newest["tool_steps"], newest["tool_errors"], newest["tool_error_rate"]) == (1, 0, 0.0)
    assert (newest["ungrounded"], newest["ungrounded_claim_rate"]) == (0, 0.0)
    assert newest["tokens_per_run"] == pytest.approx(
        {"input": four["tokens"]["input"], "output": four["tokens"]["output"]}
    )
    assert unused == [
        {
            "version": "0000000000",
            "runs": 0,
            "completed": 0,
            "completion_rate": None,
            "average_rounds": None,
            "tokens_per_run": None,
            "cost_per_run": None,
            "tool_steps": 0,
            "tool_errors": 0,
            "tool_error_rate": None,
            "ungrounded": 0,
            "ungrounded_claim_rate": None,
        }
    ]
    # Another tenant's caller sees the agent but none of these runs.
    assert other.status_code == 200, other.text
    assert other.json()["versions"] == []
    assert nobody.status_code == 404
    assert ended == 5


async def test_a_run_on_a_version_the_agent_never_had_is_a_problem_document(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ScriptedModels([]) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            unknown = await api.post(
                "/v1/runs", json={"agent": "helper", "input": "Hi.", "version": "nope"}
            )
    assert unknown.status_code == 404, unknown.text
    assert unknown.headers["content-type"] == "application/problem+json"
    assert models.count() == 0
