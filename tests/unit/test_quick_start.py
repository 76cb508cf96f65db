"""`reach dev`'s banner: its example plan calls a tool that is loaded, with arguments it takes."""

from __future__ import annotations

from typing import Any

from agent_reach_cli.quick_start import example_args, example_plan
from agent_reach_controller.tools.catalog import ToolSpec


def _tool(name: str, risk: str = "read", **more: Any) -> ToolSpec:
    spec = {"name": name, "description": name, "connector": "echo", "risk": risk, **more}
    return ToolSpec.model_validate(spec)


def _schema(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": list(properties), "properties": properties}


def test_required_arguments_come_from_the_schema_or_a_placeholder_of_their_type() -> None:
    schema = _schema(
        city={"type": "string", "examples": ["Wuhan"]},
        day={"enum": ["today", "tomorrow"]},
        units={"type": "string", "default": "metric"},
        days={"type": "integer", "minimum": 1},
        note={"type": "string"},
    )
    assert example_args(schema) == {
        "city": "Wuhan",
        "day": "today",
        "units": "metric",
        "days": 1,
        "note": "example",
    }
    assert example_args({"type": "object"}) == {}


def test_arguments_that_would_be_refused_give_no_example() -> None:
    assert example_args(_schema(sku={"type": "string", "pattern": "^SKU-[0-9]+$"})) is None
    assert example_args(_schema(order={"type": "string"}), grounded=["order"]) is None


def test_the_example_prefers_a_read_and_never_a_dangerous_tool() -> None:
    tools = [
        _tool("a.wipe", "dangerous"),
        _tool("b.write", "write"),
        _tool("c.lookup", input_schema=_schema(sku={"type": "string", "pattern": "^X$"})),
        _tool("d.lookup", input_schema=_schema(q={"type": "string"})),
    ]
    plan = example_plan(tools, demo_mode=False)
    assert plan == {"steps": [{"step_id": "first", "tool": "d.lookup", "args": {"q": "example"}}]}
    assert example_plan(tools[:2], demo_mode=False) == {
        "steps": [{"step_id": "first", "tool": "b.write", "args": {}}]
    }
    assert example_plan(tools[:1], demo_mode=False) is None
    assert example_plan([], demo_mode=False) is None


def test_the_umbrella_plan_is_the_example_only_with_the_demo() -> None:
    plan = example_plan([], demo_mode=True)
    assert plan is not None
    assert [s["tool"] for s in plan["steps"]] == ["weather.forecast", "reminder.create"]
