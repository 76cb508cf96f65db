"""The python connector: sync and async functions, classified failures, no leaked messages."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, ToolCall
from agent_reach_connectors.python import PythonConnector
from tests.connectors import sample_functions
from tests.connectors.sample_functions import CANARY

MOD = "tests.connectors.sample_functions"


def call(function: Any, args: dict[str, Any] | None = None) -> ToolCall:
    return ToolCall(
        tool="py.tool",
        task_id="task",
        step_id="s1",
        args=args or {},
        config={"function": function},
        idempotency_key="task:s1",
        attempt=1,
        max_attempts=3,
        trace_id="",
        traceparent="",
        timeout_s=5.0,
    )


@pytest.fixture
def py() -> PythonConnector:
    return PythonConnector()


async def test_sync_function_runs_in_a_thread_with_keyword_arguments(py) -> None:
    assert await py.invoke(call(f"{MOD}:add", {"b": 3, "a": 2})) == {"sum": 5}
    name = await py.invoke(call(f"{MOD}:thread_name"))
    assert name != threading.main_thread().name


async def test_sync_functions_do_not_block_the_loop(py) -> None:
    started = time.monotonic()
    await asyncio.gather(*(py.invoke(call(f"{MOD}:nap", {"seconds": 0.3})) for _ in range(3)))
    assert time.monotonic() - started < 0.8


async def test_async_function_and_async_callable_object_are_awaited(py) -> None:
    assert await py.invoke(call(f"{MOD}:greet", {"name": "ann"})) == "hello ann"
    assert await py.invoke(call(f"{MOD}:double", {"x": 4})) == 8


async def test_other_exceptions_name_only_their_type(py, caplog) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(f"{MOD}:leaky"))
    error = info.value
    assert (error.code, error.retryable, error.message) == (
        "connector_error",
        False,
        "py.tool: RuntimeError",
    )
    assert CANARY not in str(error)
    assert error.__cause__ is None
    assert "python_function_failed" in [getattr(r, "event", None) for r in caplog.records]


async def test_type_error_inside_the_function_is_not_blamed_on_the_arguments(py) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(f"{MOD}:broken_inside", {"x": 1}))
    assert (info.value.code, info.value.message) == ("connector_error", "py.tool: TypeError")


async def test_sys_exit_does_not_escape(py) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(f"{MOD}:exits"))
    assert info.value.message == "py.tool: SystemExit"


@pytest.mark.parametrize("args", [{"a": 1}, {"a": 1, "b": 2, "c": 3}])
async def test_arguments_that_do_not_fit_are_invalid(py, args) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(f"{MOD}:add", args))
    assert (info.value.code, info.value.retryable) == ("invalid_arguments", False)


async def test_a_classified_connector_error_passes_through(py) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(f"{MOD}:classified"))
    assert (info.value.code, info.value.retry_after, info.value.retryable) == (
        "rate_limited",
        3,
        True,
    )


@pytest.mark.parametrize("function", ["not_json", "not_a_number"])
async def test_result_must_be_json(py, function) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(f"{MOD}:{function}"))
    assert info.value.code == "connector_error"
    assert "not JSON" in info.value.message


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("no.such.module:f", "cannot import module no.such.module"),
        (f"{MOD}:missing", f"module {MOD} has no attribute missing"),
        (f"{MOD}:NOT_CALLABLE", "is not callable"),
        ("missing-colon", "must look like"),
        (None, "must look like"),
    ],
)
async def test_bad_function_paths_are_fatal_connector_errors(py, function, says) -> None:
    with pytest.raises(ConnectorError) as info:
        await py.invoke(call(function))
    assert (info.value.code, info.value.retryable) == ("connector_error", False)
    assert says in info.value.message


async def test_imported_callables_are_cached(py, monkeypatch) -> None:
    assert await py.invoke(call(f"{MOD}:add", {"a": 1, "b": 1})) == {"sum": 2}
    monkeypatch.setattr(sample_functions, "add", lambda a, b: {"sum": -1})
    assert await py.invoke(call(f"{MOD}:add", {"a": 1, "b": 1})) == {"sum": 2}
    assert await PythonConnector().invoke(call(f"{MOD}:add", {"a": 1, "b": 1})) == {"sum": -1}
