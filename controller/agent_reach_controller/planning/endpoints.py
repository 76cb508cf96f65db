"""The model endpoints an agent run speaks to: a request built from the stored conversation, and
a reply read back into what is stored and what the intake reads.

Each endpoint kind is the request side of a dialect the intake already reads: a reply's tool calls
become a round's steps through that dialect (planning/dialects), and their receipts go back to
the model as that dialect's replies. Adding an endpoint is one class here and one dialect.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agent_reach_controller.planning.dialects import dialect_named
from agent_reach_controller.planning.dialects.base import Answer
from agent_reach_controller.planning.references import STEP_ID_PATTERN
from agent_reach_controller.tools import shapes
from agent_reach_controller.tools.catalog import ToolSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """A model's reply, read: what the conversation keeps, and what it asks for."""

    entries: list[dict[str, Any]]  # appended to the conversation as the assistant's
    calls: dict[str, Any] | None  # the body the intake's dialect reads, if it calls tools
    text: str  # what it said in words (its final answer when it calls nothing)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """What the next model call is made of, whatever the endpoint."""

    model: str
    system: str
    messages: Sequence[dict[str, Any]]
    tools: Sequence[ToolSpec]
    temperature: float | None
    max_tokens: int
    note: str = ""  # the run's stage, said after the conversation (never stored in it)
    # Planner mode: the shape the reply must take, as a response format where the endpoint
    # takes one (planning/planner.py).
    reply_schema: dict[str, Any] | None = None
    reply_name: str = "plan"  # the schema's name in the response format


class ReplyError(ValueError):
    """A reply that is not what its endpoint answers (another vendor's shape, say)."""


class EndpointKind(ABC):
    """One vendor API: how its requests are built and its replies read."""

    name: ClassVar[str]
    dialect: ClassVar[str]  # the intake dialect its tool calls are read in

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    @abstractmethod
    def request(self, ask: Ask) -> dict[str, Any]:
        """The request body for the next model call."""

    @abstractmethod
    def read(self, reply: Any) -> Reply:
        """A reply, read (ReplyError when it is not this endpoint's)."""

    def replies(self, answers: Sequence[Answer]) -> list[dict[str, Any]]:
        """The tool results to append, as the model reads them."""
        return dialect_named(self.dialect).replies(answers)

    @abstractmethod
    def call_items(self, calls: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """Each tool call of a reply's `calls`, with the key its id is under."""

    @abstractmethod
    def calls_in(self, entries: Sequence[dict[str, Any]]) -> bool:
        """Whether stored assistant entries ask for tools (their results must follow)."""

    def number_calls(self, reply: Reply, *, taken: set[str], prefix: str) -> list[str]:
        """Give every call an id a step can have, unique in its round: a model may repeat ids,
        leave them empty or write ones no step may have. A changed id is changed where the
        conversation keeps it too (the same objects), so the model reads its results under
        the id it is then shown. Returns the ids, in order."""
        ids = []
        for index, (item, key) in enumerate(self.call_items(reply.calls or {})):
            given = item.get(key)
            if not (isinstance(given, str) and STEP_ID_PATTERN.match(given)) or given in taken:
                item[key] = given = f"{prefix}{index}"
            taken.add(given)
            ids.append(given)
        return ids


def _said(role: str, note: str) -> list[dict[str, Any]]:
    return [{"role": role, "content": note}] if note else []


def _noted(messages: Sequence[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """Anthropic's turns alternate: the note joins the last user turn (tool results, say) as a
    text block, or is a user turn of its own after the model's."""
    if not note:
        return list(messages)
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "user":
        return [*messages, {"role": "user", "content": note}]
    content = last.get("content")
    blocks = (
        [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    )
    return [*messages[:-1], {**last, "content": [*blocks, {"type": "text", "text": note}]}]


def _with_options(
    body: dict[str, Any], ask: Ask, shape: Callable[[ToolSpec], dict[str, Any]]
) -> dict[str, Any]:
    """The tools (in the endpoint's shape) and the temperature, where there are any."""
    if ask.tools:
        body["tools"] = [shape(t) for t in ask.tools]
    if ask.temperature is not None:
        body["temperature"] = ask.temperature
    return body


def _object(reply: Any, field: str, kind: str) -> dict[str, Any]:
    if not isinstance(reply, dict) or not isinstance(reply.get(field), list):
        raise ReplyError(f"the reply is not {kind} (no {field!r} list)")
    return reply


class Chat(EndpointKind):
    name = "openai_chat"
    dialect = "openai_chat"

    def request(self, ask: Ask) -> dict[str, Any]:
        system_message = [{"role": "system", "content": ask.system}] if ask.system else []
        body: dict[str, Any] = {
            "model": ask.model,
            "messages": [*system_message, *ask.messages, *_said("system", ask.note)],
            "max_tokens": ask.max_tokens,
        }
        if ask.reply_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": ask.reply_name, "schema": ask.reply_schema},
            }
        return _with_options(body, ask, shapes.chat)

    def read(self, reply: Any) -> Reply:
        choices = _object(reply, "choices", "a Chat Completion")["choices"]
        if not choices or not isinstance(choices[0], dict):
            raise ReplyError("the Chat Completion has no choice")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ReplyError("the Chat Completion's choice has no message")
        kept = {k: v for k, v in message.items() if v is not None}
        kept["role"] = "assistant"
        text = message.get("content") if isinstance(message.get("content"), str) else ""
        calls = message.get("tool_calls")
        return Reply(entries=[kept], calls=kept if calls else None, text=text or "")

    def call_items(self, calls: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        return [(c, "id") for c in calls.get("tool_calls") or [] if isinstance(c, dict)]

    def calls_in(self, entries: Sequence[dict[str, Any]]) -> bool:
        return any(e.get("tool_calls") for e in entries)


class Responses(EndpointKind):
    name = "openai_responses"
    dialect = "openai_responses"

    def request(self, ask: Ask) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": ask.model,
            "input": [*ask.messages, *_said("developer", ask.note)],
            "max_output_tokens": ask.max_tokens,
            "store": False,
        }
        if ask.reply_schema is not None:
            shape = {"type": "json_schema", "name": ask.reply_name, "schema": ask.reply_schema}
            body["text"] = {"format": shape}
        if ask.system:
            body["instructions"] = ask.system
        return _with_options(body, ask, shapes.responses)

    def read(self, reply: Any) -> Reply:
        output = _object(reply, "output", "an OpenAI Response")["output"]
        items = [i for i in output if isinstance(i, dict)]
        # Items go back as input; the ids the server gave them are its own, not ours.
        entries = [{k: v for k, v in i.items() if v is not None} for i in items]
        text = " ".join(
            part.get("text", "")
            for i in items
            if i.get("type") == "message"
            for part in i.get("content") or []
            if isinstance(part, dict) and part.get("type") == "output_text"
        )
        calls = any(i.get("type") == "function_call" for i in items)
        return Reply(entries=entries, calls={"output": entries} if calls else None, text=text)

    def call_items(self, calls: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        return [
            (i, "call_id") for i in calls.get("output") or [] if i.get("type") == "function_call"
        ]

    def calls_in(self, entries: Sequence[dict[str, Any]]) -> bool:
        return any(e.get("type") == "function_call" for e in entries)


class Anthropic(EndpointKind):
    name = "anthropic"
    dialect = "anthropic"

    def request(self, ask: Ask) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": ask.model,
            "messages": _noted(ask.messages, ask.note),
            "max_tokens": ask.max_tokens,
        }
        if ask.system:
            body["system"] = ask.system
        return _with_options(body, ask, shapes.anthropic)

    def read(self, reply: Any) -> Reply:
        blocks = _object(reply, "content", "an Anthropic Message")["content"]
        content = [b for b in blocks if isinstance(b, dict)]
        text = " ".join(b.get("text", "") for b in content if b.get("type") == "text")
        message = {"role": "assistant", "content": content}
        calls = any(b.get("type") == "tool_use" for b in content)
        return Reply(entries=[message], calls=message if calls else None, text=text)

    def call_items(self, calls: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        return [(b, "id") for b in calls.get("content") or [] if b.get("type") == "tool_use"]

    def calls_in(self, entries: Sequence[dict[str, Any]]) -> bool:
        return any(self.call_items(e) for e in entries)


ENDPOINTS: dict[str, EndpointKind] = {e.name: e for e in (Chat(), Responses(), Anthropic())}
