"""`@tool`: the schema a model sees comes from the hints, and the function gets their types."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from agent_reach_connectors import ConnectorError, ToolCall, tool
from agent_reach_connectors.python import PythonConnector
from agent_reach_connectors.pytools import tool_of, tools_in
from tests.connectors.support import tool_call
from tests.support import pytools_example


def call(function: str, args: dict[str, Any]) -> ToolCall:
    return tool_call(args=args, config={"function": function})


def test_the_schema_is_the_signature_without_generated_titles() -> None:
    described = tool_of(pytools_example.tomorrow)
    assert described is not None
    schema = described.input_schema
    Draft202012Validator.check_schema(schema)
    assert schema["required"] == ["place", "at"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["units"] == {
        "default": "metric",
        "enum": ["metric", "imperial"],
        "type": "string",
    }
    assert schema["properties"]["at"]["format"] == "date-time"
    # A property named `title` stays; pydantic's titles of schemas go.
    assert schema["properties"]["title"]["description"] == "A property named like a keyword"
    assert "title" not in schema["$defs"]["Place"]
    assert described.description == "Tomorrow's weather at a place."
    definition = described.definition()
    assert definition["connector"] == "python"
    assert definition["config"] == {"function": "tests.support.pytools_example:tomorrow"}
    assert (definition["name"], definition["idempotent"], definition["timeout"]) == (
        "weather.tomorrow",
        True,
        "5s",
    )


def test_a_module_lists_its_tools_and_nothing_else() -> None:
    found = [t.name for t in tools_in(pytools_example)]
    assert found == ["count", "weather.tomorrow"]


async def test_the_function_gets_the_types_it_declared() -> None:
    connector = PythonConnector()
    args = {"place": {"city": "Wuhan"}, "at": "2026-12-03T08:00:00+08:00"}
    out = await connector.invoke(call("tests.support.pytools_example:tomorrow", args))
    assert out["hour"] == 8
    assert out["utc_offset_s"] == 8 * 3600
    assert out["country"] == "CN"
    assert out["rain"] is True
    words = {"words": ["a", "umbrella", "rain"], "at_least": 4}
    assert await connector.invoke(call("tests.support.pytools_example:count", words)) == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({"place": {"city": "Wuhan"}}, "at: Missing required argument"),
        ({"place": {"city": "Wuhan"}, "at": "tomorrow"}, "at: Input should be a valid datetime"),
        ({"place": {}, "at": "2026-12-03T08:00:00Z"}, "place.city: Field required"),
        ({"place": {"city": "W"}, "at": "2026-12-03T08:00:00Z", "x": 1}, "x: Unexpected"),
    ],
)
async def test_arguments_that_do_not_fit_are_invalid_and_never_echoed(
    args: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConnectorError) as raised:
        await PythonConnector().invoke(call("tests.support.pytools_example:tomorrow", args))
    assert raised.value.code == "invalid_arguments"
    assert says in raised.value.message
    if "at" in args:
        assert str(args["at"]) not in raised.value.message  # values are never repeated


async def test_an_error_raised_inside_the_function_is_its_own() -> None:
    args = {"place": {"city": "Atlantis"}, "at": "2026-12-03T08:00:00Z"}
    with pytest.raises(ConnectorError) as raised:
        await PythonConnector().invoke(call("tests.support.pytools_example:tomorrow", args))
    assert raised.value.code == "not_found"


def test_what_cannot_be_a_tool_is_refused_when_decorated() -> None:
    def nested(x: int) -> int:
        """Defined in a function: no import path reaches it."""
        return x

    with pytest.raises(TypeError, match="not importable by path"):
        tool(nested)
    with pytest.raises(TypeError, match="needs a docstring"):
        tool(_undocumented)
    with pytest.raises(TypeError, match=r"takes \*rest"):
        tool(_variadic)
    with pytest.raises(TypeError, match="connector is set by @tool"):
        tool(description="Echo.", connector="http")(_undocumented)


def _undocumented(x: int) -> int:
    return x


def _variadic(*rest: int) -> int:
    """Sums."""
    return sum(rest)
