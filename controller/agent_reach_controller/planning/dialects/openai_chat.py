"""OpenAI Chat Completions: an assistant message's `tool_calls` in, `role: tool` messages out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from agent_reach_controller.planning.dialects.base import (
    Answer,
    Dialect,
    Options,
    StepDraft,
    call_arguments,
    call_pointers,
)
from agent_reach_controller.planning.problems import ProblemCollector

# A model writes its arguments as a JSON-encoded object; an object is taken as well.
Arguments = Annotated[
    Any,
    WithJsonSchema(
        {
            "oneOf": [{"type": "string"}, {"type": "object"}],
            "description": "The arguments as the model wrote them: a JSON-encoded object",
        }
    ),
]


class ChatFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: Arguments = "{}"


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(description="Becomes the step id; the reply's `tool_call_id`")
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatSubmission(Options):
    """An OpenAI Chat Completions assistant message, as the SDK dumps it (`message.model_dump()`),
    with the task's options beside its fields. Its other fields are not used."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    role: Literal["assistant"] = "assistant"
    tool_calls: list[ChatToolCall] = Field(min_length=1)


class ChatDialect(Dialect):
    name = "openai_chat"
    body = ChatSubmission
    calls = "tool_calls"
    vendor_fields = frozenset(
        {"content", "refusal", "annotations", "audio", "function_call", "name", "reasoning"}
    )

    def recognises(self, body: dict[str, Any]) -> bool:
        return "tool_calls" in body

    def drafts(self, model: Any, *, prefix: str, out: ProblemCollector) -> list[StepDraft]:
        drafts = []
        for position, call in enumerate(model.tool_calls):
            base = f"/tool_calls/{position}"
            draft = StepDraft(
                position=position,
                base=base,
                step_id=call.id,
                tool=call.function.name,
                pointers=call_pointers(
                    base, step_id="id", tool="function/name", args="function/arguments"
                ),
            )
            call_arguments(call.function.arguments, draft)
            drafts.append(draft)
        return drafts

    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": a.call_id, "content": a.text} for a in answers]
