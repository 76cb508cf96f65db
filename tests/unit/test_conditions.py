"""CEL conditions: compile, evaluate, referenced steps, errors."""

from __future__ import annotations

import pytest

from agent_reach_controller.planning.conditions import (
    ConditionError,
    compile_condition,
    evaluate,
    referenced_steps,
)

STEPS = {
    "weather": {"output": {"rain": True, "mm": 3.5, "hours": [7, 8]}, "status": "succeeded"},
    "w-2": {"output": {"rain": False}, "status": "succeeded"},
}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("steps.weather.output.rain == true", True),
        ("steps.weather.output.mm > 5.0", False),
        ('steps["w-2"].output.rain', False),
        ("steps.weather.status == 'succeeded' && context.notify", True),
        ("steps.weather.output.hours.exists(h, h == 8)", True),
        ("size(steps.weather.output.hours) > context.min_hours", False),
        ("has(steps.weather.output.snow)", False),
    ],
)
def test_evaluates_to_bool(expr: str, expected: bool) -> None:
    compiled = compile_condition(expr)
    context = {"notify": True, "min_hours": 2}
    assert evaluate(compiled, steps=STEPS, context=context) is expected


def test_non_bool_result_is_an_error() -> None:
    with pytest.raises(ConditionError, match="evaluated to float, not bool"):
        evaluate(compile_condition("steps.weather.output.mm"), steps=STEPS, context={})


@pytest.mark.parametrize("expr", ["steps.weather.output.rain ==", "1 +", "(", "   "])
def test_syntax_errors(expr: str) -> None:
    with pytest.raises(ConditionError, match=r"does not compile|empty"):
        compile_condition(expr)


def test_missing_key_names_it() -> None:
    with pytest.raises(ConditionError, match="no such key: 'snow'"):
        evaluate(compile_condition("steps.weather.output.snow"), steps=STEPS, context={})
    with pytest.raises(ConditionError, match="no such key: 'other'"):
        evaluate(compile_condition("steps.other.output.x == 1"), steps=STEPS, context={})


def test_type_errors_and_unknown_variables() -> None:
    with pytest.raises(ConditionError, match="No such overload"):
        evaluate(compile_condition("1 + 'a' == 2"), steps={}, context={})
    with pytest.raises(ConditionError, match="Undefined variable"):
        evaluate(compile_condition("nothing == 1"), steps={}, context={})


def test_referenced_steps() -> None:
    assert referenced_steps(
        "steps.a.output.x && steps[\"b-1\"].status == 'ok' && steps['c'].output && "
        "'steps.fake' != context.steps.z"
    ) == frozenset({"a", "b-1", "c"})
    assert compile_condition("steps.a.output == 1").step_ids == frozenset({"a"})


def test_compiled_programs_are_cached() -> None:
    assert compile_condition("context.x == 1") is compile_condition("context.x == 1")
