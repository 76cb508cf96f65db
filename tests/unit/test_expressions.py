"""CEL names: what an expression uses beyond the variables its evaluator provides, at each site."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import cel
import pytest
from pydantic import ValidationError

from agent_reach_controller.planning.conditions import (
    CONDITION_VARIABLES,
    compile_condition,
    evaluate,
    name_problems,
)
from agent_reach_controller.tools import ToolCatalog, ToolFileError
from agent_reach_controller.tools.catalog import KeyedLimit, RateLimit, ToolSpec
from agent_reach_controller.tools.expressions import (
    BUILTIN_FUNCTIONS,
    QUALIFIED_FUNCTIONS,
    TYPE_NAMES,
    UnknownNames,
    unknown_names,
)

WHEN = CONDITION_VARIABLES

# Conditions the tests and docs use (grep '"when"'), and the shapes a condition may take.
ACCEPTED = [
    "true",
    "false",
    "steps.weather.output.rain == true",
    "steps.a.output.go == true",
    "steps.a.output > 1",
    "size(steps.look.output.items) > 100",
    "context.go == true",
    "context.flag",
    'steps["w-2"].output.rain',
    "steps.weather.status == 'succeeded' && context.notify",
    "size(steps.weather.output.hours) > context.min_hours",
    "has(steps.weather.output.snow)",
    # macros bind their variable within their arguments
    "steps.weather.output.hours.exists(h, h == 8)",
    "steps.a.output.items.all(i, has(i.ok) && i.ok)",
    "steps.a.output.items.exists_one(x, x == 1) || steps.a.output.items.existsOne(x, x == 1)",
    "steps.a.output.items.map(i, i.n > 0, i.n * 2).filter(v, v > context.min).size() > 0",
    "steps.a.output.rows.exists(r, r.tags.exists(t, t == r.name))",
    "steps.a.output.rows.exists(x, x.exists(x, x == 1))",  # an inner macro shadows the outer
    "context.items.exists(size, size(size) > 0)",  # the variable, and the function of that name
    "context.items.exists(steps, steps > 1)",
    # identifier-like words in strings and comments are not names
    "steps.a.output.note == 'foo.bar == baz && nosuchfn(x)'",
    'steps.a.output.note != "it\'s bar" && steps.a.output.s == r"\\d+ bar"',
    "steps.a.output.note == '''multi\nline qux''' && b'zz' == bytes('zz')",
    "steps.a.output.x == 1 // compared with foo and bar(1)",
    # the engine's functions and type names
    "int(steps.a.output.n) + 1 > 0 && double(context.x) >= 1.5e3 && uint(1) == 1u",
    "string(steps.a.output.n).startsWith('1') && steps.a.output.s.endsWith('x')",
    "steps.a.output.s.contains('a') && steps.a.output.s.matches('^[a-z]+$')",
    "timestamp(steps.a.output.at).getHours() < 12 && duration('1h') > duration('1m')",
    "type(steps.a.output) == map && type(context.n) == int && dyn(1) == 1",
    "optional.of(steps.a.output).hasValue() && optional.none().orValue(1) == 1",
    "'x' in steps.a.output.tags ? true : false",
]


@pytest.mark.parametrize("source", ACCEPTED)
def test_conditions_that_use_steps_context_and_builtins_are_accepted(source: str) -> None:
    assert not unknown_names(source, variables=WHEN)
    assert name_problems(compile_condition(source)) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("foo.bar == 1", UnknownNames(variables=("foo",))),
        ("steps.a.output.x == bar", UnknownNames(variables=("bar",))),
        ("nosuchfn(steps.a.output)", UnknownNames(functions=("nosuchfn",))),
        ("steps.a.output.nosuchfn()", UnknownNames(functions=("nosuchfn",))),
        ("args.x == 1", UnknownNames(variables=("args",))),
        ("max(steps.a.output.n, 2) > 1", UnknownNames(functions=("max",))),  # cel.stdlib only
        ("steps.a.output.items.exists(x, x > y)", UnknownNames(variables=("y",))),
        ("steps.a.output.items.exists(x, x > 0) && x == 1", UnknownNames(variables=("x",))),
        (  # three arguments: no macro, the engine's `all` function, which does not exist
            "steps.a.output.items.all(x, y, z)",
            UnknownNames(variables=("x", "y", "z"), functions=("all",)),
        ),
        ("optional.foo(1)", UnknownNames(variables=("optional",), functions=("foo",))),
        ("r'\\' + bar == steps.a.s", UnknownNames(variables=("bar",))),
        ("_cel0 == 1 && [1].exists(x, x == _cel0)", UnknownNames(variables=("_cel0",))),
    ],
)
def test_undeclared_variables_and_unknown_functions_are_found(
    source: str, expected: UnknownNames
) -> None:
    assert unknown_names(source, variables=WHEN) == expected


def test_each_unknown_name_is_a_phrase_for_the_problem() -> None:
    assert name_problems(compile_condition("foo.bar == 1 && nosuchfn(steps.a.output)")) == [
        "uses undeclared variable 'foo' (only `context` and `steps` are declared)",
        "calls unknown function 'nosuchfn'",
    ]


def test_the_declared_variables_are_what_evaluate_provides() -> None:
    for name in sorted(CONDITION_VARIABLES):
        assert evaluate(compile_condition(f"type({name}) == map"), steps={}, context={})


def test_the_builtin_names_are_the_engines() -> None:
    """When the engine is upgraded, this says which names it gained or lost."""
    ts = "timestamp('2024-01-02T03:04:05Z')"
    examples = {
        "bytes": "bytes('a')",
        "contains": "'ab'.contains('a')",
        "double": "double(1)",
        "duration": "duration('1s')",
        "dyn": "dyn(1)",
        "endsWith": "'ab'.endsWith('b')",
        "getDate": f"{ts}.getDate()",
        "getDayOfMonth": f"{ts}.getDayOfMonth()",
        "getDayOfWeek": f"{ts}.getDayOfWeek()",
        "getDayOfYear": f"{ts}.getDayOfYear()",
        "getFullYear": f"{ts}.getFullYear()",
        "getHours": f"{ts}.getHours()",
        "getMilliseconds": f"{ts}.getMilliseconds()",
        "getMinutes": f"{ts}.getMinutes()",
        "getMonth": f"{ts}.getMonth()",
        "getSeconds": f"{ts}.getSeconds()",
        "hasValue": "optional.of(1).hasValue()",
        "int": "int('1')",
        "matches": "'a'.matches('a')",
        "or": "optional.none().or(optional.of(1))",
        "orValue": "optional.none().orValue(1)",
        "size": "size('ab')",
        "startsWith": "'ab'.startsWith('a')",
        "string": "string(1)",
        "timestamp": ts,
        "type": "type(1)",
        "uint": "uint(1)",
        "value": "optional.of(1).value()",
        "optional.of": "optional.of(1)",
        "optional.none": "optional.none()",
        "optional.ofNonZeroValue": "optional.ofNonZeroValue(1)",
    }
    assert set(examples) == BUILTIN_FUNCTIONS | QUALIFIED_FUNCTIONS
    for name, source in examples.items():
        cel.compile(source).execute({})  # raises "Undefined variable or function" if missing
        assert not unknown_names(source, variables=frozenset()), name
    for name in TYPE_NAMES:
        assert cel.compile(name).execute({}) == name
    for missing in ("max(1, 2)", "bool('true')", "now()", "[1].sortBy(x, x)"):
        with pytest.raises(RuntimeError, match="Undefined variable or function"):
            cel.compile(missing).execute({})
        assert unknown_names(missing, variables=frozenset()).functions, missing


# --- tool expressions: keys and units read `args` only --------------------------------------------

BASE = {"name": "crm.update", "description": "d", "connector": "echo"}


def test_tool_keys_and_units_over_args_are_accepted() -> None:
    spec = ToolSpec.model_validate(
        {
            **BASE,
            "rate_limit": {"rate": "5/s", "key": "args.customer.id"},
            "concurrency_per_key": {"limit": 1, "key": "string(args.account) + '/' + args.region"},
            "effects": {"rows": "size(args.rows.filter(r, r.write))"},
            "cost": "double(args.n) * 0.5",
        }
    )
    assert spec.rate_limit is not None
    assert spec.rate_limit.key == "args.customer.id"


@pytest.mark.parametrize(
    ("fields", "where", "phrase"),
    [
        (
            {"rate_limit": {"rate": 1, "key": "customer.id"}},
            "rate_limit.key",
            "key uses undeclared variable 'customer' (only `args` is declared)",
        ),
        (
            {"concurrency_per_key": {"limit": 1, "key": "args.account + suffix"}},
            "concurrency_per_key.key",
            "key uses undeclared variable 'suffix'",
        ),
        (
            {"effects": {"rows": "count(args.rows)"}},
            "effects.rows",
            "the units expression calls unknown function 'count'",
        ),
        (
            {"cost": "size(rows)"},
            "cost",
            "the units expression uses undeclared variable 'rows'",
        ),
        (
            {"rate_limit": {"rate": 1, "key": "steps.a.output"}},
            "rate_limit.key",
            "key uses undeclared variable 'steps'",
        ),
    ],
)
def test_a_tool_whose_cel_names_anything_but_args_is_refused_when_loaded(
    tmp_path: Path, fields: dict[str, object], where: str, phrase: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(phrase)):
        ToolSpec.model_validate({**BASE, **fields})
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps({"tools": [{**BASE, **fields}]}))  # JSON is YAML
    with pytest.raises(ToolFileError) as info:
        ToolCatalog.from_yaml_files([path])
    [error] = info.value.errors
    assert error.startswith(f"{path}: tool 'crm.update' (tools[0]): {where}: ")
    assert phrase in error


def test_limit_models_check_their_keys_alone() -> None:
    with pytest.raises(ValidationError, match="key uses undeclared variable 'customer'"):
        RateLimit.model_validate({"rate": 1, "key": "customer"})
    with pytest.raises(ValidationError, match="key calls unknown function 'lower'"):
        KeyedLimit.model_validate({"limit": 1, "key": "lower(args.account)"})
    with pytest.raises(ValidationError, match="key does not compile as CEL"):
        KeyedLimit.model_validate({"limit": 1, "key": "args.("})


def test_the_controller_loads_the_cel_engine_without_its_shell() -> None:
    """The package's interactive shell (typer, prompt_toolkit: ~8 MiB per process) stays out."""
    code = (
        "import sys, agent_reach_controller.server, agent_reach_controller.planning.conditions\n"
        "loaded = sorted(m for m in ('typer', 'prompt_toolkit') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
        "from agent_reach_controller.tools.cel_engine import cel\n"
        "assert cel.evaluate('1 + 2', {}) == 3\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
