"""Plan parsing and validation: one case per problem code, many at once, and the OpenAI shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_reach_controller.planning import (
    PlanInvalidError,
    PlanLimits,
    Problem,
    parse_plan,
    validate_resolved_args,
)
from agent_reach_controller.tools import ToolCatalog

FIXTURES = Path(__file__).parent.parent / "fixtures" / "tools"
CATALOG = ToolCatalog.from_yaml_files([FIXTURES / "catalog.yaml", FIXTURES / "more.yaml"])

WEATHER: dict[str, Any] = {
    "step_id": "weather",
    "tool": "weather.forecast",
    "args": {"city": "Wuhan", "day": "tomorrow"},
}
REMIND: dict[str, Any] = {
    "step_id": "remind",
    "tool": "reminder.create",
    "depends_on": ["weather"],
    "when": "steps.weather.output.rain == true",
    "args": {"at": "08:00", "text": "Take an umbrella", "evidence": "$weather.output.summary"},
}


def problems_of(body: Any, *, limits: PlanLimits | None = None) -> list[Problem]:
    with pytest.raises(PlanInvalidError) as info:
        parse_plan(body, CATALOG, limits=limits or PlanLimits())
    return info.value.problems


def pairs(problems: list[Problem]) -> set[tuple[str, str]]:
    return {(p.pointer, p.code) for p in problems}


def test_valid_plan() -> None:
    plan = parse_plan(
        {"goal": "umbrella", "steps": [WEATHER, REMIND], "context": {"tz": "+08"}}, CATALOG
    )
    assert plan.source == "plan"
    assert plan.goal == "umbrella"
    assert plan.context == {"tz": "+08"}
    weather, remind = plan.steps
    assert (weather.step_id, weather.position, weather.depends_on, weather.when) == (
        "weather",
        0,
        (),
        None,
    )
    assert weather.tool_version == CATALOG["weather.forecast"].version
    assert remind.depends_on == ("weather",)
    assert remind.args["evidence"] == "$weather.output.summary"
    assert remind.when == "steps.weather.output.rain == true"


def step(**overrides: Any) -> dict[str, Any]:
    return {**WEATHER, **overrides}


# One case per problem code: (body, pointer, code, a phrase of the detail).
CORPUS: list[tuple[str, Any, str, str, str]] = [
    ("not an object", 5, "", "invalid_type", "is an object, not number"),
    ("steps not a list", {"steps": {}}, "/steps", "invalid_type", "must be an array"),
    ("no steps", {"goal": "x"}, "/steps", "missing_field", "'steps'"),
    ("no tool", {"steps": [{"step_id": "a"}]}, "/steps/0/tool", "missing_field", "'tool'"),
    ("unknown top key", {"steps": [WEATHER], "plan": 1}, "/plan", "unknown_field", "unknown field"),
    (
        "unknown step key",
        {"steps": [step(retries=3)]},
        "/steps/0/retries",
        "unknown_field",
        "unknown",
    ),
    ("dup id", {"steps": [WEATHER, WEATHER]}, "/steps/1/step_id", "duplicate_step_id", "step 0"),
    (
        "bad id",
        {"steps": [step(step_id="no spaces")]},
        "/steps/0/step_id",
        "invalid_step_id",
        "must match",
    ),
    (
        "unknown dep",
        {"steps": [step(depends_on=["ghost"])]},
        "/steps/0/depends_on/0",
        "unknown_dependency",
        "'ghost'",
    ),
    (
        "self dep",
        {"steps": [step(depends_on=["weather"])]},
        "/steps/0/depends_on/0",
        "self_dependency",
        "itself",
    ),
    (
        "unknown tool",
        {"steps": [step(tool="weather.guess")]},
        "/steps/0/tool",
        "unknown_tool",
        "weather.guess",
    ),
    (
        "disabled",
        {"steps": [step(tool="records.delete", args={})]},
        "/steps/0/tool",
        "tool_disabled",
        "disabled",
    ),
    (
        "undeclared",
        {"steps": [WEATHER, {**REMIND, "depends_on": [], "when": None}]},
        "/steps/1/args/evidence",
        "undeclared_reference",
        "not listed in depends_on",
    ),
    (
        "unknown ref",
        {
            "steps": [
                {
                    **REMIND,
                    "depends_on": [],
                    "when": None,
                    "args": {**REMIND["args"], "evidence": "$x.output"},
                }
            ]
        },
        "/steps/0/args/evidence",
        "unknown_reference",
        "'x'",
    ),
    (
        "malformed ref",
        {"steps": [step(args={"city": "$.output", "day": "today"})]},
        "/steps/0/args/city",
        "invalid_reference",
        "not a valid step id",
    ),
    (
        "schema",
        {"steps": [step(args={"city": "Wuhan", "day": "yesterday"})]},
        "/steps/0/args/day",
        "invalid_arguments",
        "'yesterday' is not one of",
    ),
    (
        "required",
        {"steps": [step(args={"city": "Wuhan"})]},
        "/steps/0/args",
        "invalid_arguments",
        "'day' is a required property",
    ),
    (
        "cel syntax",
        {"steps": [step(when="1 +")]},
        "/steps/0/when",
        "invalid_condition",
        "does not compile",
    ),
    (
        "cel undeclared root variable",
        {"steps": [step(when="foo.bar == 1")]},
        "/steps/0/when",
        "invalid_condition",
        "uses undeclared variable 'foo'",
    ),
    (
        "cel undeclared variable",
        {"steps": [WEATHER, {**REMIND, "when": "steps.weather.output.mm > threshold"}]},
        "/steps/1/when",
        "invalid_condition",
        "uses undeclared variable 'threshold'",
    ),
    (
        "cel unknown function",
        {"steps": [WEATHER, {**REMIND, "when": "nosuchfn(steps.weather.output)"}]},
        "/steps/1/when",
        "invalid_condition",
        "calls unknown function 'nosuchfn'",
    ),
    (
        "cel non-dep",
        {
            "steps": [
                WEATHER,
                {**REMIND, "step_id": "r", "depends_on": [], "args": {"at": "1", "text": "t"}},
            ]
        },
        "/steps/1/when",
        "invalid_condition",
        "not in depends_on",
    ),
    (
        "nan",
        {"steps": [step(args={"city": "W", "day": "today", "extra": float("nan")})]},
        "/steps/0/args/extra",
        "invalid_number",
        "NaN",
    ),
    (
        "nan context",
        {"steps": [WEATHER], "context": {"x": [float("inf")]}},
        "/context/x/0",
        "invalid_number",
        "inf",
    ),
    (
        "too long goal",
        {"goal": "g" * 5000, "steps": [WEATHER]},
        "/goal",
        "too_large",
        "5,000 characters",
    ),
    ("no steps", {"steps": []}, "/steps", "missing_field", "at least one is needed"),
    (
        "deadline not a number",
        {"steps": [WEATHER], "deadline_seconds": "soon"},
        "/deadline_seconds",
        "invalid_type",
        "must be a number",
    ),
    (
        "deadline too far",
        {"steps": [WEATHER], "deadline_seconds": 10**9},
        "/deadline_seconds",
        "too_large",
        "less than or equal to 2592000",
    ),
    (
        "budget below one",
        {"steps": [WEATHER], "budget": {"max_attempts": 0}},
        "/budget/max_attempts",
        "invalid_number",
        "greater than or equal to 1",
    ),
    (
        "retry override out of range",
        {"steps": [{**WEATHER, "retry": {"maximum_attempts": 0}}]},
        "/steps/0/retry/maximum_attempts",
        "invalid_type",
        "greater than or equal to 1",
    ),
    (
        "retry override unknown field",
        {"steps": [{**WEATHER, "retry": {"attempts": 3}}]},
        "/steps/0/retry/attempts",
        "unknown_field",
        "Extra inputs",
    ),
    (
        "timeout override not a duration",
        {"steps": [{**WEATHER, "timeouts": {"timeout": "soon"}}]},
        "/steps/0/timeouts/timeout",
        "invalid_type",
        "invalid duration",
    ),
    (
        "timeout override unknown field",
        {"steps": [{**WEATHER, "timeouts": {"start_to_start": "1s"}}]},
        "/steps/0/timeouts/start_to_start",
        "unknown_field",
        "Extra inputs",
    ),
    (
        "plan priority out of range",
        {"steps": [WEATHER], "priority": 5000},
        "/priority",
        "too_large",
        "less than or equal to 1000",
    ),
    (
        "step priority not an integer",
        {"steps": [{**WEATHER, "priority": "high"}]},
        "/steps/0/priority",
        "invalid_type",
        "'priority' must be an integer, not string",
    ),
    (
        "timeouts not an object",
        {"steps": [{**WEATHER, "timeouts": 5}]},
        "/steps/0/timeouts",
        "invalid_type",
        "'timeouts'",
    ),
    (
        "budget unknown key",
        {"steps": [WEATHER], "budget": {"max_steps": 3}},
        "/budget/max_steps",
        "unknown_field",
        "expected max_attempts",
    ),
    ("no tool calls", {"tool_calls": []}, "/tool_calls", "missing_field", "at least one"),
    (
        "caps not an object",
        {"steps": [WEATHER], "caps": ["payment"]},
        "/caps",
        "invalid_type",
        "'caps' must be an object",
    ),
    (
        "cap below zero",
        {"steps": [WEATHER], "caps": {"payment": -1}},
        "/caps/payment",
        "invalid_number",
        "greater than or equal to 0",
    ),
]


@pytest.mark.parametrize(
    ("body", "pointer", "code", "phrase"), [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS]
)
def test_problem_corpus(body: Any, pointer: str, code: str, phrase: str) -> None:
    problems = problems_of(body)
    matching = [p for p in problems if p.pointer == pointer and p.code == code]
    assert matching, problems
    assert phrase in matching[0].detail


def test_a_condition_naming_anything_but_steps_and_context_is_refused_at_submit() -> None:
    body = {
        "steps": [
            WEATHER,
            {**REMIND, "when": "steps.weather.output.hours.exists(h, h > limit) && max(1, 2) > 1"},
        ]
    }
    assert [(p.pointer, p.code, p.detail) for p in problems_of(body)] == [
        (
            "/steps/1/when",
            "invalid_condition",
            "the condition uses undeclared variable 'limit' "
            "(only `context` and `steps` are declared)",
        ),
        ("/steps/1/when", "invalid_condition", "the condition calls unknown function 'max'"),
    ]


@pytest.mark.parametrize(
    "when",
    [
        "steps.weather.output.hours.exists(h, h == 8)",  # a macro's own variable
        "steps.weather.output.summary == 'rain or snow, foo.bar == 1' && context.tz != 'x'",
        "has(steps.weather.output.rain) && size(steps.weather.output.summary) > 0",
    ],
)
def test_conditions_over_steps_and_context_are_accepted(when: str) -> None:
    plan = parse_plan({"steps": [WEATHER, {**REMIND, "when": when}]}, CATALOG)
    assert plan.steps[1].when == when


def test_corpus_covers_every_code() -> None:
    from agent_reach_controller.planning import ProblemCode

    # cycle, ungrounded_argument and cap_exceeded have their own tests (test_grounding.py and
    # test_caps.py for the last two)
    # forbidden is only ever a refused call of a model's turn (test_dialects.py); reserved and
    # missing_event_field belong to trigger templates (test_templates.py, test_triggers.py)
    own_tests = {"cycle", "ungrounded_argument", "cap_exceeded", "forbidden"}
    covered = {c[3] for c in CORPUS} | own_tests | {"reserved", "missing_event_field"}
    assert covered == {code.value for code in ProblemCode}


def test_cycle_names_its_steps_and_points_into_it() -> None:
    steps = [
        step(step_id="a", depends_on=["c"]),
        step(step_id="b", depends_on=["a"]),
        step(step_id="c", depends_on=["b"]),
        step(step_id="d", depends_on=["a"]),
    ]
    problems = problems_of({"steps": steps})
    assert [(p.pointer, p.code) for p in problems] == [("/steps/0/depends_on/0", "cycle")]
    assert "a -> c -> b -> a" in problems[0].detail


def test_long_chain_without_cycle_is_fine() -> None:
    steps = [step(step_id="s0")] + [
        step(step_id=f"s{i}", depends_on=[f"s{i - 1}"]) for i in range(1, 1000)
    ]
    plan = parse_plan({"steps": steps}, CATALOG)
    assert len(plan.steps) == 1000


@pytest.mark.parametrize(
    ("limits", "body", "pointer", "phrase"),
    [
        (PlanLimits(max_steps=2), {"steps": [WEATHER] * 3}, "/steps", "3 steps; the limit is 2"),
        (
            PlanLimits(max_args_bytes=40),
            {"steps": [step(args={"city": "W" * 50, "day": "today"})]},
            "/steps/0/args",
            "bytes",
        ),
        (
            PlanLimits(max_depth=2),
            {"steps": [step(args={"a": {"b": {}}})]},
            "/steps/0/args/a/b",
            "deeper than 2",
        ),
        (
            PlanLimits(max_string_length=4),
            {"steps": [WEATHER]},
            "/steps/0/args/city",
            "5 characters",
        ),
        (
            PlanLimits(max_condition_length=5),
            {"steps": [step(when="context.flag")]},
            "/steps/0/when",
            "12 characters",
        ),
        (
            PlanLimits(max_context_bytes=10),
            {"steps": [WEATHER], "context": {"k": "v" * 20}},
            "/context",
            "bytes",
        ),
    ],
)
def test_limits(limits: PlanLimits, body: Any, pointer: str, phrase: str) -> None:
    problems = problems_of(body, limits=limits)
    found = [p for p in problems if p.pointer == pointer and p.code == "too_large"]
    assert found, problems
    assert phrase in found[0].detail


def test_hostile_depth_does_not_crash() -> None:
    deep: Any = "leaf"
    for _ in range(50_000):
        deep = [deep]
    problems = problems_of({"steps": [step(args={"city": "W", "day": "today", "x": deep})]})
    # args is depth 1, so the first array nested deeper than 32 is x/0/.../0 with 31 indexes
    assert pairs(problems) == {("/steps/0/args/x" + "/0" * 31, "too_large")}


def test_problem_cap() -> None:
    body = {
        "steps": [step(args={"city": 1, "day": 2, **{f"k{i}": float("nan") for i in range(50)}})]
    }
    problems = problems_of(body, limits=PlanLimits(max_problems=10))
    assert len(problems) == 11
    assert problems[-1].code == "too_large"


def test_every_problem_of_the_shape_at_once() -> None:
    body = {
        "goal": 7,
        "mystery": True,
        "steps": [
            {"step_id": "a", "tool": "weather.forecast", "depends_on": ["b", 3]},
            {"step_id": "b", "tool": "nope", "colour": 1},
            {"tool": "order.query", "args": "not-an-object", "when": 5},
            "not a step",
        ],
        "context": [],
    }
    problems = problems_of(body)
    expected = {
        ("/goal", "invalid_type"),
        ("/mystery", "unknown_field"),
        ("/steps/0/depends_on/1", "invalid_type"),
        ("/steps/1/colour", "unknown_field"),
        ("/steps/2/step_id", "missing_field"),
        ("/steps/2/args", "invalid_type"),
        ("/steps/2/when", "invalid_type"),
        ("/steps/3", "invalid_type"),
        ("/context", "invalid_type"),
    }
    assert pairs(problems) == expected
    assert len(problems) == len(expected)
    unknown = next(p for p in problems if p.pointer == "/steps/1/colour")
    assert unknown.detail.startswith("unknown field; expected args, delay, depends_on, priority")


def test_every_problem_of_the_meaning_at_once() -> None:
    """Once the shape is right, everything wrong with what it says is listed together."""
    body = {
        "steps": [
            {
                "step_id": "a",
                "tool": "weather.forecast",
                "args": {"city": 5, "day": "today"},
                "depends_on": ["b"],
            },
            {"step_id": "b", "tool": "nope", "depends_on": ["a", "zzz"]},
            {"step_id": "a", "tool": "reminder.create", "args": {"at": "x", "text": "$c.output"}},
            {"step_id": "d", "tool": "order.query", "when": "steps.a.output =="},
        ],
        "context": {"n": float("-inf")},
    }
    problems = problems_of(body)
    expected = {
        ("/steps/0/args/city", "invalid_arguments"),
        ("/steps/1/tool", "unknown_tool"),
        ("/steps/1/depends_on/1", "unknown_dependency"),
        ("/steps/2/step_id", "duplicate_step_id"),
        ("/steps/2/args/text", "unknown_reference"),
        ("/steps/3/when", "invalid_condition"),
        ("/steps/3/args", "invalid_arguments"),
        ("/context/n", "invalid_number"),
        ("/steps/0/depends_on/0", "cycle"),
    }
    assert pairs(problems) == expected
    assert len(problems) == len(expected)


def test_references_are_excused_from_static_schema_checks() -> None:
    body = {
        "steps": [
            WEATHER,
            {
                "step_id": "r",
                "tool": "reminder.create",
                "depends_on": ["weather"],
                "args": {
                    "at": "$weather.output.when",
                    "text": "hi",
                    "count": "$weather.output.n",
                    "tags": "$weather.output.tags",
                    "target": "$weather.output.who",
                },
            },
        ]
    }
    assert len(parse_plan(body, CATALOG).steps) == 2
    body["steps"][1]["args"]["count"] = "three"  # type: ignore[index]
    body["steps"][1]["args"]["tags"] = ["ok", 5]  # type: ignore[index]
    body["steps"][1]["args"]["target"] = {"user_id": "five"}  # type: ignore[index]
    del body["steps"][1]["args"]["text"]  # type: ignore[attr-defined]
    assert pairs(problems_of(body)) == {
        ("/steps/1/args", "invalid_arguments"),  # required 'text' is never excused
        ("/steps/1/args/count", "invalid_arguments"),
        ("/steps/1/args/tags/1", "invalid_arguments"),
        ("/steps/1/args/target", "invalid_arguments"),
    }


def test_anyof_branch_failing_only_on_a_reference_is_excused() -> None:
    args = {"at": "x", "text": "t", "target": {"user_id": "$weather.output.uid"}}
    body = {
        "steps": [
            WEATHER,
            {"step_id": "r", "tool": "reminder.create", "depends_on": ["weather"], "args": args},
        ]
    }
    assert parse_plan(body, CATALOG).steps[1].args["target"] == {"user_id": "$weather.output.uid"}


def test_escaped_dollar_is_validated_as_its_literal() -> None:
    plan = parse_plan({"steps": [step(args={"city": "$$weather.output", "day": "today"})]}, CATALOG)
    assert plan.steps[0].args["city"] == "$$weather.output"


def test_openai_tool_calls() -> None:
    body = {
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "weather_forecast",
                    "arguments": json.dumps({"city": "Wuhan", "day": "today"}),
                },
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "order.query", "arguments": {"order_id": "o1"}},
            },
        ],
        "context": {"user": "u1"},
    }
    plan = parse_plan(body, CATALOG)
    assert plan.source == "openai_chat"
    assert plan.goal is None
    assert [(s.step_id, s.tool, s.depends_on) for s in plan.steps] == [
        ("call_1", "weather.forecast", ()),
        ("call_2", "order.query", ()),
    ]
    assert plan.steps[0].args == {"city": "Wuhan", "day": "today"}
    assert plan.context == {"user": "u1"}


def test_openai_problems_of_shape_refuse_the_turn() -> None:
    body = {
        "tool_calls": [
            {"id": "call_1", "type": "custom", "function": {"name": "order_query"}},
            {"type": "function", "function": {"name": "order_query", "arguments": "{}"}},
            {"id": "call_3", "function": {"arguments": "{}"}},
        ],
        "goal": "g",
    }
    assert pairs(problems_of(body)) == {
        ("/tool_calls/0/type", "invalid_type"),
        ("/tool_calls/1/id", "missing_field"),
        ("/tool_calls/2/function/name", "missing_field"),
        ("/goal", "unknown_field"),
    }


OPENAI_CALLS: list[dict[str, Any]] = [
    {"id": "call_1", "function": {"name": "weather_forecast", "arguments": "{not json"}},
    {"id": "call_2", "function": {"name": "ghost", "arguments": "{}"}},
    {"id": "call_3", "function": {"name": "order_query", "arguments": '{"order_id": 5}'}},
    {"id": "call_4", "function": {"name": "order_query", "arguments": "[1]", "x": 1}},
    {"id": "call_5", "function": {"name": "order_query", "arguments": '{"order_id": "o1"}'}},
]


def test_openai_problems_of_one_call_refuse_only_that_call() -> None:
    plan = parse_plan({"tool_calls": OPENAI_CALLS}, CATALOG)
    assert [s.step_id for s in plan.steps] == ["call_5"]
    refused = {r.step_id: r for r in plan.refused}
    assert {k: [(p.pointer, p.code) for p in r.problems] for k, r in refused.items()} == {
        "call_1": [("/tool_calls/0/function/arguments", "invalid_arguments")],
        "call_2": [("/tool_calls/1/function/name", "unknown_tool")],
        "call_3": [("/tool_calls/2/function/arguments", "invalid_arguments")],
        "call_4": [("/tool_calls/3/function/arguments", "invalid_arguments")],
    }
    assert refused["call_2"].tool_version == ""
    assert refused["call_3"].tool == "order.query"
    assert refused["call_3"].problems[0].detail.startswith("at /order_id: 5 is not of type")


def test_openai_problems_with_atomic_refuse_the_turn() -> None:
    with pytest.raises(PlanInvalidError) as info:
        parse_plan({"tool_calls": OPENAI_CALLS}, CATALOG, atomic=True)
    assert pairs(info.value.problems) == {
        ("/tool_calls/0/function/arguments", "invalid_arguments"),
        ("/tool_calls/1/function/name", "unknown_tool"),
        ("/tool_calls/2/function/arguments", "invalid_arguments"),
        ("/tool_calls/3/function/arguments", "invalid_arguments"),
    }


def test_validate_resolved_args() -> None:
    tool = CATALOG["weather.forecast"]
    assert validate_resolved_args(tool, {"city": "W", "day": "today"}) == []
    problems = validate_resolved_args(tool, {"city": "", "day": "today", "more": 1})
    assert pairs(problems) == {("/args", "invalid_arguments"), ("/args/city", "invalid_arguments")}
    # resolved values that still look like references are checked, not excused
    assert validate_resolved_args(tool, {"city": "W", "day": "$x.output"})[0].pointer == "/args/day"


def test_a_steps_timeouts_replace_the_tools_one_by_one() -> None:
    from agent_reach_controller.tools.catalog import Timeouts

    body = {"steps": [{**WEATHER, "timeouts": {"timeout": "2s", "schedule_to_start": "500ms"}}]}
    [step] = parse_plan(body, CATALOG).steps
    assert step.timeouts == Timeouts(timeout=2.0, schedule_to_start=0.5)
    tool = CATALOG[step.tool]
    effective = Timeouts.effective(tool, step.timeouts.model_dump(exclude_none=True))
    assert (effective.timeout, effective.schedule_to_start) == (2.0, 0.5)
    assert effective.schedule_to_close == tool.schedule_to_close
    assert Timeouts.effective(tool, None).timeout == tool.timeout
