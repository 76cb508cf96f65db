"""A task's `subject`, as a plan's reader sees it: every dialect takes it beside its calls; a
caller's plan may call memory's tools only with one; a model's plan and a trigger's template may
never name one; and each memory tool asks the caller for the memory right of what it does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_reach_controller.identity.policy import Action, memory_action
from agent_reach_controller.planning.plan import PlanInvalidError, parse_plan, parse_template
from agent_reach_controller.tools.catalog import ToolCatalog, ToolSpec
from agent_reach_controller.tools.memory import memory_tools

ECHO = ToolSpec.model_validate({"name": "echo.say", "description": "Says it.", "connector": "echo"})
CATALOG = ToolCatalog([*memory_tools(), ECHO])
SAVE = {"type": "fact", "key": "city", "text": "Lives in Oslo"}
ARGS = json.dumps(SAVE)


def plan(**more: Any) -> dict[str, Any]:
    return {"steps": [{"step_id": "s", "tool": "memory.save", "args": SAVE}]} | more


def problems(body: Any, **how: Any) -> list[tuple[str, str]]:
    with pytest.raises(PlanInvalidError) as refused:
        parse_plan(body, CATALOG, **how)
    return [(p.pointer, p.code) for p in refused.value.problems]


def test_a_callers_plan_calls_memory_for_the_subject_it_names_and_only_then() -> None:
    read = parse_plan(plan(subject="u1"), CATALOG, outside_run=True)
    assert (read.subject, [s.tool for s in read.steps]) == ("u1", ["memory.save"])
    assert problems(plan(), outside_run=True) == [("/steps/0/tool", "forbidden")]
    assert problems(plan(subject="u1 "), outside_run=True) == [("/subject", "invalid_type")]


@pytest.mark.parametrize(
    "body",
    [
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "memory_save", "arguments": ARGS}}],
        },
        {
            "output": [
                {"type": "function_call", "call_id": "c1", "name": "memory_save", "arguments": ARGS}
            ]
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "c1", "name": "memory_save", "input": SAVE}],
        },
    ],
    ids=["openai_chat", "openai_responses", "anthropic"],
)
def test_every_dialect_takes_a_subject_beside_its_calls(body: dict[str, Any]) -> None:
    read = parse_plan(body | {"subject": "u1"}, CATALOG, outside_run=True)
    assert (read.subject, [s.tool for s in read.steps], read.refused) == ("u1", ["memory.save"], ())
    unnamed = parse_plan(body, CATALOG, outside_run=True)
    assert [(c.step_id, c.code.value) for c in unnamed.refused] == [("c1", "forbidden")]


def test_neither_a_models_plan_nor_a_triggers_template_names_a_subject() -> None:
    assert problems(plan(subject="u2")) == [("/subject", "forbidden")]  # a run's model
    with pytest.raises(PlanInvalidError) as refused:
        parse_template(plan(subject="u1"), CATALOG)
    assert [(p.pointer, p.code) for p in refused.value.problems] == [("/subject", "reserved")]


def test_each_memory_tool_asks_the_right_of_what_it_does() -> None:
    rights = {tool.name: memory_action(tool) for tool in memory_tools()}
    assert rights == {
        "memory.save": Action.MEMORY_WRITE,
        "memory.search": Action.MEMORY_READ,
        "memory.list": Action.MEMORY_READ,
        "memory.forget": Action.MEMORY_FORGET,
    }
    assert memory_action(ECHO) is None
