"""On top of the loop: planner mode, the router, category routing with many tools, and replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.runs_stack import (
    ECHO,
    KEY,
    profile,
    put_agent,
    run,
    stack,
)
from tests.support.models import (
    CHAT,
    MESSAGES,
    ScriptedModels,
    answer,
    call_tools,
)


def plan_text(*steps: dict[str, Any], fenced: bool = False) -> str:
    text = json.dumps({"goal": "say two things", "steps": list(steps)})
    return f"```json\n{text}\n```" if fenced else text


SAY_A = {"step_id": "a", "tool": "echo.say", "args": {"text": "first"}}


SAY_B = {
    "step_id": "b",
    "tool": "echo.say",
    "args": {"text": "$a.output.args.text"},
    "depends_on": ["a"],
}


CYCLE = [SAY_A | {"depends_on": ["b"]}, SAY_B]


@pytest.mark.parametrize(("kind", "path"), [("openai_chat", CHAT), ("anthropic", MESSAGES)])
async def test_in_planner_mode_the_model_writes_a_plan_that_runs_as_one_round(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, path: str
) -> None:
    script = [answer(plan_text(SAY_A, SAY_B, fenced=True)), answer("Both said first.")]
    with ScriptedModels(script) as models:
        async with stack(database_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "planner", profile(models, kind, mode="plan"))
            done = await run(api, {"agent": "planner", "input": "Say first, then repeat it."})
            planned = await c.queries.get(done["rounds"][0]["task_id"])
    assert (done["status"], done["end_reason"], done["round"]) == ("succeeded", "answered", 2)
    [(_, first), (_, second)] = models.requests
    assert "Answer with a plan" in str(first)
    assert "tools" not in first  # the tools are in the instructions, not callable
    if kind == "openai_chat":
        assert first["response_format"]["json_schema"]["name"] == "plan"
    assert "The results of your plan" in str(second)
    assert "response_format" not in second
    steps = {s.step_id: s for s in planned.steps}
    assert steps["b"].resolved_args == {"text": "first"}  # the plan's own reference, resolved
    assert steps["b"].status.value == "succeeded"


async def test_a_refused_plan_goes_back_once_and_a_second_ends_the_run_invalid_plan(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repaired = [answer(plan_text(*CYCLE)), answer(plan_text(SAY_A, SAY_B)), answer("Done.")]
    twice = [answer(plan_text(*CYCLE)), answer("not a plan at all")]
    with ScriptedModels(repaired) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "planner", profile(models, mode="plan"))
            fixed = await run(api, {"agent": "planner", "input": "Say first twice."})
    [_, (_, second), _] = models.requests
    assert "Your plan was refused" in str(second)
    assert "/steps/" in str(second)  # the problems' pointers
    assert (fixed["status"], fixed["round"]) == ("succeeded", 3)
    with ScriptedModels(twice) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "planner", profile(models, mode="plan"))
            failed = await run(api, {"agent": "planner", "input": "Say first twice."})
    assert (failed["status"], failed["end_reason"]) == ("failed", "invalid_plan")
    first_set, second_set = failed["error"]["problems"]
    assert any(p["code"] == "cycle" for p in first_set)
    assert "not JSON" in second_set[0]["detail"]
    assert models.count() == 2


async def test_the_plan_schema_is_published_and_a_plan_it_admits_is_read_as_a_plan(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jsonschema

    from agent_reach_controller.planning.plan import parse_plan

    with ScriptedModels([]) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (c, api):
            await put_agent(api, "planner", profile(models, mode="plan"))
            schema = (await api.get("/v1/runs/plan-schema")).json()
            plan = {"goal": "g", "steps": [SAY_A, SAY_B]}
            jsonschema.validate(plan, schema)
            read = parse_plan(plan, c.catalog, dialect="plan", atomic=True)
    assert [s.step_id for s in read.steps] == ["a", "b"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"steps": [SAY_A | {"retry": {}}]}, schema)  # a caller's option


def routed(route: str) -> Any:
    return answer(json.dumps({"route": route, "reason": f"{route} fits"}))


ROUTED = {
    "answer": ([routed("answer"), answer("Hello!")], 2),
    "react": ([routed("react"), call_tools([("echo_say", {"text": "x"})]), answer("ok")], 3),
    "plan": ([routed("plan"), answer(plan_text(SAY_A, SAY_B)), answer("ok")], 3),
    "nonsense": ([answer("I would rather chat"), answer("ok")], 2),
}


@pytest.mark.parametrize("route", list(ROUTED))
async def test_a_router_picks_answer_react_or_plan_and_the_run_records_why(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    script, rounds = ROUTED[route]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "router", profile(models, mode="auto"))
            done = await run(api, {"agent": "router", "input": "Hi there."})
    assert (done["status"], done["round"]) == ("succeeded", rounds), done
    first, second = models.requests[0][1], models.requests[1][1]
    assert first["response_format"]["json_schema"]["name"] == "route"
    assert "tools" not in first
    said = [m.get("content") for m in second["messages"] if m["role"] != "system"]
    assert said == ["Hi there."]  # the routing exchange is not the conversation's
    if route == "nonsense":
        assert done["route"]["route"] == "react"
        assert "not a choice" in done["route"]["reason"]
        return
    assert done["route"] == {"route": route, "reason": f"{route} fits"}
    assert ("tools" in second) == (route == "react")
    assert ("Answer with a plan" in str(second)) == (route == "plan")


THIRTY = [
    {
        "name": f"{area}.t{i}",
        "description": f"Tool {i} of the {area} area.",
        "connector": "echo",
        "idempotent": True,
        "input_schema": {"type": "object"},
    }
    for area in ("crm", "mail", "billing")
    for i in range(10)
]


async def test_with_thirty_tools_the_model_picks_a_category_then_sees_only_its_tools(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [
        answer(json.dumps({"category": "crm", "reason": "a customer question"})),
        call_tools([("crm_t3", {})]),
        answer("Found the customer."),
    ]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch, extra_tools=THIRTY) as (_, api):
            areas = ["crm.*", "mail.*", "billing.*"]
            await put_agent(api, "desk", profile(models, tools=areas))
            done = await run(api, {"agent": "desk", "input": "Who is customer 7?"})
    assert (done["status"], done["round"]) == ("succeeded", 3), done
    assert done["category"] == {"category": "crm", "reason": "a customer question"}
    first, second, third = (body for _, body in models.requests)
    assert first["response_format"]["json_schema"]["name"] == "category"
    assert "tools" not in first
    assert "billing: 10 tool(s)" in first["messages"][0]["content"]
    offered = {t["function"]["name"] for t in second["tools"]}
    assert offered == {f"crm_t{i}" for i in range(10)}  # the category's tools, no others
    assert {t["function"]["name"] for t in third["tools"]} == offered  # kept for the turn
    assert len(done["tools"]) == 30


async def test_a_runs_replay_shows_each_round_and_a_dry_run_reports_a_changed_tool(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = [call_tools([("echo_say", {"text": "hi"})]), answer("It said hi.")]
    with ScriptedModels(script) as models:
        async with stack(sqlite_url, tmp_path, monkeypatch) as (_, api):
            await put_agent(api, "helper", profile(models))
            done = await run(api, {"agent": "helper", "input": "Say hi."})
            same = (await api.get(f"/v1/runs/{done['run_id']}/replay")).json()
            changed = ECHO | {"description": "Says what it is given, louder."}
            assert (await api.put("/v1/tools/echo.say", json=changed)).status_code == 200
            after = (await api.get(f"/v1/runs/{done['run_id']}/replay")).json()
    assert same["identical"] is True, same
    first, second = same["rounds"]
    assert first["request"]["messages"][-2] == {"role": "user", "content": "Say hi."}
    assert first["reply"][0]["tool_calls"][0]["function"]["name"] == "echo_say"
    [call] = first["calls"]
    assert (call["tool"], call["status"]) == ("echo.say", "succeeded")
    assert '"hi"' in call["read"]
    assert second["reply"][0]["content"] == "It said hi."
    assert KEY not in str(same)
    assert after["identical"] is False
    [difference] = after["rounds"][0]["differences"]
    assert "tool echo.say changed since" in difference
