"""The model connector against the scripted model server on 127.0.0.1, through the vendors' SDKs.

Each endpoint kind's round trip, each misbehaviour of a hostile model endpoint classified, the
SSRF guard, no SDK retries, and the API key in no error. The scripted replies are checked against
the SDKs' own types first, so a test here never passes on a reply a real vendor could not send.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from agent_reach.errors import ErrorCode
from agent_reach_connectors import ConnectorError
from agent_reach_connectors.model import ModelConnector
from tests.connectors.support import TRACEPARENT, tool_call
from tests.support.models import (
    CHAT,
    MESSAGES,
    RENDER,
    RESPONSES,
    Reply,
    ScriptedModels,
    Usage,
    answer,
    call_tools,
    cut_call,
    failure,
    gzip_bomb,
    in_dialect,
    oversized,
    redirect,
)
from tests.support.otlp import OtlpReceiver
from tests.support.server import free_port

KEY = "sk-canary-7d3f9e1b42a8"  # distinctive: it must never show up in an error
SDK_TYPES: dict[str, Any] = {
    "openai_chat": ChatCompletion,
    "openai_responses": Response,
    "anthropic": Message,
}
PATHS = {"openai_chat": CHAT, "openai_responses": RESPONSES, "anthropic": MESSAGES}
KINDS = list(PATHS)
ROOT = Path(__file__).resolve().parents[2]
GEN_AI_OPERATION = "gen_ai.operation.name"


def request_for(kind: str, **extra: Any) -> dict[str, Any]:
    """A minimal vendor request body, as the controller builds one."""
    if kind == "openai_responses":
        return {"model": "gpt-test", "input": "add 2 and 3", **extra}
    body = {"model": "m-test", "messages": [{"role": "user", "content": "add 2 and 3"}], **extra}
    if kind == "anthropic":
        body["max_tokens"] = 256
    return body


def config_for(kind: str, models: ScriptedModels, **extra: Any) -> dict[str, Any]:
    base = models.root if kind == "anthropic" else models.url
    return {
        "endpoint": kind,
        "base_url": base,
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
    with ScriptedModels(getattr(request, "param", [])) as server:
        yield server


async def invoke(
    connector: ModelConnector,
    kind: str,
    models: ScriptedModels,
    body: dict[str, Any] | None = None,
    **config: Any,
) -> Any:
    call = tool_call(
        tool="model.main",
        config=config_for(kind, models, **config),
        args={"request": body or request_for(kind)},
    )
    return await connector.invoke(call)


async def failed(
    connector: ModelConnector,
    kind: str,
    models: ScriptedModels,
    body: dict[str, Any] | None = None,
    **config: Any,
) -> ConnectorError:
    with pytest.raises(ConnectorError) as caught:
        await invoke(connector, kind, models, body, **config)
    error = caught.value
    assert KEY not in f"{error} {error!r} {error.message} {error.args}"
    assert error.maybe_applied is False  # a model call has no side effect
    return error


# -- the scripted server speaks the SDKs' types ------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "reply",
    [
        answer("5"),
        call_tools([("calc_add", {"a": 2, "b": 3})], usage=Usage(input=40, output=7, cached=8)),
        cut_call("calc_add", '{"a": 2, "b'),
        Reply(calls=(("calc_add", "not json at all"),)),
        call_tools([("calc_add", {"a": i}) for i in range(1000)]),
    ],
    ids=["answer", "calls", "cut", "not-json", "many"],
)
def test_every_scripted_reply_validates_as_the_sdk_type(kind: str, reply: Reply) -> None:
    SDK_TYPES[kind].model_validate(RENDER[kind](reply, "m-test"))


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "models",
    [[call_tools([("calc_add", {"a": 2, "b": 3})], usage=Usage(input=40, output=7, cached=8))]],
    indirect=True,
)
@pytest.mark.parametrize("kind", KINDS)
async def test_round_trip_calls_tools(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    output = await invoke(connector, kind, models)

    assert set(output) == {"endpoint", "reply", "usage", "finish"}
    assert output["endpoint"] == kind
    assert output["finish"] == "tool_calls"
    assert output["usage"] == {"input_tokens": 40, "output_tokens": 7, "cached_tokens": 8}
    SDK_TYPES[kind].model_validate(output["reply"])
    json.dumps(output)  # JSON, as a step's output must be
    assert models.count(PATHS[kind]) == 1
    sent = models.requests[0][1]
    assert sent["model"] in ("m-test", "gpt-test")
    assert sent.get("stream") in (None, False)
    headers = models.headers_seen[0]
    assert KEY in headers.get("authorization", "") + headers.get("x-api-key", "")


@pytest.mark.parametrize("models", [[answer("five")]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_round_trip_answers(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    output = await invoke(connector, kind, models, request_for(kind, stream=True))

    assert output["finish"] == "stop"
    assert output["usage"] == {"input_tokens": 10, "output_tokens": 5, "cached_tokens": 0}
    assert "five" in json.dumps(output["reply"])
    assert models.requests[0][1].get("stream") in (None, False)  # streaming is forced off


@pytest.mark.parametrize("models", [[answer("hi")]], indirect=True)
async def test_extra_headers_are_sent(connector: ModelConnector, models: ScriptedModels) -> None:
    await invoke(connector, "openai_chat", models, headers={"X-Team": "agents"})

    assert models.headers_seen[0]["x-team"] == "agents"


# -- a hostile model endpoint ----------------------------------------------------------------


@pytest.mark.parametrize("models", [[failure(429, retry_after="7")]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_429_is_rate_limited_with_retry_after(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    error = await failed(connector, kind, models)

    assert error.code == ErrorCode.RATE_LIMITED
    assert error.retryable is True
    assert error.retry_after == 7.0
    assert models.count() == 1


@pytest.mark.parametrize("models", [[failure(500)]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_500_is_retryable_and_the_sdk_does_not_retry(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    error = await failed(connector, kind, models)

    assert error.code == ErrorCode.DOWNSTREAM_UNAVAILABLE
    assert error.retryable is True
    assert models.count() == 1  # the executor's policy retries, never the SDK


@pytest.mark.parametrize(
    ("models", "code"),
    [
        ([failure(401)], ErrorCode.UNAUTHORIZED),
        ([failure(403)], ErrorCode.UNAUTHORIZED),
        ([failure(400)], ErrorCode.DOWNSTREAM_REJECTED),
        ([failure(404)], ErrorCode.DOWNSTREAM_REJECTED),
    ],
    indirect=["models"],
)
async def test_client_errors_are_not_retried(
    connector: ModelConnector, models: ScriptedModels, code: ErrorCode
) -> None:
    error = await failed(connector, "anthropic", models)

    assert error.code == code
    assert error.retryable is False


@pytest.mark.parametrize("kind", KINDS)
async def test_redirects_are_refused_not_followed(connector: ModelConnector, kind: str) -> None:
    with ScriptedModels([]) as models:
        models.script.append(redirect(f"{models.url}/elsewhere"))  # type: ignore[union-attr]
        error = await failed(connector, kind, models)

        assert error.retryable is False
        assert "redirect" in error.message
        assert models.count() == 1  # the Location was never asked for


@pytest.mark.parametrize("models", [[oversized(200_000)]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_reply_over_the_cap_fails(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    error = await failed(connector, kind, models, max_reply_bytes=64 * 1024)

    assert error.retryable is False
    assert "64 KiB" in error.message


@pytest.mark.parametrize("models", [[gzip_bomb(16 * 1024 * 1024)]], indirect=True)
async def test_a_gzip_reply_that_inflates_past_the_cap_fails(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    error = await failed(connector, "openai_chat", models, max_reply_bytes=1024 * 1024)

    assert error.retryable is False
    assert "1 MiB" in error.message


@pytest.mark.parametrize("models", [[Reply(text="small", gzip=True)]], indirect=True)
async def test_a_gzip_reply_under_the_cap_is_read(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    output = await invoke(connector, "openai_chat", models)

    assert output["reply"]["choices"][0]["message"]["content"] == "small"


@pytest.mark.parametrize(
    ("kind", "other", "expected"),
    [
        ("openai_chat", "anthropic", "ChatCompletion"),
        ("openai_responses", "openai_chat", "Response"),
        ("anthropic", "openai_responses", "Message"),
    ],
)
async def test_a_reply_in_another_dialect_is_refused(
    connector: ModelConnector, kind: str, other: str, expected: str
) -> None:
    with ScriptedModels([in_dialect(other, answer("hi"))]) as models:
        error = await failed(connector, kind, models)

    assert error.retryable is False
    assert expected in error.message


@pytest.mark.parametrize("models", [[Reply(raw=b"<html>upstream oops</html>")]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_reply_that_is_not_json_is_refused(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    error = await failed(connector, kind, models)

    assert error.retryable is False
    assert "JSON" in error.message


@pytest.mark.parametrize(
    "models",
    [[call_tools([("calc_add", {"a": 1})], usage=Usage(input=-5, output=10**12, cached=3))]],
    indirect=True,
)
async def test_usage_is_recorded_as_said_never_negative(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    output = await invoke(connector, "openai_chat", models)

    # The budget also counts what was sent (the controller's part): here it is only recorded.
    assert output["usage"] == {"input_tokens": 0, "output_tokens": 10**12, "cached_tokens": 3}


@pytest.mark.parametrize(
    "models", [[call_tools([("calc_add", {"a": i}) for i in range(1000)])]], indirect=True
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_thousand_tool_calls_come_back_whole(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    output = await invoke(connector, kind, models)

    assert output["finish"] == "tool_calls"
    assert json.dumps(output["reply"]).count("calc_add") == 1000  # capping is the intake's


@pytest.mark.parametrize("models", [[cut_call("calc_add", '{"a": 2, "b')]], indirect=True)
@pytest.mark.parametrize("kind", ["openai_chat", "openai_responses"])
async def test_a_cut_tool_call_finishes_length(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    output = await invoke(connector, kind, models)

    assert output["finish"] == "length"
    assert '{\\"a\\": 2, \\"b' in json.dumps(output["reply"])


@pytest.mark.parametrize("models", [[cut_call("calc_add", '{"a": 2')]], indirect=True)
async def test_anthropic_max_tokens_finishes_length(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    output = await invoke(connector, "anthropic", models)

    assert output["finish"] == "length"


@pytest.mark.parametrize("models", [[Reply(calls=(("calc_add", "not json"),))]], indirect=True)
async def test_arguments_that_are_not_json_are_passed_on(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    output = await invoke(connector, "openai_chat", models)

    call = output["reply"]["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == "not json"  # the intake tells the model


# -- where a call may go, and the key ------------------------------------------------------------


@pytest.mark.parametrize("models", [[answer("never")]], indirect=True)
@pytest.mark.parametrize("kind", KINDS)
async def test_loopback_is_refused_without_allow_hosts(
    connector: ModelConnector, models: ScriptedModels, kind: str
) -> None:
    error = await failed(connector, kind, models, allow_hosts=[])

    assert error.code == ErrorCode.DESTINATION_REFUSED
    assert error.retryable is False
    assert models.count() == 0


@pytest.mark.parametrize("models", [[answer("never")]], indirect=True)
async def test_a_host_not_in_destinations_is_refused(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    error = await failed(connector, "openai_chat", models, destinations=["api.example.com"])

    assert error.code == ErrorCode.DESTINATION_REFUSED
    assert models.count() == 0


async def test_a_connection_refused_is_retryable(connector: ModelConnector) -> None:
    call = tool_call(
        tool="model.main",
        config={
            "endpoint": "openai_chat",
            "base_url": f"http://127.0.0.1:{free_port()}/v1",
            "api_key": "${env:MODEL_KEY}",
            "allow_hosts": ["127.0.0.1"],
        },
        args={"request": request_for("openai_chat")},
    )
    with pytest.raises(ConnectorError) as caught:
        await connector.invoke(call)

    assert caught.value.code == ErrorCode.CONNECTION_ERROR
    assert caught.value.retryable is True
    assert caught.value.maybe_applied is False
    assert KEY not in repr(caught.value)


@pytest.mark.parametrize("models", [[answer("never")]], indirect=True)
async def test_a_plain_api_key_is_refused(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    with pytest.raises(ConnectorError) as caught:
        await invoke(connector, "openai_chat", models, api_key=KEY)

    assert caught.value.retryable is False
    assert "${env:" in caught.value.message
    assert KEY not in f"{caught.value!r} {caught.value}"
    assert models.count() == 0


@pytest.mark.parametrize("models", [[answer("never")]], indirect=True)
async def test_an_unset_key_is_named_not_shown(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    with pytest.raises(ConnectorError) as caught:
        await invoke(connector, "openai_chat", models, api_key="${env:NO_SUCH_MODEL_KEY}")

    assert "NO_SUCH_MODEL_KEY" in caught.value.message
    assert models.count() == 0


@pytest.mark.parametrize(
    ("config", "args"),
    [
        ({"endpoint": "gemini"}, None),
        ({"base_url": "ftp://127.0.0.1/v1"}, None),
        ({"max_reply_bytes": "big"}, None),
        ({}, {"request": "not an object"}),
        ({}, {}),
    ],
)
async def test_a_bad_config_or_request_is_refused(
    connector: ModelConnector, config: dict[str, Any], args: dict[str, Any] | None
) -> None:
    with ScriptedModels([answer("never")]) as models:
        call = tool_call(
            tool="model.main",
            config={**config_for("openai_chat", models), **config},
            args=args if args is not None else {"request": request_for("openai_chat")},
        )
        with pytest.raises(ConnectorError) as caught:
            await connector.invoke(call)

        assert caught.value.retryable is False
        assert caught.value.message.startswith("model.main: ")
        assert models.count() == 0


@pytest.mark.parametrize("models", [[answer("never")]], indirect=True)
async def test_anthropic_without_max_tokens_is_refused_before_sending(
    connector: ModelConnector, models: ScriptedModels
) -> None:
    body = request_for("anthropic")
    del body["max_tokens"]
    error = await failed(connector, "anthropic", models, body=body)

    assert "max_tokens" in error.message
    assert models.count() == 0


# -- tracing -------------------------------------------------------------------------------------

TRACED_PROCESS = """
import asyncio, os
from agent_reach import telemetry
from agent_reach_connectors.model import ModelConnector
from tests.connectors.support import TRACEPARENT, tool_call

assert telemetry.configure_tracing("model-test")
async def main():
    connector = ModelConnector()
    config = {"endpoint": "openai_chat", "base_url": os.environ["MODELS_URL"],
              "api_key": "${env:MODEL_KEY}", "allow_hosts": ["127.0.0.1"]}
    request = {"model": "m-test", "messages": [{"role": "user", "content": "secret-prompt-91"}]}
    for _ in range(2):
        try:
            await connector.invoke(tool_call(tool="model.main", config=config,
                                             args={"request": request}))
        except Exception:
            pass
    await connector.close()
asyncio.run(main())
telemetry.flush_tracing()
"""


def test_model_calls_are_genai_client_spans_without_prompt_or_key() -> None:
    script = [call_tools([("calc_add", {"a": 1})], usage=Usage(input=12, output=3)), failure(500)]
    with ScriptedModels(script) as models, OtlpReceiver() as otlp:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "MODELS_URL": models.url,
            "MODEL_KEY": KEY,
        }
        subprocess.run(
            [sys.executable, "-c", TRACED_PROCESS], env=env, check=True, timeout=60, cwd=ROOT
        )
        spans = [s for s in otlp.spans() if s.name == "chat m-test"]

    assert len(spans) == 2
    ok, failed_span = spans
    assert ok.kind == "client"
    assert ok.parent_span_id == TRACEPARENT.split("-")[2]
    assert ok.attributes[GEN_AI_OPERATION] == "chat"
    assert ok.attributes["gen_ai.provider.name"] == "openai"
    assert ok.attributes["gen_ai.request.model"] == "m-test"
    assert ok.attributes["gen_ai.response.model"] == "m-test"
    assert ok.attributes["gen_ai.usage.input_tokens"] == 12
    assert ok.attributes["gen_ai.usage.output_tokens"] == 3
    assert list(ok.attributes["gen_ai.response.finish_reasons"]) == ["tool_calls"]
    assert failed_span.attributes["error.type"] == ErrorCode.DOWNSTREAM_UNAVAILABLE
    assert KEY not in repr(spans)
    assert "secret-prompt-91" not in repr(spans)
