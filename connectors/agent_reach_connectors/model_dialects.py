"""The model connector's endpoint kinds: how each is called through its SDK and read back.

One `Dialect` per kind (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages): which SDK
method sends the request, which SDK type the reply must validate as, and where its usage and
finish reason are. The request body is the controller's, passed to the SDK method: the fields the
method names go as arguments (so the SDK builds the request), any others in `extra_body`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from anthropic import AsyncAnthropic
from anthropic.types import Message
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError

# Never taken from the request: streaming is off, and these are the SDK's own call options.
_NOT_FROM_REQUEST = frozenset(
    {"stream", "stream_options", "extra_headers", "extra_query", "extra_body", "timeout"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Tokens a reply says it used: input (cached ones included), output, cached input."""

    input_tokens: int
    output_tokens: int
    cached_tokens: int

    def as_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
        }


def _count(value: Any) -> int:
    """A token count as a reply says it, never negative (a lying reply is recorded, bounded)."""
    return max(0, value) if isinstance(value, int) else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """One endpoint kind."""

    kind: str
    system: str  # gen_ai.provider.name
    type_name: str  # the SDK type a reply must be, as a person reads it
    reply_type: type[pydantic.BaseModel]
    method: Callable[[Any], Any]  # the SDK client -> its resource (with create)
    usage: Callable[[Any], Usage]
    finish: Callable[[Any], str]

    def validate(self, data: Any) -> Any:
        """The reply as the SDK type; ValidationError when it is not one."""
        return self.reply_type.model_validate(data)


def _chat_usage(reply: ChatCompletion) -> Usage:
    usage = reply.usage
    if usage is None:
        return Usage(input_tokens=0, output_tokens=0, cached_tokens=0)
    details = usage.prompt_tokens_details
    return Usage(
        input_tokens=_count(usage.prompt_tokens),
        output_tokens=_count(usage.completion_tokens),
        cached_tokens=_count(details.cached_tokens if details else 0),
    )


_CHAT_FINISH = {"function_call": "tool_calls"}


def _chat_finish(reply: ChatCompletion) -> str:
    if not reply.choices:
        return "empty"
    reason = str(reply.choices[0].finish_reason)
    return _CHAT_FINISH.get(reason, reason)


def _responses_usage(reply: Response) -> Usage:
    usage = reply.usage
    if usage is None:
        return Usage(input_tokens=0, output_tokens=0, cached_tokens=0)
    details = usage.input_tokens_details
    return Usage(
        input_tokens=_count(usage.input_tokens),
        output_tokens=_count(usage.output_tokens),
        cached_tokens=_count(details.cached_tokens if details else 0),
    )


_INCOMPLETE = {"max_output_tokens": "length"}


def _responses_finish(reply: Response) -> str:
    if reply.status == "incomplete":
        reason = reply.incomplete_details.reason if reply.incomplete_details else None
        return _INCOMPLETE.get(str(reason), str(reason or "incomplete"))
    if reply.status not in (None, "completed"):
        return str(reply.status)
    if any(item.type == "function_call" for item in reply.output):
        return "tool_calls"
    return "stop"


def _messages_usage(reply: Message) -> Usage:
    usage = reply.usage
    cached = _count(usage.cache_read_input_tokens)
    written = _count(usage.cache_creation_input_tokens)
    # Anthropic counts cache reads and writes apart from input_tokens; OpenAI's input includes
    # its cached tokens. Here input is every input token, as OpenAI counts it.
    return Usage(
        input_tokens=_count(usage.input_tokens) + cached + written,
        output_tokens=_count(usage.output_tokens),
        cached_tokens=cached,
    )


_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
}


def _messages_finish(reply: Message) -> str:
    reason = str(reply.stop_reason)
    return _STOP.get(reason, reason)


DIALECTS: Mapping[str, Dialect] = {
    "openai_chat": Dialect(
        kind="openai_chat",
        system="openai",
        type_name="an OpenAI ChatCompletion",
        reply_type=ChatCompletion,
        method=lambda client: client.chat.completions,
        usage=_chat_usage,
        finish=_chat_finish,
    ),
    "openai_responses": Dialect(
        kind="openai_responses",
        system="openai",
        type_name="an OpenAI Response",
        reply_type=Response,
        method=lambda client: client.responses,
        usage=_responses_usage,
        finish=_responses_finish,
    ),
    "anthropic": Dialect(
        kind="anthropic",
        system="anthropic",
        type_name="an Anthropic Message",
        reply_type=Message,
        method=lambda client: client.messages,
        usage=_messages_usage,
        finish=_messages_finish,
    ),
}


def split_request(
    tool: str, create: Callable[..., Any], request: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arguments the SDK method names, the rest for `extra_body`); refused when it lacks one
    the method requires (say, Anthropic's `max_tokens`)."""
    parameters = inspect.signature(create).parameters
    named = {k: v for k, v in request.items() if k in parameters and k not in _NOT_FROM_REQUEST}
    extra = {k: v for k, v in request.items() if k not in parameters and k not in _NOT_FROM_REQUEST}
    missing = [
        name
        for name, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind is inspect.Parameter.KEYWORD_ONLY
        and name not in named
    ]
    if missing:
        raise ConnectorError(
            ErrorCode.CONNECTOR_ERROR,
            f"{tool}: the model request lacks {', '.join(missing)}",
            retryable=False,
        )
    return named, extra


async def send(
    dialect: Dialect,
    client: AsyncOpenAI | AsyncAnthropic,
    request: Mapping[str, Any],
    *,
    tool: str,
    wait_s: float,
) -> bytes:
    """Send `request` through the SDK (no streaming); the reply's body, as received. `wait_s`
    is the SDK's HTTP timeout (a timeout given also spares Anthropic's long-request refusal)."""
    resource = dialect.method(client)
    named, extra = split_request(tool, resource.create, request)
    raw = await resource.with_raw_response.create(**named, extra_body=extra or None, timeout=wait_s)
    body: bytes = raw.http_response.content
    return body
