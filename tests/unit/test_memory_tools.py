"""The memory tools' definitions: what they take agrees with memory's rules, none names a
subject, and no model-facing tool list shows them (only a run's model calls them)."""

from __future__ import annotations

from agent_reach_controller.decide import memory as rules
from agent_reach_controller.tools import shapes
from agent_reach_controller.tools.catalog import ToolCatalog
from agent_reach_controller.tools.memory import MAX_SEARCH, MEMORY_CONNECTOR, OPS, memory_tools


def test_the_tools_take_the_stores_types_and_never_a_subject() -> None:
    tools = memory_tools()
    assert [t.name for t in tools] == [f"memory.{op}" for op in OPS]
    for tool in tools:
        assert tool.connector == MEMORY_CONNECTOR
        assert tool.config == {"op": tool.name.removeprefix("memory.")}
        properties = tool.input_schema["properties"]
        assert "subject" not in properties
        assert tool.input_schema["additionalProperties"] is False
        if "type" in properties:
            assert properties["type"]["enum"] == list(rules.TYPES)
    save = tools[0].input_schema["properties"]
    assert save["text"]["maxLength"] == rules.MAX_TEXT
    assert save["key"]["maxLength"] == rules.MAX_KEY
    assert tools[1].input_schema["properties"]["limit"]["maximum"] == MAX_SEARCH
    ToolCatalog(tools)  # a valid catalogue on their own


def test_no_model_facing_tool_list_shows_them() -> None:
    for format in ("openai_chat", "openai_responses", "anthropic", "mcp"):
        assert shapes.tool_list(memory_tools(), format) == []
