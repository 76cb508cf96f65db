"""The model connector's embeddings operation: texts in, vectors out, through an OpenAI-compatible
`POST {base_url}/embeddings`.

A step asks for it with the arguments `{"operation": "embed", "model": <embedding model>,
"input": [<text>, ...]}` (optionally `"dimensions"`); any other key rides along unsent, for the
caller's own bookkeeping (which entries the texts are). It takes the chat call's path: the openai
SDK's `embeddings.create` with its retries off, asking for `encoding_format: float` (the SDK would
otherwise ask for base64 and decode it itself, and the reply is read here as it was sent), the
SSRF-guarded transport, the reply cap, a GenAI client span (operation `embeddings`), and no
failure that says it may have been applied. The endpoint is the tool's own `base_url` and
`api_key`, or `config.embeddings` (`{base_url, api_key}`, the key by reference too) for a tool
whose chat endpoint has none: Anthropic's has no `/embeddings`, so there it must be given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pydantic
from openai.types import CreateEmbeddingResponse

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError
from agent_reach_connectors.model_dialects import Dialect, Usage

if TYPE_CHECKING:
    from agent_reach_connectors.model import ModelConfig

EMBED = "embed"
# One call embeds at most this many texts, each of at most this many characters: a memory's text
# is at most 1,000 characters, a run's input is cut by its caller. 64 vectors of 3,072 floats are
# about 4 MiB of JSON, the default reply cap.
MAX_INPUTS = 64
MAX_INPUT_CHARS = 8000
MAX_DIMENSIONS = 8192
MAX_MODEL_NAME = 128
_ARGS = f'{{"operation": "{EMBED}", "model": <name>, "input": [<text>, ...]}}'


def _usage(reply: CreateEmbeddingResponse) -> Usage:
    tokens = reply.usage.prompt_tokens if reply.usage is not None else 0
    return Usage(
        input_tokens=max(0, tokens) if isinstance(tokens, int) else 0,
        output_tokens=0,
        cached_tokens=0,
    )


EMBEDDINGS = Dialect(
    kind="openai_embeddings",
    system="openai",
    type_name="an OpenAI CreateEmbeddingResponse",
    reply_type=CreateEmbeddingResponse,
    method=lambda client: client.embeddings,
    usage=_usage,
    finish=lambda _reply: "stop",
)


def is_embed(args: Mapping[str, Any]) -> bool:
    """Whether a call's arguments ask for embeddings rather than a chat reply."""
    return args.get("operation") == EMBED


def _refused(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.INVALID_ARGUMENTS, f"{tool}: {what}", retryable=False)


def read_embed_request(tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """The `/embeddings` request body from an embed call's arguments (refused: never retried)."""
    model = args.get("model")
    if not isinstance(model, str) or not 0 < len(model) <= MAX_MODEL_NAME:
        raise _refused(tool, f"an embed call names its model: {_ARGS}")
    texts = args.get("input")
    if not isinstance(texts, list) or not 0 < len(texts) <= MAX_INPUTS:
        raise _refused(tool, f"an embed call's input is a list of 1 to {MAX_INPUTS} texts")
    for index, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise _refused(tool, f"input[{index}] must be a non-empty string")
        if len(text) > MAX_INPUT_CHARS:
            raise _refused(tool, f"input[{index}] is longer than {MAX_INPUT_CHARS} characters")
    body: dict[str, Any] = {"model": model, "input": list(texts), "encoding_format": "float"}
    dimensions = args.get("dimensions")
    if dimensions is not None:
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise _refused(tool, f"dimensions must be a number from 1 to {MAX_DIMENSIONS}")
        if not 0 < dimensions <= MAX_DIMENSIONS:
            raise _refused(tool, f"dimensions must be a number from 1 to {MAX_DIMENSIONS}")
        body["dimensions"] = dimensions
    return body


def embeddings_config(
    tool: str, config: Mapping[str, Any], chat: ModelConfig, *, key_ref: Any
) -> ModelConfig:
    """Where embeddings are asked for: `config.embeddings` when given, else the chat endpoint
    (refused for Anthropic's, which has none). `key_ref` is the pattern a key reference matches."""
    raw = config.get("embeddings")
    if raw is None:
        if chat.dialect.system != "openai":
            raise ConnectorError(
                ErrorCode.CONNECTOR_ERROR,
                f"{tool}: an {chat.dialect.system} endpoint has no /embeddings: set "
                "config.embeddings.base_url and config.embeddings.api_key",
                retryable=False,
            )
        return chat
    if not isinstance(raw, Mapping):
        raise _misconfigured(tool, "config.embeddings must be {base_url, api_key}")
    base_url = raw.get("base_url")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise _misconfigured(tool, "config.embeddings.base_url must be an http or https URL")
    api_key = raw.get("api_key", chat.api_key)
    if not isinstance(api_key, str) or not key_ref.fullmatch(api_key):
        raise _misconfigured(
            tool, "config.embeddings.api_key must be a secret reference such as ${env:NAME}"
        )
    return replace(chat, base_url=base_url, api_key=api_key)


def _misconfigured(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{tool}: {what}", retryable=False)


def _rejected(tool: str, what: str) -> ConnectorError:
    return ConnectorError(
        ErrorCode.DOWNSTREAM_REJECTED, f"{tool}: the embeddings reply {what}", retryable=False
    )


def read_embeddings(
    tool: str, body: bytes, *, count: int
) -> tuple[CreateEmbeddingResponse, list[list[float]]]:
    """(the reply as the SDK type, its vectors in input order); refused unless it holds one
    vector of finite numbers per input, all of one length."""
    try:
        reply = EMBEDDINGS.validate(json.loads(body))
    except (ValueError, UnicodeDecodeError, pydantic.ValidationError):
        raise _rejected(tool, f"is not {EMBEDDINGS.type_name}") from None
    by_index = {item.index: item.embedding for item in reply.data}
    if len(reply.data) != count or sorted(by_index) != list(range(count)):
        raise _rejected(tool, f"holds {len(reply.data)} vectors for {count} inputs")
    vectors = [by_index[i] for i in range(count)]
    sizes = {len(v) for v in vectors}
    if len(sizes) != 1 or not 0 < next(iter(sizes)) <= MAX_DIMENSIONS:
        raise _rejected(tool, f"holds vectors of sizes other than one size up to {MAX_DIMENSIONS}")
    # Python's json reads NaN and Infinity, which no JSON output may carry.
    if not all(math.isfinite(x) for v in vectors for x in v):
        raise _rejected(tool, "holds a number that is not finite")
    return reply, vectors
