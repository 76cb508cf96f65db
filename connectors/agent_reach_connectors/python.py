"""The `python` connector: calls a sync or async function named by import path."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Callable
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError, ToolCall


class PythonConnector:
    """Runs `config.function` ("package.module:attr") with the step's arguments as keywords.

    Sync functions run in a worker thread, async ones on the loop. A function may raise
    ConnectorError for a classified failure; any other exception becomes a non-retryable
    `connector_error` naming only the exception type, since its text may carry secrets.
    """

    name = "python"

    def __init__(self) -> None:
        self._functions: dict[str, Callable[..., Any]] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _function(self, tool: str, path: Any) -> Callable[..., Any]:
        if not isinstance(path, str) or ":" not in path:
            raise ConnectorError(
                ErrorCode.CONNECTOR_ERROR,
                f"{tool}: config.function must look like 'package.module:function'",
                retryable=False,
            )
        if path not in self._functions:
            module_name, _, attr = path.partition(":")
            try:
                target: Any = importlib.import_module(module_name)
                for part in attr.split("."):
                    target = getattr(target, part)
            except (ImportError, AttributeError):
                raise ConnectorError(
                    ErrorCode.CONNECTOR_ERROR, f"{tool}: cannot import {path}", retryable=False
                ) from None
            if not callable(target):
                raise ConnectorError(
                    ErrorCode.CONNECTOR_ERROR, f"{tool}: {path} is not callable", retryable=False
                )
            self._functions[path] = target
        return self._functions[path]

    async def invoke(self, call: ToolCall) -> Any:
        function = self._function(call.tool, call.config.get("function"))
        try:
            if inspect.iscoroutinefunction(function):
                result = await function(**call.args)
            else:
                result = await asyncio.to_thread(function, **call.args)
        except ConnectorError:
            raise
        except TypeError as exc:
            if "argument" in str(exc):
                raise ConnectorError(
                    ErrorCode.INVALID_ARGUMENTS,
                    f"{call.tool}: the arguments do not match the function's parameters",
                    retryable=False,
                ) from None
            raise _crash(call.tool, exc) from None
        except Exception as exc:
            raise _crash(call.tool, exc) from None
        try:
            json.dumps(result)
        except (TypeError, ValueError):
            raise ConnectorError(
                ErrorCode.CONNECTOR_ERROR,
                f"{call.tool}: the function returned a value that is not JSON",
                retryable=False,
            ) from None
        return result


def _crash(tool: str, exc: Exception) -> ConnectorError:
    return ConnectorError(
        ErrorCode.CONNECTOR_ERROR, f"{tool}: {type(exc).__name__}", retryable=False
    )
