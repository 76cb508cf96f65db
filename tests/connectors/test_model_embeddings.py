"""The model connector's embeddings operation against the scripted model server on 127.0.0.1:
the round trip through the openai SDK, what a step must say, a hostile endpoint's replies
refused or classified, the SSRF guard, the key in no error, and its GenAI span."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types import CreateEmbeddingResponse

from agent_reach.errors import ErrorCode
from agent_reach_connectors import ConnectorError
from agent_reach_connectors.model import ModelConnector
from agent_reach_connectors.model_embeddings import MAX_INPUTS
from tests.connectors.support import tool_call
from tests.support.models import (
    EMBED_DIMENSIONS,
    EMBEDDINGS,
    Reply,
    ScriptedModels,
    answer,
    embed,
    embeddings_reply,
    failure,
)
from tests.support.otlp import OtlpReceiver

KEY = "sk-canary-embed-5b7e0c2d91"
ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Prefers email over phone calls", "Lives in Wuhan", "Allergic to peanuts"]


def embed_args(texts: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """What a step says to embed: the operation, the embedding model, the texts."""
    return {"operation": "embed", "model": "embed-test", "input": texts or TEXTS, **extra}


def config_for(models: ScriptedModels, **extra: Any) -> dict[str, Any]:
    return {
        "endpoint": "openai_chat",
        "base_url": models.url,
        "api_key": "${env:MODEL_KEY}",
        "allow_hosts": ["127.0.0.1"],
        **extra,
    }


@pytest.fixture(autouse=True)
def model_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_KEY", KEY)


@pytest.fixture
async def connector() -> Any:
    made = ModelConnector()
    await made.start()
    yield made
    await made.close()


@pytest.fixture
def models(request: pytest.FixtureRequest) -> Iterator[ScriptedModels]:
    with ScriptedModels(
        [answer("the chat reply")], embed_script=getattr(request, "param", [])
    ) as m:
        yield m


async def embedded(connector: ModelConnector, models: ScriptedModels, **config: Any) -> Any:
    call = tool_call(tool="model.main", config=config_for(models, **config), args=embed_args())
    return await connector.invoke(call)


async def failed(
    connector: ModelConnector,
    models: ScriptedModels,
    args: dict[str, Any] | None = None,
    **config: Any,
) -> ConnectorError:
    call = tool_call(
        tool="model.main", config=config_for(models, **config), args=args or embed_args()
    )
    with pytest.raises(ConnectorError) as caught:
        await connector.invoke(call)
    error = caught.value
    assert KEY not in f"{error} {error!r} {error.message} {error.args}"
    assert error.maybe_applied is False  # an embeddings call changes nothing downstream
    assert error.message.startswith("model.main: ")
    return error


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


# -- the scripted embedder ---------------------------------------------------------------------


def test_the_scripted_embedder_speaks_the_sdk_type_and_is_deterministic() -> None:
    reply = CreateEmbeddingResponse.model_validate(embeddings_reply({"model": "m", "input": TEXTS}))
    assert [len(d.embedding) for d in reply.data] == [EMBED_DIMENSIONS] * 3
    assert embed("Lives in Wuhan") == embed("lives   in WUHAN")
    assert math.isclose(sum(x * x for x in embed("Lives in Wuhan")), 1.0)
    near = cosine(embed("the user lives in Wuhan"), embed("Lives in Wuhan, China"))
    far = cosine(embed("the user lives in Wuhan"), embed("Allergic to peanuts"))
    assert near > far


# -- the round trip ----------------------------------------------------------------------------


async def test_texts_come_back_as_vectors_in_order(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    output = await embedded(connector, models)

    assert set(output) == {"model", "vectors", "usage"}
    assert output["model"] == "embed-test"
    assert output["vectors"] == [pytest.approx(embed(t)) for t in TEXTS]
    assert output["usage"] == {"input_tokens": 11, "output_tokens": 0, "cached_tokens": 0}
    json.dumps(output)  # JSON, as a step's output must be
    assert models.count(EMBEDDINGS) == 1
    sent = models.requests[0][1]
    assert sent == {"model": "embed-test", "input": TEXTS, "encoding_format": "float"}
    assert KEY in models.headers_seen[0]["authorization"]
    assert models.script == [answer("the chat reply")]  # a run's chat script is untouched


async def test_dimensions_are_passed_and_other_keys_are_not_sent(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    args = embed_args(["Lives in Wuhan"], dimensions=16, memory_ids=["m1"])
    call = tool_call(tool="model.main", config=config_for(models), args=args)
    output = await connector.invoke(call)

    assert len(output["vectors"][0]) == 16
    assert models.requests[0][1] == {
        "model": "embed-test",
        "input": ["Lives in Wuhan"],
        "encoding_format": "float",
        "dimensions": 16,
    }


# -- a hostile endpoint -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "code", "retryable"),
    [
        ([failure(429, retry_after="3")], ErrorCode.RATE_LIMITED, True),
        ([failure(500)], ErrorCode.DOWNSTREAM_UNAVAILABLE, True),
        ([failure(401)], ErrorCode.UNAUTHORIZED, False),
        ([failure(404)], ErrorCode.DOWNSTREAM_REJECTED, False),
    ],
    indirect=["models"],
)
async def test_statuses_are_classified_and_the_sdk_does_not_retry(
    connector: ModelConnector, models: ScriptedModels, code: ErrorCode, retryable: bool
) -> None:
    error = await failed(connector, models)

    assert (error.code, error.retryable) == (code, retryable)
    assert models.count(EMBEDDINGS) == 1  # the executor's policy retries, never the SDK


def _raw(data: Any) -> Reply:
    return Reply(raw=json.dumps(data).encode() if not isinstance(data, bytes) else data)


def _reply_with(vectors: list[list[float]]) -> dict[str, Any]:
    reply = embeddings_reply({"model": "m", "input": ["x"] * len(vectors)})
    for item, vector in zip(reply["data"], vectors, strict=True):
        item["embedding"] = vector
    return reply


@pytest.mark.parametrize(
    ("models", "said"),
    [
        ([_raw(b"<html>oops</html>")], "is not an OpenAI CreateEmbeddingResponse"),
        ([_raw({"object": "chat.completion"})], "is not an OpenAI CreateEmbeddingResponse"),
        ([_raw(_reply_with([[1.0], [1.0]]))], "holds 2 vectors for 3 inputs"),
        ([_raw(_reply_with([[1.0], [1.0, 0.0], [1.0]]))], "sizes"),
        ([_raw(_reply_with([[]] * 3))], "sizes"),
        (
            [
                Reply(
                    raw=b'{"object": "list", "model": "m", "usage": {"prompt_tokens": 1, '
                    b'"total_tokens": 1}, "data": ['
                    b'{"object": "embedding", "index": 0, "embedding": [NaN]},'
                    b'{"object": "embedding", "index": 1, "embedding": [1.0]},'
                    b'{"object": "embedding", "index": 2, "embedding": [Infinity]}]}'
                )
            ],
            "not finite",
        ),
    ],
    indirect=["models"],
    ids=["html", "chat", "count", "ragged", "empty", "nan"],
)
async def test_a_reply_that_is_not_one_vector_per_text_is_refused(
    connector: ModelConnector, models: ScriptedModels, said: str
) -> None:
    error = await failed(connector, models)

    assert error.code == ErrorCode.DOWNSTREAM_REJECTED
    assert error.retryable is False
    assert said in error.message


@pytest.mark.parametrize("models", [[Reply(gzip=True)]], indirect=True)
async def test_a_gzip_reply_is_read(connector: ModelConnector, models: ScriptedModels) -> None:
    output = await embedded(connector, models)

    assert output["vectors"][1] == pytest.approx(embed(TEXTS[1]))


async def test_a_reply_over_the_cap_fails(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    texts = [f"text number {i}" for i in range(MAX_INPUTS)]
    error = await failed(connector, models, embed_args(texts), max_reply_bytes=16 * 1024)

    assert error.retryable is False
    assert "16 KiB" in error.message


# -- what a step must say ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"operation": "embed", "input": ["x"]}, "names its model"),
        (embed_args(model=""), "names its model"),
        (embed_args(input="one text"), "a list of 1 to 64 texts"),
        (embed_args(input=[]), "a list of 1 to 64 texts"),
        (embed_args(input=["x"] * (MAX_INPUTS + 1)), "a list of 1 to 64 texts"),
        (embed_args(input=["ok", "  "]), "input[1] must be a non-empty string"),
        (embed_args(input=["ok", 5]), "input[1] must be a non-empty string"),
        (embed_args(input=["x" * 8001]), "input[0] is longer than 8000 characters"),
        (embed_args(dimensions=True), "dimensions"),
        (embed_args(dimensions=0), "dimensions"),
    ],
    ids=[
        "no-model",
        "empty-model",
        "string",
        "none",
        "too-many",
        "blank",
        "number",
        "long",
        "dims-bool",
        "dims-zero",
    ],
)
async def test_bad_arguments_are_refused_before_sending(
    connector: ModelConnector, models: ScriptedModels, args: dict[str, Any], said: str
) -> None:
    error = await failed(connector, models, args)

    assert error.code == ErrorCode.INVALID_ARGUMENTS
    assert error.retryable is False
    assert said in error.message
    assert models.count() == 0


async def test_loopback_is_refused_without_allow_hosts(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    error = await failed(connector, models, allow_hosts=[])

    assert error.code == ErrorCode.DESTINATION_REFUSED
    assert models.count() == 0


async def test_an_anthropic_tool_embeds_only_where_its_config_says(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    anthropic = {"endpoint": "anthropic", "base_url": models.root}
    error = await failed(connector, models, **anthropic)
    assert "config.embeddings" in error.message
    assert models.count() == 0

    plain = await failed(
        connector, models, **anthropic, embeddings={"base_url": models.url, "api_key": KEY}
    )
    assert "${env:" in plain.message
    assert models.count() == 0

    output = await embedded(connector, models, **anthropic, embeddings={"base_url": models.url})
    assert len(output["vectors"]) == 3
    assert KEY in models.headers_seen[0]["authorization"]  # the tool's key, by reference


# -- tracing -------------------------------------------------------------------------------------

TRACED_PROCESS = """
import asyncio, os
from agent_reach import telemetry
from agent_reach_connectors.model import ModelConnector
from tests.connectors.support import tool_call

assert telemetry.configure_tracing("model-test")
async def main():
    connector = ModelConnector()
    config = {"endpoint": "openai_chat", "base_url": os.environ["MODELS_URL"],
              "api_key": "${env:MODEL_KEY}", "allow_hosts": ["127.0.0.1"]}
    args = {"operation": "embed", "model": "embed-test", "input": ["secret-text-42 here"]}
    for _ in range(2):
        try:
            await connector.invoke(tool_call(tool="model.main", config=config, args=args))
        except Exception:
            pass
    await connector.close()
asyncio.run(main())
telemetry.flush_tracing()
"""


def test_embeddings_are_genai_client_spans_without_text_or_key() -> None:
    with ScriptedModels(embed_script=[Reply(), failure(503)]) as models, OtlpReceiver() as otlp:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "MODELS_URL": models.url}
        env["MODEL_KEY"] = KEY
        subprocess.run(
            [sys.executable, "-c", TRACED_PROCESS], env=env, check=True, timeout=60, cwd=ROOT
        )
        spans = [s for s in otlp.spans() if s.name == "embeddings embed-test"]

    assert len(spans) == 2
    ok, failed_span = spans
    assert ok.kind == "client"
    assert ok.attributes["gen_ai.operation.name"] == "embeddings"
    assert ok.attributes["gen_ai.provider.name"] == "openai"
    assert ok.attributes["gen_ai.request.model"] == "embed-test"
    assert ok.attributes["gen_ai.response.model"] == "embed-test"
    assert ok.attributes["gen_ai.usage.input_tokens"] == 2
    assert failed_span.attributes["error.type"] == ErrorCode.DOWNSTREAM_UNAVAILABLE
    assert KEY not in repr(spans)
    assert "secret-text-42" not in repr(spans)
