"""OpenAI Responses: `function_call` output items in, `function_call_output` items out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Tag

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
from agent_reach_controller.planning.dialects.openai_chat import Arguments
from agent_reach_controller.planning.problems import ProblemCode, ProblemCollector


class ResponsesFunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call"]
    call_id: str = Field(description="Becomes the step id; the reply's `call_id`")
    name: str
    arguments: Arguments = "{}"
    id: str | None = None
    status: str | None = None


class ResponsesOutputItem(OtherItem):
    """Any other output item (a message, reasoning, a hosted tool's call): kept, not run."""


OutputItem = Annotated[
    Annotated[ResponsesFunctionCall, Tag(CALL)] | Annotated[ResponsesOutputItem, Tag(OTHER)],
    call_or_other("function_call"),
]


class ResponsesSubmission(Options):
    """OpenAI Responses output items (`response.output`, dumped), under `output` beside the task's
    options; a bare array of them is taken too, and so is a whole `Response` as the SDK dumps it
    (`response.model_dump()`: its other fields are not used). Items other than function calls
    are not run."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    output: list[OutputItem] = Field(min_length=1)


class ResponsesDialect(Dialect):
    name = "openai_responses"
    body = ResponsesSubmission
    calls = "output"
    call_noun = "function_call item"
    # A `Response`'s own fields beside `output` (the SDK adds more; an unknown one passes too, and
    # only one close to an option's name is taken for a misspelling).
    vendor_fields = frozenset(
        {
            "access_programs", "background", "completed_at", "conversation", "created_at", "error",
            "id", "image", "incomplete_details", "input_transformations", "instructions",
            "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation", "object",
            "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_diagnostics",
            "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning",
            "safety_identifier", "service_tier", "status", "temperature", "text", "tool_choice",
            "tool_usage", "tools", "top_logprobs", "top_p", "truncation", "usage", "user",
        }
    )  # fmt: skip

    def recognises(self, body: dict[str, Any]) -> bool:
        return "output" in body

    def normalise(self, body: Any) -> tuple[Any, str]:
        return ({"output": body}, "/output") if isinstance(body, list) else (body, "")

    def drafts(self, model: Any, *, prefix: str, out: ProblemCollector) -> list[StepDraft]:
        drafts: list[StepDraft] = []
        for index, item in enumerate(model.output):
            if not isinstance(item, ResponsesFunctionCall):
                continue
            base = f"{'' if prefix else '/output'}/{index}"
            draft = StepDraft(
                position=len(drafts),
                base=base,
                step_id=item.call_id,
                tool=item.name,
                pointers=call_pointers(base, step_id="call_id", tool="name", args="arguments"),
            )
            call_arguments(item.arguments, draft)
            drafts.append(draft)
        if not drafts:
            where = "" if prefix else "/output"
            out.add(where, ProblemCode.MISSING_FIELD, "no item of type 'function_call' to run")
        return drafts

    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        return [
            {"type": "function_call_output", "call_id": a.call_id, "output": a.text}
            for a in answers
        ]
