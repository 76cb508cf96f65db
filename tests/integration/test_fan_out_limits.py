"""A body's limits count the steps it stores: a fan-out's children and a verified write's halves
included, in every dialect (issue 28: 500 notify steps of 20 targets each stored 10,500 steps
under a limit of 1,000)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_reach_controller.planning import PlanInvalidError, PlanLimits, parse_plan
from agent_reach_controller.planning.limits import DEFAULT_LIMITS
from agent_reach_controller.tools.catalog import ToolCatalog, ToolSpec
from tests.integration.stack import TOOLS, api_client, components_for, write_tools
from tests.integration.test_verified_writes import READ_BACK, refund_tool

LIMIT = DEFAULT_LIMITS.max_steps
TARGETS = 20
BROADCAST = {
    "name": "notify.send",
    "description": "One message to several targets.",
    "connector": "echo",
    "input_schema": {
        "type": "object",
        "properties": {
            "message": {"type": "string"},
            "targets": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["message", "targets"],
    },
    "fan_out": {"over": "targets", "as": "target", "max": TARGETS},
}
# Written steps such that with their children they pass the limit: 48 x 21 = 1,008.
WRITTEN = LIMIT // (TARGETS + 1) + 1
ARGS = {"message": "hi", "targets": [f"t{n}" for n in range(TARGETS)]}


def bodies() -> list[tuple[str, Any, str]]:
    """(dialect, body, pointer of the refusal) for each dialect."""
    text = json.dumps(ARGS)
    calls = range(WRITTEN)
    return [
        (
            "plan",
            {"steps": [{"step_id": f"s{n}", "tool": "notify.send", "args": ARGS} for n in calls]},
            "/steps",
        ),
        (
            "openai_chat",
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": f"c{n}", "function": {"name": "notify_send", "arguments": text}}
                    for n in calls
                ],
            },
            "/tool_calls",
        ),
        (
            "openai_responses",
            [
                {
                    "type": "function_call",
                    "call_id": f"c{n}",
                    "name": "notify_send",
                    "arguments": text,
                }
                for n in calls
            ],
            "",
        ),
        (
            "anthropic",
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"c{n}", "name": "notify_send", "input": ARGS}
                    for n in calls
                ],
            },
            "/content",
        ),
    ]


@pytest.mark.parametrize(("dialect", "body", "pointer"), bodies(), ids=lambda v: str(v)[:16])
async def test_children_count_against_max_steps_in_every_dialect(
    sqlite_url: str, tmp_path: Path, dialect: str, body: Any, pointer: str
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, BROADCAST])
    async with components_for(sqlite_url, tools) as c, api_client(c) as api:
        answer = await api.post("/v1/tasks", json=body)
        assert answer.status_code == 422, answer.text
        (problem,) = answer.json()["errors"]
        stored = WRITTEN * (TARGETS + 1)
        assert problem["pointer"] == pointer
        assert problem["code"] == "too_large"
        assert problem["detail"] == f"{WRITTEN} steps become {stored:,}; the limit is {LIMIT:,}"
        listed = (await api.get("/v1/tasks")).json()
        assert listed["tasks"] == [], "nothing of a refused body is stored"
        # One written step fewer stores under the limit and is accepted.
        smaller = (await api.post("/v1/tasks", json=_fewer(body))).status_code
        assert smaller == 202


def _fewer(body: Any) -> Any:
    if isinstance(body, list):
        return body[:-1]
    key = next(k for k in ("steps", "tool_calls", "content") if k in body)
    return {**body, key: body[key][:-1]}


async def test_admission_counts_the_children_a_step_becomes(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A queue limit of 3: one written step of 3 targets is 4 steps (the step and its children)."""
    tools = write_tools(tmp_path, [*TOOLS, BROADCAST])
    async with components_for(sqlite_url, tools, max_queued_steps=3) as c, api_client(c) as api:
        args = {"message": "hi", "targets": ["a", "b", "c"]}
        body = {"steps": [{"step_id": "tell", "tool": "notify.send", "args": args}]}
        refused = await api.post("/v1/tasks", json=body)
        assert refused.status_code == 429, refused.text
        args["targets"] = ["a", "b"]
        assert (await api.post("/v1/tasks", json=body)).status_code == 202


def test_a_verified_writes_halves_count_too() -> None:
    """A verified write is stored as the step, its write and its read-back: three steps."""
    catalog = ToolCatalog([ToolSpec.model_validate(t) for t in (READ_BACK, refund_tool())])
    body = {
        "steps": [
            {"step_id": f"pay{n}", "tool": "refund.issue", "args": {"amount": n}} for n in range(2)
        ]
    }
    assert len(parse_plan(body, catalog, limits=PlanLimits(max_steps=6)).steps) == 6
    with pytest.raises(PlanInvalidError) as raised:
        parse_plan(body, catalog, limits=PlanLimits(max_steps=5))
    (problem,) = raised.value.problems
    assert (problem.pointer, problem.code) == ("/steps", "too_large")
    assert problem.detail == "2 steps become 6; the limit is 5"
