"""Grounded arguments: a value the model may not invent must be in the context or referenced."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from agent_reach_controller.planning import PlanInvalidError, parse_plan
from agent_reach_controller.tools.catalog import ToolCatalog, ToolSpec

PAY = ToolSpec.model_validate(
    {
        "name": "pay.send",
        "description": "Moves money.",
        "connector": "echo",
        "grounded": ["to", "cents"],
        "input_schema": {
            "type": "object",
            "properties": {
                "to": {"type": "string"},
                "cents": {"type": "integer"},
                "memo": {"type": "string"},
            },
        },
    }
)
LOOKUP = ToolSpec.model_validate({"name": "crm.lookup", "description": "d", "connector": "echo"})
CATALOG = ToolCatalog([PAY, LOOKUP])
CONTEXT = {"user_message": "Please send 500 cents to ACCT-1 for the March invoice"}


def problems(args: dict[str, Any], context: dict[str, Any] = CONTEXT) -> list[Any]:
    body = {
        "context": context,
        "steps": [
            {"step_id": "who", "tool": "crm.lookup", "args": {}},
            {"step_id": "pay", "tool": "pay.send", "depends_on": ["who"], "args": args},
        ],
    }
    try:
        parse_plan(body, CATALOG)
    except PlanInvalidError as exc:
        return [(p.pointer, p.code, p.detail) for p in exc.problems]
    return []


def test_values_found_in_the_context_or_referenced_pass() -> None:
    assert problems({"to": "acct-1", "cents": 500, "memo": "anything goes here"}) == []
    assert problems({"to": "$who.output.account", "cents": 500}) == []


def test_an_invented_value_is_refused_naming_the_argument() -> None:
    assert problems({"to": "acct-666", "cents": 500}) == [
        (
            "/steps/1/args/to",
            "ungrounded_argument",
            "argument 'to' must come from the submitted context or an earlier step's output; "
            "'acct-666' appears in neither",
        )
    ]
    [(pointer, code, _)] = problems({"to": "acct-1", "cents": 50_000})
    assert (pointer, code) == ("/steps/1/args/cents", "ungrounded_argument")
    assert len(problems({"to": "x", "cents": 1}, context={})) == 2
    # A number must be one the context says, not digits inside another: 5 is not in "500".
    assert [p[0] for p in problems({"to": "acct-1", "cents": 5})] == ["/steps/1/args/cents"]


def test_tool_calls_point_at_the_arguments_string() -> None:
    body = {
        "context": CONTEXT,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "pay_send", "arguments": '{"to": "nobody", "cents": 500}'},
            }
        ],
    }
    # In a model's turn the call is refused on its own (a failed step with a reply)...
    [refused] = parse_plan(body, CATALOG).refused
    [problem] = refused.problems
    assert (problem.pointer, problem.code) == (
        "/tool_calls/0/function/arguments",
        "ungrounded_argument",
    )
    # ...and with atomic=True the whole turn is refused, as a plan is.
    with pytest.raises(PlanInvalidError) as info:
        parse_plan(body, CATALOG, atomic=True)
    [problem] = info.value.problems
    assert (problem.pointer, problem.code) == (
        "/tool_calls/0/function/arguments",
        "ungrounded_argument",
    )
    assert "'to'" in problem.detail


def test_a_tool_may_only_ground_arguments_its_schema_has() -> None:
    with pytest.raises(ValidationError, match="grounded names arguments the schema does not"):
        ToolSpec.model_validate({**PAY.model_dump(), "grounded": ["amount"]})
