"""The `python` connector: calls a sync or async function named by import path."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError, ToolCall
from agent_reach_connectors.pytools import PythonTool, ValidationError, tool_of

log = logging.getLogger(__name__)


class PythonConnector:
    """Runs `config.function` ("package.module:attr") with the step's arguments as keywords.

    Sync functions run in a worker thread (`asyncio.to_thread`; a cancelled call cannot stop
    the thread, only stop waiting for it), async ones on the event loop. The return value must
    be JSON-serialisable. A function may raise `ConnectorError` for a classified failure; any
    other exception becomes a non-retryable `connector_error` whose message names only the
    exception type (`"tool: KeyError"`), because exception text may carry secrets; the full
    traceback goes to the executor's log for engineers. Arguments that do not fit the
    function's signature are `invalid_arguments`; a function marked `@tool` also gets them
    validated and converted to its type hints first. Imported callables are cached per path.
    """

    name = "python"

    def __init__(self) -> None:
        self._functions: dict[str, _Function] = {}

    async def start(self) -> None:
        """Nothing to open."""
        return None

    async def close(self) -> None:
        """Nothing to release."""
        return None

    def _function(self, tool: str, path: Any) -> _Function:
        if not isinstance(path, str) or path.count(":") != 1:
            raise _fatal(tool, "config.function must look like 'package.module:function'")
        cached = self._functions.get(path)
        if cached is not None:
            return cached
        module_name, _, attr = path.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except ImportError as exc:
            raise _fatal(
                tool, f"cannot import module {module_name} ({type(exc).__name__})"
            ) from None
        except AttributeError:
            raise _fatal(tool, f"module {module_name} has no attribute {attr}") from None
        if not callable(target):
            raise _fatal(tool, f"{path} is not callable")
        function = _Function.of(target)
        self._functions[path] = function
        return function

    async def invoke(self, call: ToolCall) -> Any:
        """Call the function with `call.args`; return its JSON-serialisable result."""
        target = self._function(call.tool, call.config.get("function"))
        args = target.check(call.tool, call.args)
        function = target.call
        try:
            if target.is_async:
                result = await function(**args)
            else:
                result = await asyncio.to_thread(function, **args)
                if inspect.isawaitable(result):
                    result = await result
        except ConnectorError:
            raise
        except (Exception, SystemExit) as exc:
            log.warning(
                "tool %s: function raised %s",
                call.tool,
                type(exc).__name__,
                exc_info=exc,
                extra={"event": "python_function_failed", "tool": call.tool},
            )
            raise _fatal(call.tool, type(exc).__name__) from None
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError):
            raise _fatal(call.tool, "the function returned a value that is not JSON") from None
        return result


def _fatal(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{tool}: {what}", retryable=False)


@dataclass(frozen=True, slots=True)
class _Function:
    """An imported callable, with what each call needs to know of it worked out once."""

    call: Callable[..., Any]
    signature: inspect.Signature | None  # None: a builtin without one (the call decides)
    is_async: bool
    declared: PythonTool | None  # what @tool recorded, if the function is marked

    @classmethod
    def of(cls, function: Callable[..., Any]) -> _Function:
        try:
            signature: inspect.Signature | None = inspect.signature(function)
        except (TypeError, ValueError):
            signature = None
        method = getattr(function, "__call__", None)  # noqa: B004  (async callable objects)
        is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(method)
        declared = tool_of(function)
        return cls(call=function, signature=signature, is_async=is_async, declared=declared)

    def check(self, tool: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
        """The arguments to call with, checked before calling, so that a TypeError (or a
        ValidationError) inside the function is not blamed on them."""
        if self.declared is not None:
            try:
                return self.declared.arguments(dict(args))
            except ValidationError as exc:
                raise _invalid(tool, exc) from None
        if self.signature is not None:
            _check_arguments(tool, self.signature, args)
        return args


def _invalid(tool: str, exc: ValidationError) -> ConnectorError:
    """The problems of each argument, named by its path; never the values (they may be long,
    or secret)."""
    said = [
        f"{'.'.join(str(p) for p in error['loc']) or '(arguments)'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)[:5]
    ]
    return ConnectorError(
        ErrorCode.INVALID_ARGUMENTS,
        f"{tool}: the arguments do not fit the function: {'; '.join(said)}",
        retryable=False,
    )


def _check_arguments(tool: str, signature: inspect.Signature, args: Mapping[str, Any]) -> None:
    try:
        signature.bind(**args)
    except TypeError as exc:
        # The binder's text names parameters only, never argument values.
        raise ConnectorError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{tool}: the arguments do not fit the function ({exc})",
            retryable=False,
        ) from None
