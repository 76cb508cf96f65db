"""Runs one assignment through its connector: decoding, timeout, error classification, result."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import Connector, ConnectorError, ToolCall
from agent_reach_executor.client import Assignment, StepFailure, StepResult

log = logging.getLogger(__name__)


def now_ms() -> int:
    """Wall-clock Unix epoch milliseconds (what the controller records)."""
    return time.time_ns() // 1_000_000


class StepRunner:
    """Turns an `Assignment` into a `StepResult`; never raises except on cancellation.

    Failures are classified for the model: a `ConnectorError` keeps its fields, a timeout is
    retryable and may have been applied, anything else is a `connector_error` whose text is not
    passed on (exception messages may carry secrets).
    """

    def __init__(
        self,
        connectors: Mapping[str, Connector],
        *,
        default_timeout_s: float = 300.0,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._connectors = connectors
        self._default_timeout_s = default_timeout_s
        self._clock = clock

    async def run(self, assignment: Assignment) -> StepResult:
        started = self._clock()
        log.debug(
            "step %s/%s started: %s attempt %d",
            assignment.task_id,
            assignment.step_id,
            assignment.tool,
            assignment.lease.attempt,
            extra=assignment.log_extra("step_started"),
        )
        try:
            output, failure = await self._invoke(assignment), None
        except ConnectorError as exc:
            output, failure = b"", _from_connector_error(exc)
        result = StepResult(
            lease=assignment.lease,
            output_json=output,
            failure=failure,
            started_at_ms=started,
            finished_at_ms=self._clock(),
        )
        log.debug(
            "step %s/%s finished: %s in %d ms",
            assignment.task_id,
            assignment.step_id,
            "succeeded" if failure is None else f"failed ({failure.code})",
            result.finished_at_ms - started,
            extra={
                **assignment.log_extra("step_finished"),
                "outcome": "succeeded" if failure is None else "failed",
                "error_code": None if failure is None else failure.code,
            },
        )
        return result

    async def _invoke(self, assignment: Assignment) -> bytes:
        """The output as JSON, or ConnectorError: every failure is classified here."""
        connector = self._connectors.get(assignment.connector)
        if connector is None:
            raise ConnectorError(
                ErrorCode.CONNECTOR_UNAVAILABLE,
                f"connector {assignment.connector!r} is not hosted by this executor",
            )
        call = self._tool_call(assignment)
        try:
            async with asyncio.timeout(call.timeout_s) as deadline:
                output = await connector.invoke(call)
        except ConnectorError:
            raise
        except TimeoutError as exc:
            if not deadline.expired():
                raise _crashed(assignment, exc) from None
            raise ConnectorError(
                ErrorCode.TIMEOUT,
                f"{call.tool} did not finish within {call.timeout_s:g}s",
                retryable=True,
                maybe_applied=True,
            ) from None
        except Exception as exc:
            raise _crashed(assignment, exc) from None
        try:
            return json.dumps(output).encode()
        except (TypeError, ValueError):
            raise ConnectorError(
                ErrorCode.CONNECTOR_ERROR,
                f"{call.tool}: the connector returned an output that is not JSON",
                retryable=False,
            ) from None

    def _tool_call(self, assignment: Assignment) -> ToolCall:
        args = _decode_object(
            assignment.args_json, what="arguments object", code=ErrorCode.INVALID_ARGUMENTS
        )
        config = _decode_object(
            assignment.config_json, what="connector config", code=ErrorCode.CONNECTOR_ERROR
        )
        timeout_s = (
            assignment.timeout_ms / 1000 if assignment.timeout_ms > 0 else self._default_timeout_s
        )
        return ToolCall(
            tool=assignment.tool,
            task_id=assignment.task_id,
            step_id=assignment.step_id,
            args=args,
            config=config,
            idempotency_key=assignment.idempotency_key,
            attempt=assignment.lease.attempt,
            max_attempts=assignment.max_attempts,
            trace_id=assignment.trace_id,
            traceparent=assignment.traceparent,
            timeout_s=timeout_s,
        )


def _decode_object(raw: bytes, *, what: str, code: ErrorCode) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ConnectorError(
            code, f"the step's {what} is not valid JSON", retryable=False
        ) from None
    if not isinstance(value, dict):
        raise ConnectorError(code, f"the step's {what} is not a JSON object", retryable=False)
    return value


def _from_connector_error(exc: ConnectorError) -> StepFailure:
    return StepFailure(
        code=exc.code,
        message=exc.message,
        retryable=exc.retryable,
        retry_after_s=exc.retry_after or 0.0,
        maybe_applied=exc.maybe_applied,
    )


def _crashed(assignment: Assignment, exc: Exception) -> ConnectorError:
    """Classify an unexpected exception without repeating its text.

    The log keeps the type and where it was raised, not `str(exc)` and not source lines: both
    can hold a resolved secret (a token in a URL, a password in a DSN).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    where = " <- ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(frames))
    log.error(
        "connector %r crashed on %s/%s: %s at %s",
        assignment.connector,
        assignment.task_id,
        assignment.step_id,
        type(exc).__qualname__,
        where,
        extra={
            **assignment.log_extra("connector_crashed"),
            "connector": assignment.connector,
            "exception_type": type(exc).__qualname__,
        },
    )
    return ConnectorError(
        ErrorCode.CONNECTOR_ERROR, f"{assignment.tool}: {type(exc).__name__}", retryable=False
    )
