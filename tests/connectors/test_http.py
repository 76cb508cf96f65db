"""The http connector against a real local sink: requests, classification, ambiguity, secrets."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, Throttled, ToolCall
from agent_reach_connectors.http import MAX_TEXT, HttpConnector
from agent_reach_connectors.throttling import parse_retry_after, quota_reset
from tests.support.server import free_port
from tests.support.sink import Response, Sink

CANARY = "canary-7b1e5d"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# Every downstream here is on 127.0.0.1, which the SSRF guard refuses unless a tool allows it.
LOCAL = ["127.0.0.1"]


def call(config: dict[str, Any], args: dict[str, Any] | None = None, **kw: Any) -> ToolCall:
    """A call of a tool whose config allows 127.0.0.1 (unless it says its own allow_hosts)."""
    values: dict[str, Any] = {
        "tool": "order.query",
        "task_id": "task",
        "step_id": "s1",
        "args": args or {},
        "config": {"allow_hosts": LOCAL, **config},
        "idempotency_key": "task:s1",
        "attempt": 1,
        "max_attempts": 3,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "traceparent": TRACEPARENT,
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


async def failure(http: HttpConnector, tool_call: ToolCall) -> ConnectorError:
    with pytest.raises(ConnectorError) as info:
        await http.invoke(tool_call)
    return info.value


@contextmanager
def full_backlog() -> Iterator[int]:
    """A port whose accept queue is full, so new connections hang until they time out."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.05)
    try:
        yield port
    finally:
        for s in [*fillers, listener]:
            s.close()


# Requests -----------------------------------------------------------------------------------


async def test_placeholders_are_filled_and_url_encoded(http, sink) -> None:
    args = {"order_id": "a b/1?x=#", "n": 7, "full": True, "q": "z"}
    await http.invoke(call({"url": f"{sink.url}/orders/{{order_id}}/{{n}}"}, args))
    [req] = sink.requests()
    assert req.path == "/orders/a%20b%2F1%3Fx%3D%23/7"
    assert req.query == {"full": ["true"], "q": ["z"]}


async def test_argument_escapes_reach_the_server_as_sent(http, sink) -> None:
    # ";", "=", "&" and "," mean something in a path to some servers (matrix parameters): an
    # argument's escaped form is never decoded on the way.
    await http.invoke(call({"url": f"{sink.url}/o/{{id}}"}, {"id": "a;b=c&d,e+f"}))
    [req] = sink.requests()
    assert req.path == "/o/a%3Bb%3Dc%26d%2Ce%2Bf"


async def test_a_configured_url_is_encoded_only_where_it_must_be(http, sink) -> None:
    await http.invoke(call({"url": f"{sink.url}/a b/\u00e9/%3B?x=1 2"}))
    [req] = sink.requests()
    assert req.path == "/a%20b/%C3%A9/%3B"
    assert req.query == {"x": ["1 2"]}


@pytest.mark.parametrize("args", [{}, {"order_id": None}, {"other": 1}])
async def test_missing_placeholder_argument_is_invalid(http, sink, args) -> None:
    error = await failure(http, call({"url": f"{sink.url}/o/{{order_id}}"}, args))
    assert (error.code, error.retryable) == ("invalid_arguments", False)
    assert "'order_id'" in error.message
    assert sink.requests() == []


async def test_get_sends_unused_args_as_query_merged_with_config_query(http, sink) -> None:
    config = {"url": f"{sink.url}/search", "query": {"page": 2, "lang": "en"}}
    await http.invoke(call(config, {"q": "rain", "tags": ["a", "b"], "skip": None}))
    [req] = sink.requests("/search")
    assert (req.method, req.body) == ("GET", b"")
    assert req.query == {"page": ["2"], "lang": ["en"], "q": ["rain"], "tags": ['["a","b"]']}


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "post"])
async def test_write_methods_send_unused_args_as_json_body(http, sink, method) -> None:
    config = {"method": method, "url": f"{sink.url}/orders/{{id}}"}
    await http.invoke(call(config, {"id": "o1", "amount": 5, "note": {"x": [1]}}))
    [req] = sink.requests("/orders/o1")
    assert req.method == method.upper()
    assert req.json() == {"amount": 5, "note": {"x": [1]}}
    assert req.headers["content-type"] == "application/json"
    assert req.query == {}


async def test_body_modes_none_and_json(http, sink) -> None:
    await http.invoke(call({"method": "POST", "url": f"{sink.url}/a", "body": "none"}, {"x": 1}))
    await http.invoke(call({"url": f"{sink.url}/b", "body": "json"}, {"x": 1}))
    [none], [json_get] = sink.requests("/a"), sink.requests("/b")
    assert (none.body, none.query) == (b"", {})
    assert (json_get.method, json_get.json(), json_get.query) == ("GET", {"x": 1}, {})


async def test_head_request(http, sink) -> None:
    out = await http.invoke(call({"method": "HEAD", "url": f"{sink.url}/h"}, {"q": "1"}))
    assert out == {"status": 200, "text": ""}
    assert sink.requests("/h")[0].query == {"q": ["1"]}


async def test_idempotency_key_traceparent_and_user_agent_are_sent(http, sink) -> None:
    config = {"url": f"{sink.url}/x", "headers": {"idempotency-key": "forged", "X-A": 1}}
    await http.invoke(call(config))
    await http.invoke(call({"url": f"{sink.url}/x"}, traceparent=""))
    first, second = sink.requests("/x")
    assert first.key == "task:s1"
    assert first.headers["idempotency-key"] == "task:s1"  # the config cannot override it
    assert first.traceparent == TRACEPARENT
    assert first.headers["user-agent"].startswith("agent-reach/")
    assert first.headers["x-a"] == "1"
    assert second.traceparent is None


async def test_secret_header_is_resolved_at_invoke_time(http, sink, monkeypatch) -> None:
    config = {
        "method": "POST",
        "url": f"{sink.url}/pay",
        "headers": {"Authorization": "Bearer ${env:SINK_TOKEN}"},
    }
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    await http.invoke(call(config, {"amount": 5}))
    monkeypatch.setenv("SINK_TOKEN", "rotated")
    await http.invoke(call(config, {"amount": 5}))
    first, second = sink.requests("/pay")
    assert first.headers["authorization"] == f"Bearer {CANARY}"
    assert second.headers["authorization"] == "Bearer rotated"


async def test_arguments_cannot_smuggle_secret_references(http, sink, monkeypatch) -> None:
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    config = {"url": f"{sink.url}/{{p}}", "method": "POST", "query": {"k": "${env:SINK_TOKEN}"}}
    await http.invoke(call(config, {"p": "${env:SINK_TOKEN}", "b": "${env:SINK_TOKEN}"}))
    [req] = sink.requests()
    assert CANARY not in req.path
    assert req.json() == {"b": "${env:SINK_TOKEN}"}
    assert req.query == {"k": [CANARY]}  # config references do resolve


async def test_missing_secret_is_a_fatal_connector_error(http, sink, monkeypatch) -> None:
    monkeypatch.delenv("SINK_TOKEN", raising=False)
    error = await failure(
        http, call({"url": f"{sink.url}/x", "headers": {"X-Key": "${env:SINK_TOKEN}"}})
    )
    assert (error.code, error.retryable) == ("connector_error", False)
    assert "SINK_TOKEN" in error.message
    assert sink.requests() == []


# Answers ------------------------------------------------------------------------------------


async def test_json_answer_is_parsed_and_text_is_wrapped_and_truncated(http, sink) -> None:
    sink.script("/j", [Response(json={"id": "x", "n": [1]})])
    sink.script("/t", [Response(body="x" * (MAX_TEXT + 10))])
    sink.script("/e", [Response(status=204, body=b"")])
    assert await http.invoke(call({"url": f"{sink.url}/j"})) == {"id": "x", "n": [1]}
    text = await http.invoke(call({"url": f"{sink.url}/t"}))
    assert text == {"status": 200, "text": "x" * MAX_TEXT}
    assert await http.invoke(call({"url": f"{sink.url}/e"})) == {"status": 204, "text": ""}


async def test_broken_json_answer_falls_back_to_text(http, sink) -> None:
    sink.script("/j", [Response(body="{oops", content_type="application/json")])
    assert await http.invoke(call({"url": f"{sink.url}/j"})) == {"status": 200, "text": "{oops"}


async def test_success_statuses(http, sink) -> None:
    sink.script("/gone", [Response(status=404, json={"deleted": False})])
    sink.script("/accepted", [Response(status=202)])
    config = {"url": f"{sink.url}/gone", "success_statuses": [200, 404]}
    assert await http.invoke(call(config)) == {"deleted": False}
    error = await failure(http, call({**config, "url": f"{sink.url}/accepted"}))
    assert error.code == "downstream_rejected"


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (500, "downstream_unavailable", True),
        (502, "downstream_unavailable", True),
        (503, "downstream_unavailable", True),
        (504, "downstream_unavailable", True),
        (501, "downstream_rejected", False),
        (429, "rate_limited", True),
        (408, "timeout", True),
        (400, "downstream_rejected", False),
        (401, "unauthorized", False),
        (403, "unauthorized", False),
        (404, "not_found", False),
        (409, "downstream_rejected", False),
        (422, "downstream_rejected", False),
        (302, "downstream_rejected", False),
    ],
)
async def test_status_classification(http, sink, status, code, retryable) -> None:
    sink.script("/x", [Response(status=status)])
    error = await failure(http, call({"url": f"{sink.url}/x"}))
    assert (error.code, error.retryable, error.maybe_applied) == (code, retryable, False)
    assert error.message.startswith(f"order.query: downstream answered {status}")


async def test_status_message_is_one_plain_sentence(http, sink) -> None:
    sink.script("/x", [Response(status=503, headers=(("X-Echo", CANARY),))])
    error = await failure(http, call({"url": f"{sink.url}/x"}))
    assert error.message == "order.query: downstream answered 503 Service Unavailable"
    assert str(error) == error.message


@pytest.mark.parametrize("status", [429, 503, 408])
async def test_retry_after_seconds(http, sink, status) -> None:
    sink.script("/x", [Response(status=status, retry_after=7)])
    assert (await failure(http, call({"url": f"{sink.url}/x"}))).retry_after == 7


async def test_retry_after_http_date_and_garbage(http, sink) -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    sink.script(
        "/x", [Response(status=429, retry_after=later), Response(status=503, retry_after="soon")]
    )
    first = await failure(http, call({"url": f"{sink.url}/x"}))
    assert 25 <= (first.retry_after or 0) <= 30
    second = await failure(http, call({"url": f"{sink.url}/x"}))
    assert (second.code, second.retry_after) == ("downstream_unavailable", None)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("120", 120.0),
        (" 0 ", 0.0),
        ("1.5", 1.5),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: go now
        ("-5", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("Wed, 99 Foo 2015", None),
    ],
)
def test_parse_retry_after(header, expected) -> None:
    assert parse_retry_after(header) == expected


def test_parse_retry_after_http_date_is_relative_to_now() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0


# Transport failures and ambiguity -----------------------------------------------------------


async def test_refused_connection_was_not_applied(http) -> None:
    error = await failure(http, call({"url": f"http://127.0.0.1:{free_port()}/x"}))
    assert (error.code, error.retryable, error.maybe_applied) == ("connection_error", True, False)
    assert error.message.startswith("order.query: could not connect to http://127.0.0.1:")


async def test_connect_timeout_was_not_applied(http) -> None:
    with full_backlog() as port:
        error = await failure(http, call({"url": f"http://127.0.0.1:{port}/x", "timeout": 0.2}))
    assert (error.code, error.retryable, error.maybe_applied) == ("timeout", True, False)


async def test_read_timeout_may_have_applied(http, sink) -> None:
    sink.script("/slow", [Response(delay=1.0)])
    error = await failure(http, call({"method": "POST", "url": f"{sink.url}/slow", "timeout": 0.2}))
    assert (error.code, error.retryable, error.maybe_applied) == ("timeout", True, True)
    assert sink.effects() == {"task:s1": 1}  # it did apply: the answer was just late


async def test_call_timeout_is_the_default(http, sink) -> None:
    sink.script("/slow", [Response(delay=1.0)])
    started = time.monotonic()
    error = await failure(http, call({"url": f"{sink.url}/slow"}, timeout_s=0.2))
    assert error.code == "timeout"
    assert time.monotonic() - started < 0.9


@pytest.mark.parametrize("how", ["drop", "reset"])
async def test_connection_lost_after_the_request_may_have_applied(http, sink, how) -> None:
    sink.script("/drop", [Response(drop=how == "drop", reset=how == "reset", applied=True)])
    error = await failure(http, call({"method": "POST", "url": f"{sink.url}/drop"}, {"a": 1}))
    assert (error.code, error.retryable, error.maybe_applied) == ("connection_error", True, True)
    assert "may have been applied" in error.message
    assert len(sink.requests("/drop")) == 1


async def test_retries_carry_the_same_key_and_apply_once(http, sink) -> None:
    sink.script("/pay", [Response(drop=True, applied=True), Response(status=503), Response()])
    config = {"method": "POST", "url": f"{sink.url}/pay"}
    for attempt in (1, 2):
        with pytest.raises(ConnectorError):
            await http.invoke(call(config, {"amount": 5}, attempt=attempt))
    assert await http.invoke(call(config, {"amount": 5}, attempt=3)) == {}
    assert sink.deliveries_per_key() == {"task:s1": 3}
    assert sink.effects() == {"task:s1": 1}


def secret_failures(sink_url: str) -> list[tuple[str, dict[str, Any], Response | None]]:
    secret = "${env:SINK_TOKEN}"
    headers = {"Authorization": f"Bearer {secret}", "X-Key": secret}
    dead = f"http://127.0.0.1:{free_port()}"
    return [
        (
            "status",
            {"url": f"{sink_url}/s/{secret}?token={secret}", "headers": headers},
            Response(status=503),
        ),
        ("refused", {"url": f"{dead}/s/{secret}?token={secret}", "headers": headers}, None),
        (
            "timeout",
            {"url": f"{sink_url}/s/{secret}", "headers": headers, "timeout": 0.2},
            Response(delay=1),
        ),
        (
            "drop",
            {"url": f"{sink_url}/s/{secret}?t={secret}", "headers": headers},
            Response(drop=True),
        ),
        (
            "bad placeholder",
            {"url": f"{sink_url}/s/{secret}/{{missing}}", "headers": headers},
            None,
        ),
    ]


@pytest.mark.parametrize("case", range(5))
async def test_secrets_never_appear_in_error_messages(http, sink, monkeypatch, case) -> None:
    monkeypatch.setenv("SINK_TOKEN", CANARY)
    name, config, response = secret_failures(sink.url)[case]
    if response is not None:
        sink.script(f"/s/{CANARY}", [response])
    error = await failure(http, call(config))
    assert CANARY not in error.message, name
    assert CANARY not in str(error), name
    assert CANARY not in repr(error.args), name
    assert error.__cause__ is None


# Config and lifecycle -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"url": "http://127.0.0.1:1/x", "body": "xml"},
        {"url": "http://127.0.0.1:1/x", "timeout": 0},
        {"url": "http://127.0.0.1:1/x", "timeout": "5"},
        {"url": "http://127.0.0.1:1/x", "success_statuses": "200"},
        {"url": "http://127.0.0.1:1/x", "headers": ["nope"]},
        {"url": "http://[::1/x"},
        {"url": "http://127.0.0.1:1/x", "allow_hosts": "127.0.0.1"},
        {"url": "http://127.0.0.1:1/x", "allow_hosts": ["*"]},
        {"url": "http://127.0.0.1:1/x", "allow_hosts": ["10.0.0.0/33"]},
        {"url": "http://127.0.0.1:1/x", "allow_hosts": ["127.0.0.1:0"]},
        {"url": "http://127.0.0.1:1/x", "max_redirects": -1},
        {"url": "http://127.0.0.1:1/x", "max_redirects": True},
    ],
)
async def test_bad_config_is_a_fatal_connector_error(http, config) -> None:
    error = await failure(http, call(config))
    assert (error.code, error.retryable) == ("connector_error", False)


async def test_a_non_http_scheme_is_refused(http) -> None:
    error = await failure(http, call({"url": "ftp://127.0.0.1:1/x"}))
    assert (error.code, error.retryable) == ("destination_refused", False)
    assert "only http and https" in error.message


async def test_invoke_works_without_start_and_after_close(sink) -> None:
    connector = HttpConnector()
    assert await connector.invoke(call({"url": f"{sink.url}/x"})) == {}
    await connector.close()
    assert await connector.invoke(call({"url": f"{sink.url}/x"})) == {}
    await connector.close()
    assert len(sink.requests("/x")) == 2


async def test_concurrent_calls_each_apply_once(http, sink) -> None:
    config = {"method": "POST", "url": f"{sink.url}/ledger"}
    calls = [call(config, {"i": i}, idempotency_key=f"task:s{i}") for i in range(64)]
    outs = await asyncio.gather(*(http.invoke(c) for c in calls))
    assert outs == [{}] * 64
    assert sink.effects() == {f"task:s{i}": 1 for i in range(64)}


async def test_calls_beyond_the_pool_wait_for_a_connection(sink) -> None:
    connector = HttpConnector(max_connections=2)
    sink.script("/slow", [Response(delay=0.05)] * 12)
    try:
        calls = [call({"url": f"{sink.url}/slow"}, idempotency_key=f"task:s{i}") for i in range(12)]
        outs = await asyncio.gather(*(connector.invoke(c) for c in calls))
    finally:
        await connector.close()
    assert outs == [{}] * 12
    assert len(sink.requests("/slow")) == 12


async def test_cookies_are_never_kept_between_calls(http, sink) -> None:
    # One tool's session cookie must not ride along on another call, of this tool or any other.
    sink.script("/login", [Response(headers=(("Set-Cookie", "session=s3cret; Path=/"),))])
    await http.invoke(call({"url": f"{sink.url}/login"}))
    await http.invoke(call({"url": f"{sink.url}/next"}))
    [after] = sink.requests("/next")
    assert "cookie" not in after.headers


async def test_a_proxy_from_the_environment_is_not_used(http, sink, monkeypatch) -> None:
    # The connection goes to the address that was checked, never to a proxy that would resolve
    # and reach the destination itself.
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert await http.invoke(call({"url": f"{sink.url}/direct"})) == {}
    assert len(sink.requests("/direct")) == 1


# Answer size ----------------------------------------------------------------------------------


@contextmanager
def _raw_server(head: bytes, *, chunk: bytes = b"", forever: bool = False) -> Iterator[str]:
    """A one-connection-at-a-time raw HTTP server: sends `head`, then `chunk` for ever if asked."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.1)
    stopped = threading.Event()
    sent = [0]

    def serve() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                try:
                    conn.sendall(head)
                    while forever and not stopped.is_set():
                        conn.sendall(chunk)
                        sent[0] += len(chunk)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopped.set()
        thread.join(5)
        listener.close()


async def test_an_endless_body_is_cut_at_the_cap() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    connector = HttpConnector(max_body=256 * 1024)
    try:
        with _raw_server(head, chunk=b"[1,2,3,4,5,6,7]" * 1000, forever=True) as url:
            error = await asyncio.wait_for(failure(connector, call({"url": f"{url}/big"})), 5)
    finally:
        await connector.close()
    assert (error.code, error.retryable, error.maybe_applied) == ("connector_error", False, True)
    assert "larger than 256 KiB" in error.message
    assert error.message.startswith("order.query: the answer from http://127.0.0.1:")


async def test_a_declared_length_over_the_cap_is_refused_unread(http) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 11534336\r\nConnection: close\r\n\r\n" + b"x" * 1000
    )
    with _raw_server(head) as url:
        error = await asyncio.wait_for(failure(http, call({"url": f"{url}/big"})), 5)
    assert error.code == "connector_error"
    assert "larger than 10 MiB" in error.message


async def test_a_body_at_the_cap_is_read(sink) -> None:
    connector = HttpConnector(max_body=1000)
    sink.script("/ok", [Response(body="y" * 1000)])
    sink.script("/over", [Response(body="y" * 1001)])
    try:
        assert await connector.invoke(call({"url": f"{sink.url}/ok"})) == {
            "status": 200,
            "text": "y" * 1000,
        }
        error = await failure(connector, call({"url": f"{sink.url}/over"}))
    finally:
        await connector.close()
    assert error.code == "connector_error"


async def test_an_error_status_body_is_not_read() -> None:
    head = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nConnection: close\r\n\r\n"
    connector = HttpConnector(max_body=1024)
    try:
        with _raw_server(head, chunk=b"<html>" * 1000, forever=True) as url:
            error = await asyncio.wait_for(failure(connector, call({"url": f"{url}/x"})), 5)
    finally:
        await connector.close()
    assert (error.code, error.retry_after) == ("downstream_unavailable", 2.0)


# Paths ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "args"),
    [
        ("/v1/orders/{order_id}", {"order_id": ".."}),
        ("/v1/orders/{order_id}/items", {"order_id": "."}),
        ("/v1/files/{a}{b}", {"a": ".", "b": "."}),
    ],
)
async def test_arguments_cannot_climb_out_of_the_path(http, sink, template, args) -> None:
    error = await failure(http, call({"url": f"{sink.url}{template}"}, args))
    assert (error.code, error.retryable) == ("invalid_arguments", False)
    assert sink.requests() == []


async def test_dots_inside_an_argument_are_fine(http, sink) -> None:
    await http.invoke(
        call({"url": f"{sink.url}/files/{{name}}/{{v}}"}, {"name": "a..b", "v": "..."})
    )
    [req] = sink.requests()
    assert req.path == "/files/a..b/..."


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}, 30.0),
        ({"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1000000060"}, 60.0),
        ({"RateLimit-Remaining": "0", "RateLimit-Reset": "4"}, 4.0),
        ({"RateLimit": "limit=100, remaining=0, reset=7"}, 7.0),
        ({"RateLimit": '"default";r=0;t=9'}, 9.0),
        ({"X-RateLimit-Remaining": "3", "X-RateLimit-Reset": "30"}, None),
        ({"X-RateLimit-Remaining": "0"}, None),
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "soon"}, None),
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "nan"}, None),
        ({}, None),
    ],
)
def test_a_spent_quota_is_read_from_the_usual_headers(
    headers: dict[str, str], expected: float | None
) -> None:
    assert quota_reset(headers, now=1_000_000_000.0) == expected


async def test_a_spent_quota_comes_back_with_the_output_and_a_429_throttles_the_tool(
    http: HttpConnector, sink: Sink
) -> None:
    spent = (("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "12"))
    sink.script(
        "/q",
        [
            Response(json={"ok": 1}, headers=spent),
            Response(status=429, retry_after=3),
            Response(status=429, headers=spent),
            Response(status=503, headers=spent),
            Response(json={"ok": 2}),
        ],
    )
    config = {"url": f"{sink.url}/q", "method": "GET"}
    throttled = await http.invoke(call(config))
    assert isinstance(throttled, Throttled)
    assert (throttled.output, throttled.seconds) == ({"ok": 1}, 12.0)
    told = await failure(http, call(config))
    assert (told.code, told.retry_after, told.throttle) == ("rate_limited", 3.0, 3.0)
    from_headers = await failure(http, call(config))
    assert (from_headers.retry_after, from_headers.throttle) == (12.0, 12.0)
    unavailable = await failure(http, call(config))
    assert (unavailable.code, unavailable.throttle) == ("downstream_unavailable", 12.0)
    assert await http.invoke(call(config)) == {"ok": 2}


def test_query_parameters_are_added_to_the_urls_own_query() -> None:
    connector = HttpConnector()
    config = {
        "url": "http://127.0.0.1:9/find?key=abc",
        "method": "GET",
        "query": {"token": "t"},
        "allow_hosts": ["127.0.0.1"],
    }
    request = connector.build_request(call(config, {"q": "x y"}))
    assert list(request.url.query.items()) == [("key", "abc"), ("token", "t"), ("q", "x y")]
