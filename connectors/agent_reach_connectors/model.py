"""The `model` connector: one call is one model request (OpenAI Chat, Responses, or Anthropic),
or one embeddings request (`model_embeddings`).

It sends the request body the controller built through the vendor's own SDK (`openai`,
`anthropic`), with the SDK's retries off (the executor's retry policy retries, so a 500 is one
request per attempt) and its HTTP going through `model_transport` (the SSRF guard, the address
pinned, no proxy from the environment, no redirect followed, the reply capped after
decompression). The reply must validate as the SDK's type for the endpoint kind; it comes back
with its usage and a normalised finish reason. A model call has no side effect: no failure says
it may have been applied, so a model step is retried by policy and never ends `outcome_unknown`.
The API key is only ever a `${env:NAME}` reference in the config, resolved here per call.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import anthropic
import httpx2
import openai
import pydantic
from opentelemetry.trace import Span, SpanKind

from agent_reach import telemetry
from agent_reach.destinations import Destinations
from agent_reach.errors import ErrorCode
from agent_reach.ids import parse_traceparent
from agent_reach_connectors import netguard
from agent_reach_connectors.base import ConnectorError, ToolCall, resolve_secrets
from agent_reach_connectors.http import HttpConnector, Redactor, Resolver
from agent_reach_connectors.http_request import CONNECT_TIMEOUT_CAP, allowlist, destinations
from agent_reach_connectors.model_dialects import DIALECTS, Dialect, send
from agent_reach_connectors.model_embeddings import (
    EMBEDDINGS,
    embeddings_config,
    is_embed,
    read_embed_request,
    read_embeddings,
)
from agent_reach_connectors.model_transport import Guard, GuardedTransport, Pools
from agent_reach_connectors.throttling import parse_retry_after

MAX_REPLY_BYTES = 4 * 1024 * 1024
_KEY_REF = re.compile(r"\$\{env:[A-Za-z_][A-Za-z0-9_]*\}")
# Headers that carry credentials: like api_key, only by reference.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key"})
_PERMANENT_5XX = frozenset({501, 505})

# OpenTelemetry GenAI semantic conventions (client spans of model calls).
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"


def _misconfigured(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{tool}: {what}", retryable=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A model tool's connector config, read and checked (the key still a reference)."""

    dialect: Dialect
    base_url: str
    api_key: str
    allow: netguard.Allowlist
    listed: Destinations | None
    max_reply_bytes: int
    headers: Mapping[str, str]


def _headers(tool: str, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise _misconfigured(tool, "config.headers must map header names to strings")
    for name, value in raw.items():
        if name.lower() in _CREDENTIAL_HEADERS and not _KEY_REF.search(value):
            raise _misconfigured(
                tool, f"config.headers.{name} carries a credential: give it as ${{env:NAME}}"
            )
    return dict(raw)


def read_config(tool: str, config: Mapping[str, Any]) -> ModelConfig:
    """The config checked: a `ConnectorError` (never retried) names the first thing wrong."""
    endpoint = config.get("endpoint")
    dialect = DIALECTS.get(endpoint) if isinstance(endpoint, str) else None
    if dialect is None:
        raise _misconfigured(tool, f"config.endpoint must be one of {', '.join(DIALECTS)}")
    base_url = config.get("base_url")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise _misconfigured(tool, "config.base_url must be an http or https URL")
    api_key = config.get("api_key")
    if not isinstance(api_key, str) or not _KEY_REF.fullmatch(api_key):
        # Never echo it: it may be the key itself.
        raise _misconfigured(
            tool, "config.api_key must be a secret reference such as ${env:NAME}, never a key"
        )
    cap = config.get("max_reply_bytes", MAX_REPLY_BYTES)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
        raise _misconfigured(tool, "config.max_reply_bytes must be a positive number of bytes")
    return ModelConfig(
        dialect=dialect,
        base_url=base_url,
        api_key=api_key,
        allow=allowlist(tool, config),
        listed=destinations(tool, config),
        max_reply_bytes=cap,
        headers=_headers(tool, config.get("headers")),
    )


def read_request(tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The vendor request body from the call's arguments (`{"request": {...}}`)."""
    request = args.get("request")
    if not isinstance(request, Mapping):
        raise ConnectorError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{tool}: the arguments must be {{'request': <the model request body>}}",
            retryable=False,
        )
    if not isinstance(request.get("model"), str):
        raise ConnectorError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{tool}: the model request names no model",
            retryable=False,
        )
    return dict(request)


def _retry_after(headers: httpx2.Headers) -> float | None:
    millis = headers.get("retry-after-ms", "")
    try:
        if millis:
            return max(0.0, float(millis) / 1000)
    except ValueError:
        pass
    return parse_retry_after(headers.get("retry-after"))


def status_error(tool: str, status: int, headers: httpx2.Headers) -> ConnectorError:
    """The error for a status that is not a reply (the vendor's error text is never passed on:
    it may quote the key)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    said = f"{tool}: the model endpoint answered {status} {phrase}".rstrip()
    wait = _retry_after(headers)
    if 300 <= status < 400:
        return ConnectorError(
            ErrorCode.DOWNSTREAM_REJECTED,
            f"{said}, a redirect, which is not followed: set base_url to the final address",
            retryable=False,
        )
    if status == 429:
        return ConnectorError(ErrorCode.RATE_LIMITED, said, retry_after=wait, throttle=wait)
    if status == 408:
        return ConnectorError(ErrorCode.TIMEOUT, said, retryable=True, retry_after=wait)
    if status in (401, 403):
        return ConnectorError(ErrorCode.UNAUTHORIZED, said, retryable=False)
    if status >= 500 and status not in _PERMANENT_5XX:
        return ConnectorError(
            ErrorCode.DOWNSTREAM_UNAVAILABLE, said, retryable=True, retry_after=wait
        )
    return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False)


def _carried(exc: BaseException) -> ConnectorError | None:
    """A ConnectorError the transport raised, if an SDK wrapped it."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectorError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def classify(tool: str, exc: Exception) -> ConnectorError:
    """The ConnectorError for what an SDK call raised (by type and status only)."""
    carried = _carried(exc)
    if carried is not None:
        return carried
    if isinstance(exc, openai.APIStatusError | anthropic.APIStatusError):
        return status_error(tool, exc.status_code, exc.response.headers)
    if isinstance(exc, openai.APITimeoutError | anthropic.APITimeoutError):
        return ConnectorError(
            ErrorCode.TIMEOUT, f"{tool}: the model endpoint did not answer in time"
        )
    if isinstance(exc, openai.APIConnectionError | anthropic.APIConnectionError):
        return ConnectorError(
            ErrorCode.CONNECTION_ERROR, f"{tool}: could not reach the model endpoint"
        )
    return ConnectorError(
        ErrorCode.CONNECTOR_ERROR,
        f"{tool}: the model request could not be sent ({type(exc).__name__})",
        retryable=False,
    )


def read_reply(tool: str, dialect: Dialect, body: bytes) -> tuple[Any, Any]:
    """(the reply as JSON, the reply as the SDK type); refused when it is neither."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ConnectorError(
            ErrorCode.DOWNSTREAM_REJECTED,
            f"{tool}: the model's reply is not JSON; expected {dialect.type_name}",
            retryable=False,
        ) from None
    try:
        return data, dialect.validate(data)
    except pydantic.ValidationError:
        raise ConnectorError(
            ErrorCode.DOWNSTREAM_REJECTED,
            f"{tool}: the model's reply is not {dialect.type_name} "
            f"(what endpoint {dialect.kind} answers)",
            retryable=False,
        ) from None


class ModelConnector:
    """Sends one model request per call through the vendor's SDK; see the module docstring.

    Tool config: `endpoint` (`openai_chat`, `openai_responses` or `anthropic`); `base_url` (the
    SDK's: `https://api.openai.com/v1`, `https://api.anthropic.com`); `api_key` (`${env:NAME}`
    only); optional `allow_hosts` and `destinations` (as the http connector's), `headers`
    (extra; credential headers by reference only) and `max_reply_bytes` (default 4 MiB).
    Arguments: `{"request": <the vendor request body>}`; streaming is always off. Output:
    `{"endpoint", "reply" (validated as the SDK's ChatCompletion, Response or Message), "usage":
    {"input_tokens", "output_tokens", "cached_tokens"}, "finish"}` with finish `stop`,
    `tool_calls`, `length`, or the vendor's own word for anything else.

    `resolver` (for tests) replaces the system's getaddrinfo; `verify` the system's CAs.
    """

    name = "model"

    def __init__(
        self, *, resolver: Resolver | None = None, verify: ssl.SSLContext | None = None
    ) -> None:
        self._checker = HttpConnector(resolver=resolver, verify=verify)
        self._pools = Pools(verify=verify if verify is not None else True)

    async def start(self) -> None:
        """Nothing to open ahead: pools open per origin on first use."""

    async def close(self) -> None:
        """Close every pooled connection."""
        await self._pools.close()
        await self._checker.close()

    async def invoke(self, call: ToolCall) -> Any:
        """Send the call's model request (or its embed request); its output, or a classified
        ConnectorError."""
        config = read_config(call.tool, call.config)
        if is_embed(call.args):
            config = embeddings_config(call.tool, call.config, config, key_ref=_KEY_REF)
            request = read_embed_request(call.tool, call.args)
            dialect, operation = EMBEDDINGS, "embeddings"
        else:
            request = read_request(call.tool, call.args)
            dialect, operation = config.dialect, "chat"
        redact = Redactor(call.config)
        parent = parse_traceparent(call.traceparent)
        model = str(request["model"])
        with telemetry.span(
            f"{operation} {model}",
            trace_id=call.trace_id,
            parent_span_id=parent[1] if parent else None,
            kind=SpanKind.CLIENT,
            attributes={
                GEN_AI_SYSTEM: dialect.system,
                GEN_AI_PROVIDER: dialect.system,
                GEN_AI_OPERATION: operation,
                GEN_AI_REQUEST_MODEL: model,
            },
        ) as current:
            try:
                body = await self._send(call, config, dialect, request)
                if dialect is EMBEDDINGS:
                    return _embeddings_output(call.tool, model, body, request, current)
                return _chat_output(call.tool, config.dialect, body, current)
            except ConnectorError as error:
                error.message = redact(error.message)
                error.args = (error.message,)
                error.maybe_applied = False  # a model call changes nothing downstream
                telemetry.mark_error(current, error.code)
                raise

    async def _send(
        self, call: ToolCall, config: ModelConfig, dialect: Dialect, request: dict[str, Any]
    ) -> bytes:
        """The reply's body, as received (a ConnectorError for anything else)."""
        key = str(resolve_secrets(config.api_key))
        headers = dict(resolve_secrets(dict(config.headers)))
        guard = Guard(
            tool=call.tool,
            allow=config.allow,
            listed=config.listed,
            max_bytes=config.max_reply_bytes,
            connect_wait=min(call.timeout_s, CONNECT_TIMEOUT_CAP),
        )
        transport = GuardedTransport(self._pools, self._checker, guard)
        async with httpx2.AsyncClient(
            transport=transport, trust_env=False, follow_redirects=False
        ) as http:
            client = self._client(dialect, config, key, headers, http)
            try:
                return await send(dialect, client, request, tool=call.tool, wait_s=call.timeout_s)
            except ConnectorError as error:
                if not error.message.startswith(f"{call.tool}: "):
                    error.message = f"{call.tool}: {error.message}"
                raise
            except Exception as exc:
                raise classify(call.tool, exc) from None

    @staticmethod
    def _client(
        dialect: Dialect,
        config: ModelConfig,
        key: str,
        headers: dict[str, str],
        http: httpx2.AsyncClient,
    ) -> openai.AsyncOpenAI | anthropic.AsyncAnthropic:
        if dialect.system == "anthropic":
            return anthropic.AsyncAnthropic(
                api_key=key,
                base_url=config.base_url,
                max_retries=0,
                default_headers=headers,
                http_client=http,
                open_telemetry=False,  # our span is the model call's; the prompt goes in none
            )
        return openai.AsyncOpenAI(
            api_key=key,
            base_url=config.base_url,
            max_retries=0,
            default_headers=headers,
            http_client=http,
        )


def _chat_output(tool: str, dialect: Dialect, body: bytes, current: Span) -> dict[str, Any]:
    data, reply = read_reply(tool, dialect, body)
    usage = dialect.usage(reply)
    finish = dialect.finish(reply)
    current.set_attribute(GEN_AI_RESPONSE_MODEL, str(getattr(reply, "model", "")))
    current.set_attribute(GEN_AI_INPUT_TOKENS, usage.input_tokens)
    current.set_attribute(GEN_AI_OUTPUT_TOKENS, usage.output_tokens)
    current.set_attribute(GEN_AI_FINISH_REASONS, [finish])
    return {"endpoint": dialect.kind, "reply": data, "usage": usage.as_json(), "finish": finish}


def _embeddings_output(
    tool: str, model: str, body: bytes, request: Mapping[str, Any], current: Span
) -> dict[str, Any]:
    """`model` is the one asked for: entries are searched by it, whatever name the reply gives
    (a dated alias, say), which the span records."""
    reply, vectors = read_embeddings(tool, body, count=len(request["input"]))
    usage = EMBEDDINGS.usage(reply)
    current.set_attribute(GEN_AI_RESPONSE_MODEL, reply.model)
    current.set_attribute(GEN_AI_INPUT_TOKENS, usage.input_tokens)
    return {"model": model, "vectors": vectors, "usage": usage.as_json()}
