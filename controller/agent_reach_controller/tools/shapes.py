"""The catalogue in the shape each model API takes its tool list in.

Names: OpenAI and Anthropic accept only `[a-zA-Z0-9_-]{1,64}`, so their lists use the mapped name
(`openai_name`); MCP names may hold dots, so MCP gets the tool's own name. A call naming either
is resolved back by the catalogue. Annotations (read-only, destructive, idempotent) go where a
shape has room for them: MCP's `annotations`; vendor tool lists refuse unknown keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from agent_reach_controller.tools.agents import MODEL_CONNECTOR
from agent_reach_controller.tools.catalog import ToolSpec, openai_name
from agent_reach_controller.tools.memory import MEMORY_CONNECTOR

Format = Literal["native", "openai", "openai_chat", "openai_responses", "anthropic", "mcp"]

# What OpenAI's strict mode (Structured Outputs) reads in a schema; any other keyword, an object
# that allows more properties or leaves one optional, and the tool is offered without `strict`.
_STRICT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "description",
        "title",
        "$ref",
        "$defs",
        "definitions",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)


def strict_ready(schema: Any) -> bool:
    """Whether OpenAI may enforce this input schema strictly (`strict: true`)."""
    if isinstance(schema, list):
        return all(strict_ready(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if not set(schema) <= _STRICT_KEYWORDS:
        return False
    if schema.get("type") == "object" or "properties" in schema:
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is not False or set(props) != set(
            schema.get("required", [])
        ):
            return False
    nested = [
        *schema.get("properties", {}).values(),
        *schema.get("$defs", {}).values(),
        *schema.get("definitions", {}).values(),
        *schema.get("anyOf", []),
    ]
    if "items" in schema:
        nested.append(schema["items"])
    return all(strict_ready(s) for s in nested)


def hints(spec: ToolSpec) -> dict[str, bool]:
    """MCP's tool hints from the tool's risk and idempotency."""
    return {
        "readOnlyHint": spec.risk == "read",
        "destructiveHint": spec.risk == "dangerous",
        "idempotentHint": spec.idempotent or spec.risk == "read",
    }


def chat(spec: ToolSpec) -> dict[str, Any]:
    """An OpenAI Chat Completions `tools` entry."""
    return {
        "type": "function",
        "function": {
            "name": openai_name(spec.name),
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    }


def responses(spec: ToolSpec) -> dict[str, Any]:
    """An OpenAI Responses `tools` entry (flat), strict where the schema allows it."""
    return {
        "type": "function",
        "name": openai_name(spec.name),
        "description": spec.description,
        "parameters": spec.input_schema,
        "strict": strict_ready(spec.input_schema),
    }


def anthropic(spec: ToolSpec) -> dict[str, Any]:
    """An Anthropic Messages `tools` entry."""
    return {
        "name": openai_name(spec.name),
        "description": spec.description,
        "input_schema": spec.input_schema,
    }


def mcp(spec: ToolSpec) -> dict[str, Any]:
    """An MCP `tools/list` entry."""
    return {
        "name": spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema,
        "annotations": hints(spec),
    }


# Connectors whose tools are called by runs only, never by a caller's plan.
_RUNS_ONLY = frozenset({MODEL_CONNECTOR, MEMORY_CONNECTOR})

SHAPES: dict[str, Callable[[ToolSpec], dict[str, Any]]] = {
    "openai": chat,
    "openai_chat": chat,
    "openai_responses": responses,
    "anthropic": anthropic,
    "mcp": mcp,
}


def tool_list(specs: Iterable[ToolSpec], format: str) -> list[dict[str, Any]]:
    """The tools in one model API's shape (`format` a key of SHAPES). An agent's model is no
    tool a model may call (runs call it), so it is never listed; nor are the memory tools, which
    only a run's model calls (for its subject)."""
    shape = SHAPES[format]
    return [shape(spec) for spec in specs if spec.connector not in _RUNS_ONLY]
