"""Data is never a reference: what an event fills into a template and what a model writes in its
arguments reach the tool byte for byte, whatever `$` they hold, at any depth (issue 28, item 1)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_reach_controller.planning import PlanInvalidError, parse_plan, templates
from agent_reach_controller.planning.references import escape, resolve, unescape
from agent_reach_controller.tools.catalog import ToolCatalog, ToolSpec

SAY = ToolSpec.model_validate(
    {
        "name": "echo.say",
        "description": "Echo.",
        "connector": "echo",
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
    }
)
PAY = ToolSpec.model_validate(
    {
        "name": "pay.send",
        "description": "Moves money.",
        "connector": "echo",
        "grounded": ["to"],
        "input_schema": {"type": "object", "properties": {"to": {"type": "string"}}},
    }
)
CATALOG = ToolCatalog([SAY, PAY])
# What a stranger sends: reference-shaped strings, escapes, at every depth.
HOSTILE: dict[str, Any] = {
    "text": "$first.output.args.internal",
    "escaped": "$$x",
    "triple": "$$$first.output",
    "price": "$5",
    "nested": {"deep": ["$first.output", {"deeper": "$$first.output.secret"}]},
    "plain": "costs $first.output",
}
ORIGIN = {"name": "t", "version": 1, "event_id": "e1"}


def test_escape_round_trips_through_resolve_and_unescape() -> None:
    escaped = escape(HOSTILE)
    assert resolve(escaped, {"first": {"args": {"internal": "LEAK"}}}) == HOSTILE
    assert unescape(escaped) == HOSTILE


def test_an_event_fills_data_that_no_later_step_reads_as_a_reference() -> None:
    template = {
        "steps": [
            {"step_id": "first", "tool": "echo.say", "args": {"text": "internal"}},
            {
                "step_id": "second",
                "tool": "echo.say",
                "args": {"text": "$event.v", "all": "$event"},
                "depends_on": ["first"],
            },
        ]
    }
    event = {"v": "$first.output.args.internal", "more": HOSTILE}
    plan = parse_plan(templates.fill(template, event, ORIGIN), CATALOG)
    second = plan.steps[1]
    outputs = {"first": {"args": {"internal": "LEAK"}}}
    # The step receives the event's very bytes, not the first step's output.
    received = resolve(second.args, outputs)
    assert received == {"text": "$first.output.args.internal", "all": event}
    assert json.dumps(received) == json.dumps({"text": event["v"], "all": event})
    # The context holds the event as it came (conditions read it there).
    assert plan.context["event"] == event


def test_a_template_still_references_earlier_steps_itself() -> None:
    template = {
        "steps": [
            {"step_id": "first", "tool": "echo.say", "args": {"text": "$event.v"}},
            {
                "step_id": "second",
                "tool": "echo.say",
                "args": {"text": "$first.output.text", "literal": "$$event.v"},
                "depends_on": ["first"],
            },
        ]
    }
    plan = parse_plan(templates.fill(template, {"v": "$$x"}, ORIGIN), CATALOG)
    assert resolve(plan.steps[0].args, {}) == {"text": "$$x"}
    resolved = resolve(plan.steps[1].args, {"first": {"text": "hello"}})
    assert resolved == {"text": "hello", "literal": "$event.v"}


def _turns(args: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    text = json.dumps(args)
    return [
        (
            "openai_chat",
            {"tool_calls": [{"id": "c1", "function": {"name": "echo_say", "arguments": text}}]},
        ),
        (
            "openai_responses",
            {
                "output": [
                    {
                        "type": "function_call",
                        "call_id": "c1",
                        "name": "echo_say",
                        "arguments": text,
                    }
                ]
            },
        ),
        (
            "anthropic",
            {"content": [{"type": "tool_use", "id": "c1", "name": "echo_say", "input": args}]},
        ),
        ("mcp", {"name": "echo.say", "arguments": args}),
    ]


@pytest.mark.parametrize(("dialect", "body"), _turns(HOSTILE))
def test_a_models_arguments_are_data_in_every_dialect(dialect: str, body: dict[str, Any]) -> None:
    plan = parse_plan(body, CATALOG, dialect=dialect)
    assert not plan.refused, plan.refused  # "$a.output" in a model's call is not refused
    (step,) = plan.steps
    # Not read as a reference to anything, and no `$` lost.
    assert resolve(step.args, {"first": {"args": {"internal": "LEAK"}}}) == HOSTILE


def test_grounding_and_schema_see_the_value_as_written() -> None:
    context = {"message": "pay $acct-7 please"}
    body = {"content": [{"type": "tool_use", "id": "p", "name": "pay_send", "input": {}}]}
    body["content"][0]["input"] = {"to": "$acct-7"}
    plan = parse_plan({**body, "context": context}, CATALOG, dialect="anthropic")
    assert not plan.refused
    assert resolve(plan.steps[0].args, {}) == {"to": "$acct-7"}
    # An escaped reference is not a reference: it must be grounded like any invented value.
    body["content"][0]["input"] = {"to": "$first.output.to"}
    refused = parse_plan({**body, "context": context}, CATALOG, dialect="anthropic").refused
    assert [p.code for p in refused[0].problems] == ["ungrounded_argument"]
    assert "'$first.output.to' appears in neither" in refused[0].problems[0].detail
    # A schema sees the string the model wrote: one `$`, four characters.
    short = ToolSpec.model_validate(
        {
            "name": "echo.short",
            "description": "d",
            "connector": "echo",
            "input_schema": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "maxLength": 4, "pattern": "^\\$[a-z]+$"}
                },
            },
        }
    )
    call = {"name": "echo.short", "arguments": {"text": "$abc"}}
    plan = parse_plan(call, ToolCatalog([short]), dialect="mcp")
    assert not plan.refused
    assert resolve(plan.steps[0].args, {}) == {"text": "$abc"}


def test_a_plan_keeps_its_own_references_and_escapes() -> None:
    body = {
        "steps": [
            {"step_id": "a", "tool": "echo.say", "args": {"text": "x"}},
            {
                "step_id": "b",
                "tool": "echo.say",
                "args": {"text": "$a.output.text", "price": "$$5"},
                "depends_on": ["a"],
            },
        ]
    }
    plan = parse_plan(body, CATALOG)
    assert resolve(plan.steps[1].args, {"a": {"text": "y"}}) == {"text": "y", "price": "$5"}
    with pytest.raises(PlanInvalidError):
        parse_plan(
            {"steps": [{"step_id": "b", "tool": "echo.say", "args": {"t": "$a.output"}}]}, CATALOG
        )
