"""The http, python and test connectors against real local servers."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, ToolCall, load_connectors, resolve_secrets
from agent_reach_connectors.http import HttpConnector, parse_retry_after
from agent_reach_connectors.python import PythonConnector
from agent_reach_connectors.testing import EchoConnector, ScriptConnector, SleepConnector
from tests.support.sink import Response, Sink

CANARY = "canary-7b1e5d"


def call(config: dict[str, Any], args: dict[str, Any] | None = None, **kw: Any) -> ToolCall:
    values: dict[str, Any] = {
        "tool": "t.tool",
        "task_id": "task",
        "step_id": "s1",
        "args": args or {},
        "config": config,
        "idempotency_key": "task:s1",
        "attempt": 1,
        "max_attempts": 3,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "timeout_s": 5.0,
    }
    values.update(kw)
    return ToolCall(**values)


@pytest.fixture
async def http():
    connector = HttpConnector()
    await connector.start()
    yield connector
    await connector.close()


@pytest.fixture
def sink():
    with Sink() as s:
        yield s


async def test_get_fills_placeholders_and_sends_the_rest_as_query(http, sink) -> None:
    sink.script("/orders/a%20b%2F1", [Response(json={"id": "x"})])
    out = await http.invoke(
        call(
            {"url": f"{sink.url}/orders/{{order_id}}"},
            {"order_id": "a b/1", "full": True, "q": "z"},
        )
    )
    assert out == {"id": "x"}
    [req] = sink.requests()
    assert req.method == "GET"
    assert req.query == {"full": ["true"], "q": ["z"]}
    assert req.headers["idempotency-key"] == "task:s1"
    assert req.headers["traceparent"].startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-")


async def test_post_sends_json_body_and_resolved_secret_header(http, sink, monkeypatch) -> None:
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    config = {
        "method": "POST",
        "url": f"{sink.url}/pay",
        "headers": {"Authorization": "Bearer ${env:SINK_TOKEN}"},
    }
    await http.invoke(call(config, {"amount": 5}))
    [req] = sink.requests("/pay")
    assert req.json() == {"amount": 5}
    assert req.headers["authorization"] == f"Bearer {CANARY}"


async def test_secret_never_in_error_messages(http, sink, monkeypatch) -> None:
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    sink.script("/fail", [Response(status=503)])
    config = {
        "url": f"{sink.url}/fail?token=${{env:SINK_TOKEN}}",
        "headers": {"X-Key": "${env:SINK_TOKEN}"},
    }
    with pytest.raises(ConnectorError) as info:
        await http.invoke(call(config))
    assert CANARY not in info.value.message
    assert CANARY not in str(info.value)
    monkeypatch.delenv("SINK_TOKEN")
    with pytest.raises(ConnectorError) as missing:
        await http.invoke(call(config))
    assert "SINK_TOKEN" in missing.value.message
    assert not missing.value.retryable


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (500, "downstream_unavailable", True),
        (502, "downstream_unavailable", True),
        (503, "downstream_unavailable", True),
        (504, "downstream_unavailable", True),
        (429, "rate_limited", True),
        (408, "timeout", True),
        (400, "downstream_rejected", False),
        (401, "unauthorized", False),
        (403, "unauthorized", False),
        (404, "not_found", False),
        (409, "downstream_rejected", False),
        (422, "downstream_rejected", False),
    ],
)
async def test_status_classification(http, sink, status: int, code: str, retryable: bool) -> None:
    sink.script("/x", [Response(status=status)])
    with pytest.raises(ConnectorError) as info:
        await http.invoke(call({"url": f"{sink.url}/x"}))
    assert (info.value.code, info.value.retryable) == (code, retryable)
    assert str(status) in info.value.message


async def test_retry_after_seconds_and_http_date(http, sink) -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    sink.script(
        "/x", [Response(status=429, retry_after=7), Response(status=503, retry_after=later)]
    )
    with pytest.raises(ConnectorError) as first:
        await http.invoke(call({"url": f"{sink.url}/x"}))
    assert first.value.retry_after == 7
    with pytest.raises(ConnectorError) as second:
        await http.invoke(call({"url": f"{sink.url}/x"}))
    assert 25 <= (second.value.retry_after or 0) <= 30
    assert parse_retry_after("soon") is None


async def test_read_timeout_may_have_applied(http, sink) -> None:
    sink.script("/slow", [Response(delay=1.0)])
    with pytest.raises(ConnectorError) as info:
        await http.invoke(call({"url": f"{sink.url}/slow", "timeout": 0.2}))
    assert info.value.code == "timeout"
    assert info.value.maybe_applied
    assert info.value.retryable


async def test_refused_connection_was_not_applied(http) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    with pytest.raises(ConnectorError) as info:
        await http.invoke(call({"url": f"http://127.0.0.1:{port}/x"}))
    assert info.value.code == "connection_error"
    assert not info.value.maybe_applied


async def test_connection_dropped_after_request_may_have_applied(http, sink) -> None:
    sink.script("/drop", [Response(drop=True)])
    with pytest.raises(ConnectorError) as info:
        await http.invoke(call({"method": "POST", "url": f"{sink.url}/drop"}, {"a": 1}))
    assert info.value.code == "connection_error"
    assert info.value.maybe_applied
    assert len(sink.requests("/drop")) == 1


async def test_missing_placeholder_argument(http, sink) -> None:
    with pytest.raises(ConnectorError) as info:
        await http.invoke(call({"url": f"{sink.url}/o/{{order_id}}"}))
    assert info.value.code == "invalid_arguments"
    assert "order_id" in info.value.message


async def test_non_json_answer_becomes_text(http, sink) -> None:
    out = await http.invoke(call({"url": f"{sink.url}/plain"}))
    assert out == {}  # the sink answers JSON by default
    sink.script("/plain", [Response(json="just text")])
    assert await http.invoke(call({"url": f"{sink.url}/plain"})) == "just text"


async def test_python_connector_sync_async_and_errors() -> None:
    py = PythonConnector()
    mod = "tests.connectors.sample_functions"
    assert await py.invoke(call({"function": f"{mod}:add"}, {"a": 2, "b": 3})) == {"sum": 5}
    assert await py.invoke(call({"function": f"{mod}:greet"}, {"name": "ann"})) == "hello ann"
    with pytest.raises(ConnectorError) as leak:
        await py.invoke(call({"function": f"{mod}:leaky"}))
    assert leak.value.code == "connector_error"
    assert "canary" not in leak.value.message
    assert "RuntimeError" in leak.value.message
    with pytest.raises(ConnectorError) as own:
        await py.invoke(call({"function": f"{mod}:classified"}))
    assert (own.value.code, own.value.retry_after, own.value.retryable) == ("rate_limited", 3, True)
    for config, code in [
        ({"function": f"{mod}:not_json"}, "connector_error"),
        ({"function": f"{mod}:NOT_CALLABLE"}, "connector_error"),
        ({"function": "no.such.module:f"}, "connector_error"),
        ({"function": "missing-colon"}, "connector_error"),
    ]:
        with pytest.raises(ConnectorError) as info:
            await py.invoke(call(config))
        assert info.value.code == code
    with pytest.raises(ConnectorError) as wrong_args:
        await py.invoke(call({"function": f"{mod}:add"}, {"a": 1}))
    assert wrong_args.value.code == "invalid_arguments"


async def test_testing_connectors() -> None:
    echo = await EchoConnector().invoke(call({}, {"x": 1}, attempt=2))
    assert echo == {"args": {"x": 1}, "attempt": 2, "idempotency_key": "task:s1"}
    assert await EchoConnector().invoke(call({"output": [1]})) == [1]
    assert await SleepConnector().invoke(call({}, {"seconds": 0.01})) == {"slept": 0.01}
    hang = asyncio.create_task(SleepConnector().invoke(call({}, {"seconds": 60})))
    await asyncio.sleep(0.01)
    hang.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hang
    script = {
        "outcomes": [
            "error:downstream_unavailable:retry_after=2",
            "timeout",
            "error:invalid_arguments",
            "ok",
        ]
    }
    errors = []
    for attempt in (1, 2, 3):
        with pytest.raises(ConnectorError) as info:
            await ScriptConnector().invoke(call(script, attempt=attempt))
        errors.append(
            (
                info.value.code,
                info.value.retryable,
                info.value.retry_after,
                info.value.maybe_applied,
            )
        )
    assert errors == [
        ("downstream_unavailable", True, 2.0, False),
        ("timeout", True, None, True),
        ("invalid_arguments", False, None, False),
    ]
    assert await ScriptConnector().invoke(call(script, attempt=9)) == {"attempt": 9}


def test_load_connectors_and_secret_resolution() -> None:
    found = load_connectors()
    assert {"http", "python", "echo", "sleep", "script"} <= set(found)
    with pytest.raises(LookupError):
        load_connectors(["nope"])
    env = {"A": "1"}
    assert resolve_secrets({"x": ["${env:A}-${env:A}", 3]}, env) == {"x": ["1-1", 3]}
