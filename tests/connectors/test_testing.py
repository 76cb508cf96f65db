"""The demo and test connectors: echo, sleep and script."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, ToolCall
from agent_reach_connectors.testing import EchoConnector, ScriptConnector, SleepConnector


def call(config: dict[str, Any], args: dict[str, Any] | None = None, attempt: int = 1) -> ToolCall:
    return ToolCall(
        tool="demo.tool",
        task_id="task",
        step_id="s1",
        args=args or {},
        config=config,
        idempotency_key="task:s1",
        attempt=attempt,
        max_attempts=3,
        trace_id="",
        traceparent="",
        timeout_s=5.0,
    )


async def test_echo_returns_args_attempt_and_key() -> None:
    out = await EchoConnector().invoke(call({}, {"x": 1}, attempt=2))
    assert out == {"args": {"x": 1}, "attempt": 2, "idempotency_key": "task:s1"}


async def test_echo_returns_a_fixed_output() -> None:
    assert await EchoConnector().invoke(call({"output": [1, {"a": None}]})) == [1, {"a": None}]


async def test_sleep_takes_args_then_config() -> None:
    assert await SleepConnector().invoke(call({"seconds": 1}, {"seconds": 0.01})) == {"slept": 0.01}
    assert await SleepConnector().invoke(call({"seconds": 0.02})) == {"slept": 0.02}
    assert await SleepConnector().invoke(call({})) == {"slept": 0}


@pytest.mark.parametrize("seconds", [-1, "soon", True, float("inf")])
async def test_sleep_rejects_bad_seconds(seconds) -> None:
    with pytest.raises(ConnectorError) as info:
        await SleepConnector().invoke(call({}, {"seconds": seconds}))
    assert info.value.code == "invalid_arguments"


async def test_sleep_is_cancellable() -> None:
    task = asyncio.create_task(SleepConnector().invoke(call({}, {"seconds": 60})))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


SCRIPT = {
    "outcomes": [
        "error:downstream_unavailable:retry_after=2",
        "timeout",
        "error:invalid_arguments",
        "ok",
    ]
}


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (1, ("downstream_unavailable", True, 2.0, False)),
        (2, ("timeout", True, None, True)),
        (3, ("invalid_arguments", False, None, False)),
    ],
)
async def test_script_plays_outcomes_by_attempt(attempt, expected) -> None:
    # A fresh instance each time: the outcome depends on the attempt only.
    with pytest.raises(ConnectorError) as info:
        await ScriptConnector().invoke(call(SCRIPT, attempt=attempt))
    error = info.value
    assert (error.code, error.retryable, error.retry_after, error.maybe_applied) == expected


async def test_script_last_outcome_repeats_and_ok_reports_the_attempt() -> None:
    assert await ScriptConnector().invoke(call(SCRIPT, attempt=4)) == {"attempt": 4}
    assert await ScriptConnector().invoke(call(SCRIPT, attempt=9)) == {"attempt": 9}
    assert await ScriptConnector().invoke(call({}, attempt=1)) == {"attempt": 1}


async def test_script_hang_waits_until_cancelled() -> None:
    task = asyncio.create_task(ScriptConnector().invoke(call({"outcomes": ["hang"]})))
    done, _ = await asyncio.wait({task}, timeout=0.05)
    assert not done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize(
    "outcomes",
    [["explode"], ["error:no_such_code"], ["error:timeout:retry_after=x"], ["error:timeout:x=1"]],
)
async def test_script_rejects_a_bad_script(outcomes) -> None:
    with pytest.raises(ConnectorError) as info:
        await ScriptConnector().invoke(call({"outcomes": outcomes}))
    assert (info.value.code, info.value.retryable) == ("connector_error", False)


async def test_script_rejects_outcomes_that_are_not_a_list() -> None:
    with pytest.raises(ConnectorError) as info:
        await ScriptConnector().invoke(call({"outcomes": "ok"}))
    assert info.value.code == "connector_error"
