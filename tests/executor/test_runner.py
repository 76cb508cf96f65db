"""StepRunner: one assignment through one connector, every outcome classified."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agent_reach.v1 import executor_pb2 as pb
from agent_reach_connectors.base import ConnectorError, Throttled, ToolCall
from agent_reach_connectors.mcp_client import McpConnector
from agent_reach_executor.client import (
    Assignment,
    LeaseKey,
    StepResult,
    assignment_from_proto,
    result_to_proto,
)
from agent_reach_executor.runner import StepRunner
from tests.executor.fake_controller import FnConnector
from tests.support.sink import Response, Sink

CANARY = "canary-b41d-secret"


def assignment(**overrides: Any) -> Assignment:
    values: dict[str, Any] = {
        "lease": LeaseKey(step_key=7, attempt=2),
        "task_id": "task-9",
        "step_id": "lookup",
        "tool": "order.query",
        "connector": "fn",
        "config_json": b'{"url": "https://x/${env:TOKEN}"}',
        "args_json": b'{"order_id": 42}',
        "idempotency_key": "task-9:lookup",
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "timeout_ms": 2_000,
        "lease_expires_at_ms": 0,
        "max_attempts": 3,
    }
    return Assignment(**(values | overrides))


async def run_with(fn: Callable[[ToolCall], Awaitable[Any]], **overrides: Any) -> StepResult:
    return await StepRunner({"fn": FnConnector("fn", fn)}).run(assignment(**overrides))


async def test_success_builds_the_call_and_encodes_the_output() -> None:
    async def ok(call: ToolCall) -> Any:
        return {"status": "shipped", "id": call.args["order_id"]}

    connector = FnConnector("fn", ok)
    ticks = iter([1_000, 1_250])
    runner = StepRunner({"fn": connector}, clock=lambda: next(ticks))
    result = await runner.run(assignment())
    assert result.succeeded
    assert json.loads(result.output_json) == {"status": "shipped", "id": 42}
    assert (result.started_at_ms, result.finished_at_ms) == (1_000, 1_250)
    assert result.lease == LeaseKey(step_key=7, attempt=2)
    call = connector.calls[0]
    assert call.args == {"order_id": 42}
    assert call.config == {"url": "https://x/${env:TOKEN}"}  # resolved by the connector, not here
    assert call.timeout_s == 2.0
    assert (call.attempt, call.max_attempts) == (2, 3)
    assert call.idempotency_key == "task-9:lookup"
    assert call.traceparent.startswith("00-0af7651916cd43dd8448eb211c80319c-")


async def test_connector_error_is_carried_field_by_field() -> None:
    async def unavailable(call: ToolCall) -> Any:
        raise ConnectorError(
            "downstream_unavailable",
            "order service returned 503",
            retry_after=1.5,
            maybe_applied=True,
        )

    result = await run_with(unavailable)
    assert result.failure is not None
    assert result.failure.code == "downstream_unavailable"
    assert result.failure.message == "order service returned 503"
    assert result.failure.retryable  # the code's default class
    assert result.failure.retry_after_s == 1.5
    assert result.failure.maybe_applied
    assert result.output_json == b""


async def test_timeout_cancels_the_connector_and_says_so() -> None:
    cancelled = asyncio.Event()

    async def hang(call: ToolCall) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    result = await run_with(hang, timeout_ms=50)
    assert cancelled.is_set()
    assert result.failure is not None
    assert result.failure.code == "timeout"
    assert result.failure.message == "order.query did not finish within 0.05s"
    assert result.failure.retryable
    assert result.failure.maybe_applied


async def test_a_connectors_own_timeout_error_is_a_crash_not_our_timeout() -> None:
    async def own_timeout(call: ToolCall) -> Any:
        raise TimeoutError(CANARY)

    result = await run_with(own_timeout)
    assert result.failure is not None
    assert result.failure.code == "connector_error"
    assert result.failure.message == "order.query: TimeoutError"


async def test_crash_is_classified_without_its_text(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def crash(call: ToolCall) -> Any:
        raise KeyError(f"token={CANARY}")

    result = await run_with(crash)
    assert result.failure is not None
    assert result.failure.code == "connector_error"
    assert result.failure.message == "order.query: KeyError"
    assert not result.failure.retryable
    assert CANARY not in caplog.text
    records: list[Any] = [
        r for r in caplog.records if getattr(r, "event", None) == "connector_crashed"
    ]
    (record,) = records
    assert record.levelno == logging.ERROR
    assert (record.task_id, record.step_id) == ("task-9", "lookup")
    assert record.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert "test_runner.py" in record.getMessage()  # the frames are kept


async def test_unknown_connector_is_connector_unavailable() -> None:
    result = await StepRunner({}).run(assignment(connector="mcp"))
    assert result.failure is not None
    assert result.failure.code == "connector_unavailable"
    assert result.failure.retryable


async def test_output_that_is_not_json_fails_the_step() -> None:
    async def opaque(call: ToolCall) -> Any:
        return object()

    result = await run_with(opaque)
    assert result.failure is not None
    assert result.failure.code == "connector_error"
    assert not result.failure.retryable


@pytest.mark.parametrize(
    ("field", "raw", "code"),
    [
        ("args_json", b"{not json", "invalid_arguments"),
        ("args_json", b"[1, 2]", "invalid_arguments"),
        ("config_json", b"\xff", "connector_error"),
    ],
)
async def test_undecodable_payloads_fail_without_calling_the_connector(
    field: str, raw: bytes, code: str
) -> None:
    connector = FnConnector("fn", lambda call: asyncio.sleep(0))
    result = await StepRunner({"fn": connector}).run(assignment(**{field: raw}))
    assert result.failure is not None
    assert result.failure.code == code
    assert not connector.calls


async def test_missing_timeout_uses_the_default() -> None:
    async def hang(call: ToolCall) -> Any:
        await asyncio.Event().wait()

    runner = StepRunner({"fn": FnConnector("fn", hang)}, default_timeout_s=0.05)
    result = await runner.run(assignment(timeout_ms=0))
    assert result.failure is not None
    assert result.failure.code == "timeout"


async def test_step_started_and_finished_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # per-step lines are DEBUG: they are hot-path cost

    async def ok(call: ToolCall) -> Any:
        return None

    await run_with(ok)
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events == ["step_started", "step_finished"]
    assert getattr(caplog.records[1], "outcome", None) == "succeeded"


@pytest.mark.parametrize(
    "output",
    [
        {"price": float("nan")},
        {"limit": float("inf")},
        [float("-inf")],
        {"name": "a\x00b"},
        {"key\x00": 1},
        {"name": "\ud83d"},  # half an emoji: not UTF-8, and JSONB refuses the escape too
    ],
)
async def test_output_postgres_cannot_store_is_a_connector_error(output: Any) -> None:
    async def odd(call: ToolCall) -> Any:
        return output

    result = await run_with(odd)
    assert result.failure is not None
    assert result.failure.code == "connector_error"
    assert not result.failure.retryable
    assert result.output_json == b""


async def test_output_that_only_looks_like_nul_is_kept() -> None:
    async def escaped(call: ToolCall) -> Any:
        return {"text": "\\u0000 and \u00e9 and \U0001f600"}

    result = await run_with(escaped)
    assert result.succeeded
    assert json.loads(result.output_json) == {"text": "\\u0000 and \u00e9 and \U0001f600"}


async def test_output_nested_too_deep_is_a_connector_error() -> None:
    async def deep(call: ToolCall) -> Any:
        value: list[Any] = []
        for _ in range(100_000):
            value = [value]
        return value

    result = await run_with(deep)
    assert result.failure is not None
    assert result.failure.code == "connector_error"


async def test_a_connector_error_with_odd_fields_still_encodes() -> None:
    async def sloppy(call: ToolCall) -> Any:
        error = ConnectorError("rate_limited", "bad name \udcff\x00", retry_after=float("nan"))
        error.message = 42  # type: ignore[assignment]  # plugins are not type-checked
        error.retry_after = "2.5"  # type: ignore[assignment]
        raise error

    async def sloppier(call: ToolCall) -> Any:
        raise ConnectorError("rate_limited", "bad name \udcff\x00", retry_after=float("nan"))

    first = await run_with(sloppy)
    assert first.failure is not None
    assert (first.failure.message, first.failure.retry_after_s) == ("42", 2.5)
    result_to_proto(first).SerializeToString()
    second = await run_with(sloppier)
    assert second.failure is not None
    assert second.failure.message == "bad name ?\ufffd"
    assert second.failure.retry_after_s == 0.0
    assert second.failure.retryable
    result_to_proto(second).SerializeToString()  # raised UnicodeEncodeError before


class Stubborn:
    """A connector call that swallows every cancellation until `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cancels = 0

    async def __call__(self, call: ToolCall) -> Any:
        while not self.release.is_set():
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancels += 1
        return {"late": True}


async def test_timeout_does_not_wait_for_a_connector_that_ignores_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stubborn = Stubborn()
    runner = StepRunner({"fn": FnConnector("fn", stubborn)}, cancel_grace_s=0.1)
    try:
        result = await asyncio.wait_for(runner.run(assignment(timeout_ms=50)), 2)
        assert result.failure is not None
        assert result.failure.code == "timeout"
        assert result.failure.maybe_applied
        assert stubborn.cancels >= 1
        assert runner.abandoned == 1
        assert [getattr(r, "event", None) for r in caplog.records].count("connector_abandoned") == 1
    finally:
        stubborn.release.set()
        await asyncio.sleep(0.01)
    assert runner.abandoned == 0  # forgotten once it finally returned


async def test_cancelling_a_run_does_not_wait_for_a_connector_that_ignores_it() -> None:
    stubborn = Stubborn()
    runner = StepRunner({"fn": FnConnector("fn", stubborn)}, cancel_grace_s=0.1)
    run = asyncio.create_task(runner.run(assignment(timeout_ms=60_000)))
    try:
        await asyncio.sleep(0.05)
        run.cancel()
        done, _ = await asyncio.wait({run}, timeout=2)
        assert run in done
        assert run.cancelled()  # the cancellation propagates
        assert runner.abandoned == 1
    finally:
        stubborn.release.set()
        await asyncio.sleep(0.01)


async def test_a_connector_that_finishes_while_being_cancelled_keeps_its_output() -> None:
    async def finishes_anyway(call: ToolCall) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return {"done": True}

    result = await run_with(finishes_anyway, timeout_ms=50)
    assert result.succeeded
    assert json.loads(result.output_json) == {"done": True}


async def test_a_silent_call_is_stopped_at_its_heartbeat_timeout_a_beating_one_runs_on() -> None:
    async def beating(call: ToolCall) -> Any:
        for _ in range(8):  # 8 x 40 ms: longer than the 100 ms heartbeat timeout in all
            await asyncio.sleep(0.04)
            call.heartbeat()
        return {"done": True}

    alive = await run_with(beating, heartbeat_timeout_ms=100)
    assert alive.succeeded, alive.failure

    async def hung(call: ToolCall) -> Any:
        call.heartbeat()
        await asyncio.sleep(30)

    stopped = await run_with(hung, heartbeat_timeout_ms=100, timeout_ms=20_000)
    assert stopped.failure is not None
    assert stopped.failure.code == "timeout"
    assert (
        stopped.failure.message == "order.query sent no heartbeat for 0.1s and was stopped as hung"
    )
    assert stopped.failure.retryable
    assert stopped.failure.maybe_applied


async def test_a_spent_quota_reaches_the_result_whatever_the_outcome() -> None:
    async def spent(call: ToolCall) -> Any:
        return Throttled({"n": 1}, 2.5)

    result = await run_with(spent)
    assert json.loads(result.output_json) == {"n": 1}
    assert result.throttle_s == 2.5
    assert result_to_proto(result).throttle_s == 2.5

    async def limited(call: ToolCall) -> Any:
        raise ConnectorError("rate_limited", "slow down", retry_after=4, throttle=float("nan"))

    failed = await run_with(limited)
    assert failed.failure is not None
    assert failed.throttle_s == 0.0  # nonsense from a connector is dropped, not sent


@pytest.mark.parametrize("idempotent", [True, False])
async def test_the_catalogues_idempotent_flag_reaches_the_connector(idempotent: bool) -> None:
    wire = pb.StepAssignment(
        lease=pb.LeaseRef(step_key=1, attempt=1),
        task_id="task-1",
        step_id="s",
        tool="fn.x",
        connector="fn",
        config_json=b"{}",
        args_json=b"{}",
        idempotency_key="task-1:s",
        trace_id="0af7651916cd43dd8448eb211c80319c",
        timeout_ms=1000,
        max_attempts=1,
        idempotent=idempotent,
    )

    async def record(call: ToolCall) -> Any:
        return None

    connector = FnConnector("fn", record)
    assert (await StepRunner({"fn": connector}).run(assignment_from_proto(wire))).succeeded
    assert connector.calls[0].idempotent is idempotent


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (Response(json={"hello": "world"}), "answered the initialize with JSON of another shape"),
        (Response(body="{not json", content_type="application/json"), "with invalid JSON"),
        (Response(body="<html>", content_type="text/html"), "with a text/html reply"),
    ],
)
async def test_a_downstreams_garbage_is_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture, reply: Response, said: str
) -> None:
    """An MCP server answering something that is not JSON-RPC fails the step cleanly and says so
    in one line naming the tool and the step (issue 28)."""
    caplog.set_level(logging.INFO)
    with Sink() as sink:
        sink.script("/mcp", [reply])
        config = {"url": f"{sink.url}/mcp", "tool": "add", "allow_hosts": ["127.0.0.1"]}
        runner = StepRunner({"mcp": McpConnector()})
        result = await runner.run(
            assignment(connector="mcp", tool="remote.add", config_json=json.dumps(config).encode())
        )
    assert result.failure is not None
    assert result.failure.code == "downstream_rejected"
    assert said in result.failure.message
    assert "\n" not in result.failure.message
    assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"
    assert "Traceback" not in caplog.text
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, [r.getMessage() for r in loud]
    line = loud[0].getMessage()
    assert "task-9/lookup" in line
    assert "remote.add" in line
    assert said in line
