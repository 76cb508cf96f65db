"""MCP `tools/call`: one call's params (`name`, `arguments`) in, a `CallToolResult` out.

The MCP gateway (api/mcp.py) submits each call in this dialect; a service may too, with
`?dialect=mcp` (a body is never taken for one by its shape). The call's step is named `call`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from agent_reach_controller.planning.dialects.base import (
    Answer,
    Dialect,
    Options,
    StepDraft,
    call_arguments,
)
from agent_reach_controller.planning.problems import ProblemCollector

STEP_ID = "call"


class McpCall(Options):
    """The params of an MCP `tools/call` request, with the task's options beside them."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    name: str = Field(description="The tool's name (dotted, as `tools/list` gives it)")
    arguments: Annotated[Any, WithJsonSchema({"type": "object"})] = Field(default_factory=dict)


class McpDialect(Dialect):
    name = "mcp"
    body = McpCall
    calls = "arguments"  # one call: nothing to count
    call_noun = "call"
    vendor_fields = frozenset({"_meta", "task", "input_responses", "request_state"})

    def recognises(self, body: dict[str, Any]) -> bool:
        return False  # only ever named: {"name", "arguments"} is too common a shape to guess

    def drafts(self, model: Any, *, prefix: str, out: ProblemCollector) -> list[StepDraft]:
        draft = StepDraft(
            position=0,
            base="",
            step_id=STEP_ID,
            tool=model.name,
            pointers={
                "step_id": "/name",
                "tool": "/name",
                "args": "/arguments",
                "depends_on": "",
                "when": "",
            },
        )
        call_arguments(model.arguments or {}, draft)
        return [draft]

    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        return [
            {"content": [{"type": "text", "text": a.text}], "isError": a.is_error} for a in answers
        ]
