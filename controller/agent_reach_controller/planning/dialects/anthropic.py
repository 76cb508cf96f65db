"""Anthropic Messages: an assistant message's `tool_use` blocks in, a user message of
`tool_result` blocks out (`is_error` set for a call that did not succeed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Tag, WithJsonSchema

from agent_reach_controller.planning.dialects.base import (
    CALL,
    OTHER,
    Answer,
    Dialect,
    Options,
    OtherItem,
    StepDraft,
    call_arguments,
    call_or_other,
    call_pointers,
)
from agent_reach_controller.planning.problems import ProblemCode, ProblemCollector


class AnthropicToolUse(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_use"]
    id: str = Field(description="Becomes the step id; the reply's `tool_use_id`")
    name: str
    input: Annotated[Any, WithJsonSchema({"type": "object", "description": "The arguments"})] = (
        Field(default_factory=dict)
    )


class AnthropicContentBlock(OtherItem):
    """Any other content block (text, thinking, a server tool's use): kept, not run."""


Block = Annotated[
    Annotated[AnthropicToolUse, Tag(CALL)] | Annotated[AnthropicContentBlock, Tag(OTHER)],
    call_or_other("tool_use"),
]


class AnthropicSubmission(Options):
    """An Anthropic assistant message, as the SDK dumps it (`message.model_dump()`) or as a
    `MessageParam`, with the task's options beside its fields. Its other fields are not used."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    role: Literal["assistant"] = "assistant"
    content: list[Block] = Field(min_length=1)


class AnthropicDialect(Dialect):
    name = "anthropic"
    body = AnthropicSubmission
    calls = "content"
    call_noun = "tool_use block"
    vendor_fields = frozenset(
        {"id", "type", "model", "stop_reason", "stop_sequence", "usage", "container"}
    )

    def recognises(self, body: dict[str, Any]) -> bool:
        return isinstance(body.get("content"), list)

    def drafts(self, model: Any, *, prefix: str, out: ProblemCollector) -> list[StepDraft]:
        drafts: list[StepDraft] = []
        for index, block in enumerate(model.content):
            if not isinstance(block, AnthropicToolUse):
                continue
            base = f"/content/{index}"
            draft = StepDraft(
                position=len(drafts),
                base=base,
                step_id=block.id,
                tool=block.name,
                pointers=call_pointers(base, step_id="id", tool="name", args="input"),
            )
            call_arguments(block.input, draft)
            drafts.append(draft)
        if not drafts:
            out.add("/content", ProblemCode.MISSING_FIELD, "no block of type 'tool_use' to run")
        return drafts

    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        if not answers:
            return []
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": a.call_id,
                "content": a.text,
                "is_error": a.is_error,
            }
            for a in answers
        ]
        return [{"role": "user", "content": blocks}]
