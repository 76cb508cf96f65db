"""The dialects a submission may be written in, and the reading of a body into a turn.

Adding a dialect is one module (its model, reader and replies) and one entry in DIALECTS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agent_reach_controller.planning.dialects.anthropic import AnthropicDialect
from agent_reach_controller.planning.dialects.base import (
    MAX_CAPS,
    MAX_DEADLINE_S,
    PRIORITY_RANGE,
    Answer,
    Dialect,
    Options,
    StepDraft,
    read_model,
    type_name,
)
from agent_reach_controller.planning.dialects.mcp import McpDialect
from agent_reach_controller.planning.dialects.openai_chat import ChatDialect
from agent_reach_controller.planning.dialects.openai_responses import ResponsesDialect
from agent_reach_controller.planning.dialects.plan import PlanDialect
from agent_reach_controller.planning.limits import PlanLimits
from agent_reach_controller.planning.problems import ProblemCode, ProblemCollector, pointer_join

# In the order a body is recognised by.
DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (PlanDialect(), ChatDialect(), ResponsesDialect(), AnthropicDialect(), McpDialect())
}
# The names, for the API's `dialect` parameter (a test keeps them equal to DIALECTS).
DialectName = Literal["plan", "openai_chat", "openai_responses", "anthropic", "mcp"]
# Tasks stored before dialects had their own names.
_STORED_AS = {"openai": "openai_chat"}


def dialect_named(name: str) -> Dialect:
    """The dialect a task was submitted in, from its stored `source`."""
    return DIALECTS[_STORED_AS.get(name, name)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Turn:
    """A body read by its dialect: the calls as step drafts and the task's options."""

    dialect: Dialect
    drafts: list[StepDraft]
    options: Options
    goal: str | None
    calls_pointer: str  # the body's list of calls, where a problem of them all points


def read_turn(
    body: Any, limits: PlanLimits, out: ProblemCollector, *, dialect: str | None = None
) -> Turn | None:
    """`body` read in `dialect` (recognised from the body when None); None with the problems in
    `out` when its structure is wrong."""
    chosen = _choose(body, dialect, out)
    if chosen is None:
        return None
    normal, prefix = chosen.normalise(body)
    calls = normal.get(chosen.calls) if isinstance(normal, dict) else None
    where = "" if prefix else f"/{chosen.calls}"
    if isinstance(calls, list) and len(calls) > limits.max_steps:
        detail = f"{len(calls):,} {chosen.call_noun}s; the limit is {limits.max_steps:,}"
        out.add(where, ProblemCode.TOO_LARGE, detail)
        return None
    if chosen.per_call and isinstance(normal, dict):
        for key, option in chosen.misspelt(normal):
            detail = (
                f"{key!r} is an option of plans only"
                if key == option
                else f"did you mean {option!r}?"
            )
            out.add(pointer_join("", key), ProblemCode.UNKNOWN_FIELD, detail)
    model = read_model(chosen.body, normal, out, prefix=prefix)
    if model is None:
        return None
    drafts = chosen.drafts(model, prefix=prefix, out=out)
    return Turn(
        dialect=chosen, drafts=drafts, options=model, goal=chosen.goal(model), calls_pointer=where
    )


def _choose(body: Any, name: str | None, out: ProblemCollector) -> Dialect | None:
    if name is not None:
        return DIALECTS[name]
    if isinstance(body, list):
        return DIALECTS["openai_responses"]
    if not isinstance(body, dict):
        out.add("", ProblemCode.INVALID_TYPE, f"a submission is an object, not {type_name(body)}")
        return None
    for dialect in DIALECTS.values():
        if dialect.recognises(body):
            return dialect
    out.add(
        "/steps",
        ProblemCode.MISSING_FIELD,
        "'steps' is required, or a model's turn: 'tool_calls' (OpenAI Chat), 'output' (OpenAI "
        "Responses) or 'content' (Anthropic)",
    )
    return None


__all__ = [
    "DIALECTS",
    "MAX_CAPS",
    "MAX_DEADLINE_S",
    "PRIORITY_RANGE",
    "Answer",
    "Dialect",
    "DialectName",
    "StepDraft",
    "Turn",
    "dialect_named",
    "read_turn",
]
