"""Planner mode: a model asked for a whole plan in our plan shape, instead of one call at a time.

The plan the model writes is read like any submitted plan (`parse_plan`, dialect `plan`: cycles,
unknown tools, references, `when`, grounding, caps); its steps run as the round's task, and
their results go back to the model, which then answers. What the model is given: `PLAN_SCHEMA`
(as a response format where the endpoint takes one) and `instructions`, naming the tools.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agent_reach_controller.planning.problems import Problem
from agent_reach_controller.tools.catalog import ToolSpec

# The plan shape a model writes: the plan dialect's steps, without the options a caller sets.
PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["steps"],
    "properties": {
        "goal": {"type": "string", "description": "What the plan achieves, in a sentence"},
        "steps": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["step_id", "tool", "args"],
                "properties": {
                    "step_id": {
                        "type": "string",
                        "pattern": "^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$",
                        "description": "Unique within the plan",
                    },
                    "tool": {"type": "string", "description": "A tool's name, as listed"},
                    "args": {
                        "type": "object",
                        "description": "The tool's arguments; a whole string "
                        "`$<step_id>.output[.path]` is replaced by that step's output",
                    },
                    "depends_on": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "Steps that must end first",
                    },
                    "when": {
                        "type": "string",
                        "description": "Run only if this CEL condition over `steps` holds, "
                        "e.g. `steps.weather.output.rain == true`",
                    },
                },
            },
        },
    },
}

# A plan's results go back to the model as its input under this heading; it then answers.
RESULTS = "The results of your plan, step by step:"
# Plain JSON, or JSON in a fenced block: what a model writes when asked for JSON.
_FENCED = re.compile(r"^\s*```(?:json)?\s*(?P<body>.*?)\s*```\s*$", re.DOTALL)


def instructions(tools: Sequence[ToolSpec]) -> str:
    """What the model is told in a planning round: the shape to write and the tools it has."""
    listed = "\n".join(
        f"- {t.name}: {t.description} Arguments (JSON Schema): "
        f"{json.dumps(t.input_schema, separators=(',', ':'))}"
        for t in tools
    )
    return (
        "Answer with a plan: one JSON object, nothing else, of this shape: "
        f"{json.dumps(PLAN_SCHEMA, separators=(',', ':'))}. Steps run as soon as the steps they "
        "depend on have ended; a later step may use an earlier one's output as "
        '`"$<step_id>.output.<field>"`. The tools you may use:\n'
        f"{listed or '- (none)'}"
    )


def read_plan(text: str) -> Any:
    """The JSON a model wrote, bare or fenced (ValueError, saying why, when it is not JSON)."""
    fenced = _FENCED.match(text)
    body = fenced.group("body") if fenced else text
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ValueError(f"the plan is not JSON: {exc}") from None


def refusal(problems: Sequence[Problem]) -> str:
    """What the model is told of a plan that was refused, once, to write it again."""
    said = "\n".join(f"- at {p.pointer or '/'}: {p.detail} ({p.code})" for p in problems[:20])
    return (
        "Your plan was refused; nothing of it ran. Its problems, each at a JSON pointer into "
        f"the plan:\n{said}\nWrite the whole plan again, corrected."
    )


def results(lines: Sequence[tuple[str, str]]) -> str:
    """A plan's results as the model reads them: each step's id and its receipt."""
    said = "\n".join(f"- {step_id}: {text}" for step_id, text in lines)
    return f"{RESULTS}\n{said}\nAnswer the request now from these results."


# The router: one first model call that picks how a message is handled.
ROUTES = ("answer", "react", "plan")
ROUTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["route", "reason"],
    "properties": {
        "route": {
            "enum": list(ROUTES),
            "description": "answer: a plain answer, no tools; react: call tools one round at "
            "a time; plan: several tool steps that can be planned up front",
        },
        "reason": {"type": "string", "description": "Why, in a sentence"},
    },
}


def router_instructions(tools: Sequence[ToolSpec]) -> str:
    """What the model is told in a routing round."""
    names = ", ".join(t.name for t in tools) or "(none)"
    return (
        "First decide how to handle the user's message, and say nothing else: one JSON object "
        f"of this shape: {json.dumps(ROUTE_SCHEMA, separators=(',', ':'))}. Tools there are: "
        f"{names}."
    )


def read_route(text: str) -> tuple[str, str]:
    """(route, reason) from a routing reply; one that is not a choice is `react`, saying why."""
    try:
        chosen = read_plan(text)
    except ValueError as exc:
        return "react", f"the router's reply was not a choice ({exc}); react by default"
    route = chosen.get("route") if isinstance(chosen, dict) else None
    reason = chosen.get("reason") if isinstance(chosen, dict) else None
    if route not in ROUTES:
        return "react", f"the router chose {route!r}, which is not a route; react by default"
    return str(route), str(reason or "")[:500]


# Category routing: with many tools, the model first picks a category, then sees its tools.
GENERAL = "general"


def category_of(tool: ToolSpec) -> str:
    """A tool's category: the first part of its name (`crm.lookup`: `crm`), else `general`."""
    head, dot, _ = tool.name.partition(".")
    return head if dot else GENERAL


def categories(tools: Sequence[ToolSpec]) -> dict[str, list[ToolSpec]]:
    found: dict[str, list[ToolSpec]] = {}
    for tool in tools:
        found.setdefault(category_of(tool), []).append(tool)
    return dict(sorted(found.items()))


def category_schema(names: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["category", "reason"],
        "properties": {
            "category": {"enum": list(names), "description": "The tools' category to use"},
            "reason": {"type": "string", "description": "Why, in a sentence"},
        },
    }


def category_instructions(by_category: dict[str, list[ToolSpec]]) -> str:
    """What the model is told when it must first pick a category of tools."""
    listed = "\n".join(
        f"- {name}: {len(tools)} tool(s): "
        + "; ".join(f"{t.name.partition('.')[2] or t.name}: {t.description}" for t in tools[:8])
        for name, tools in by_category.items()
    )
    schema = category_schema(list(by_category))
    return (
        "There are many tools, in categories. First pick the one category whose tools the "
        "request needs, and say nothing else: one JSON object of this shape: "
        f"{json.dumps(schema, separators=(',', ':'))}. The categories:\n{listed}"
    )


def read_category(text: str, names: Sequence[str]) -> tuple[str | None, str]:
    """(category, reason) from a category reply; None (and why) when it names none of them."""
    try:
        chosen = read_plan(text)
    except ValueError as exc:
        return None, f"the reply was not a choice ({exc})"
    name = chosen.get("category") if isinstance(chosen, dict) else None
    if name not in names:
        return None, f"{name!r} is not one of the categories"
    reason = chosen.get("reason") if isinstance(chosen, dict) else ""
    return str(name), str(reason or "")[:500]
