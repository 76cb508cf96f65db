"""Runs one assignment through its connector: decoding, timeout, error classification, result."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry.trace import SpanKind

from agent_reach import telemetry
from agent_reach.errors import ErrorCode
from agent_reach.ids import make_traceparent, parse_traceparent
from agent_reach.telemetry import execute_span_id
from agent_reach_connectors.base import Connector, ConnectorError, Throttled, ToolCall
from agent_reach_executor.client import Assignment, StepFailure, StepResult

log = logging.getLogger(__name__)

# How long a connector gets to unwind after it is cancelled (timeout or drain) before the runner
# stops waiting for it: a connector that ignores cancellation must not hold a slot forever.
CANCEL_GRACE_S = 5.0
# `\u0000` outside an escaped backslash: Postgres rejects NUL in JSONB strings and keys.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


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
        cancel_grace_s: float = CANCEL_GRACE_S,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._connectors = connectors
        self._default_timeout_s = default_timeout_s
        self._cancel_grace_s = cancel_grace_s
        self._clock = clock
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def run(self, assignment: Assignment) -> StepResult:
        lease = assignment.lease
        parent = parse_traceparent(assignment.traceparent)
        # An older controller says no environment: the span leaves it out rather than guess.
        where = {telemetry.ENVIRONMENT: assignment.environment} if assignment.environment else {}
        with telemetry.span(
            f"{telemetry.EXECUTE} {assignment.tool}",
            trace_id=assignment.trace_id,
            span_id=execute_span_id(assignment.task_id, assignment.step_id, lease.attempt),
            parent_span_id=parent[1] if parent else None,
            kind=SpanKind.INTERNAL,
            attributes={
                telemetry.GEN_AI_OPERATION: "execute_tool",
                telemetry.GEN_AI_TOOL_NAME: assignment.tool,
                telemetry.GEN_AI_TOOL_CALL_ID: assignment.step_id,
                telemetry.GEN_AI_TOOL_TYPE: "function",
                telemetry.TASK_ID: assignment.task_id,
                telemetry.ATTEMPT: lease.attempt,
                **where,
            },
        ) as current:
            result = await self._run(assignment)
            if result.failure is None:
                current.set_attribute(telemetry.OUTCOME, "succeeded")
            else:
                current.set_attribute(telemetry.OUTCOME, "failed")
                telemetry.mark_error(current, result.failure.code)
            return result

    async def _run(self, assignment: Assignment) -> StepResult:
        started = self._clock()
        log.debug(
            "step %s/%s started: %s attempt %d",
            assignment.task_id,
            assignment.step_id,
            assignment.tool,
            assignment.lease.attempt,
            extra=assignment.log_extra("step_started"),
        )
        throttle: Any = 0.0
        try:
            output, throttle = await self._invoke(assignment)
            failure = None
        except ConnectorError as exc:
            output, failure, throttle = b"", _from_connector_error(exc), exc.throttle
        result = StepResult(
            lease=assignment.lease,
            output_json=output,
            failure=failure,
            started_at_ms=started,
            finished_at_ms=self._clock(),
            throttle_s=_seconds(throttle),
        )
        elapsed = result.finished_at_ms - started
        if failure is None:
            log.debug(
                "step %s/%s finished: succeeded in %d ms",
                assignment.task_id,
                assignment.step_id,
                elapsed,
                extra={**assignment.log_extra("step_finished"), "outcome": "succeeded"},
            )
        else:
            _log_failure(assignment, failure, elapsed)
        return result

    async def _invoke(self, assignment: Assignment) -> tuple[bytes, Any]:
        """The output as JSON and any throttle, or ConnectorError: every failure is classified."""
        connector = self._connectors.get(assignment.connector)
        if connector is None:
            raise ConnectorError(
                ErrorCode.CONNECTOR_UNAVAILABLE,
                f"connector {assignment.connector!r} is not hosted by this executor",
            )
        call = self._tool_call(assignment)
        try:
            output = await self._call_within_deadline(connector, call, assignment)
        except ConnectorError:
            raise
        except Exception as exc:
            raise _crashed(assignment, exc) from None
        if isinstance(output, Throttled):
            return _encode_output(call.tool, output.output), output.seconds
        return _encode_output(call.tool, output), 0.0

    async def _call_within_deadline(
        self, connector: Connector, call: ToolCall, assignment: Assignment
    ) -> Any:
        """`connector.invoke(call)`, cancelled at the call's deadline.

        The runner never waits more than `cancel_grace_s` for a cancelled connector to unwind
        (on a timeout, or when this run itself is cancelled): one that ignores cancellation is
        abandoned, logged, and its slot given back, rather than holding the slot (and, through
        heartbeats, the lease) for ever.
        """
        deadline = time.monotonic() + call.timeout_s
        silent = call.heartbeat_timeout_s
        pulse = _Pulse(time.monotonic())
        call = dataclasses.replace(call, heartbeat=pulse.beat)
        invocation = asyncio.ensure_future(connector.invoke(call))
        while True:
            until = deadline if silent is None else min(deadline, pulse.last + silent)
            try:
                await asyncio.wait({invocation}, timeout=max(0.0, until - time.monotonic()))
            except asyncio.CancelledError:
                await self._stop(invocation, assignment, why="cancelled")
                raise
            if invocation.done():
                return invocation.result()
            now = time.monotonic()
            if now >= deadline:
                why = f"{call.tool} did not finish within {call.timeout_s:g}s"
                break
            if silent is not None and now >= pulse.last + silent:
                why = f"{call.tool} sent no heartbeat for {silent:g}s and was stopped as hung"
                break
        await self._stop(invocation, assignment, why="timed out")
        if invocation.done() and not invocation.cancelled():
            exc = invocation.exception()
            if exc is None:
                return invocation.result()  # it finished anyway: the output is real
            if isinstance(exc, ConnectorError):
                raise exc
        raise ConnectorError(ErrorCode.TIMEOUT, why, retryable=True, maybe_applied=True)

    async def _stop(
        self, invocation: asyncio.Future[Any], assignment: Assignment, *, why: str
    ) -> None:
        """Cancel `invocation` and wait up to the grace for it; abandon it (logged) after that."""
        invocation.cancel()
        try:
            await asyncio.wait({invocation}, timeout=self._cancel_grace_s)
        finally:
            if not invocation.done():
                self._abandon(invocation, assignment, why=why)

    def _abandon(
        self, invocation: asyncio.Future[Any], assignment: Assignment, *, why: str
    ) -> None:
        log.error(
            "connector %r ignored cancellation on %s/%s (%s) for %.1fs; abandoning it",
            assignment.connector,
            assignment.task_id,
            assignment.step_id,
            why,
            self._cancel_grace_s,
            extra={
                **assignment.log_extra("connector_abandoned"),
                "connector": assignment.connector,
            },
        )
        self._abandoned.add(invocation)  # keep a reference: the loop holds tasks weakly
        invocation.add_done_callback(self._forget)

    def _forget(self, invocation: asyncio.Future[Any]) -> None:
        self._abandoned.discard(invocation)
        if not invocation.cancelled():
            invocation.exception()  # retrieved: no "exception was never retrieved" noise

    @property
    def abandoned(self) -> int:
        """Connector calls that ignored cancellation and are still running."""
        return len(self._abandoned)

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
            idempotent=assignment.idempotent,
            attempt=assignment.lease.attempt,
            max_attempts=assignment.max_attempts,
            trace_id=assignment.trace_id,
            # Downstream calls are children of this attempt's execute_tool span.
            traceparent=make_traceparent(
                assignment.trace_id,
                execute_span_id(assignment.task_id, assignment.step_id, assignment.lease.attempt),
            ),
            timeout_s=timeout_s,
            heartbeat_timeout_s=(
                assignment.heartbeat_timeout_ms / 1000
                if assignment.heartbeat_timeout_ms > 0
                else None
            ),
        )


class _Pulse:
    """When a running call last said it is alive."""

    __slots__ = ("last",)

    def __init__(self, now: float) -> None:
        self.last = now

    def beat(self) -> None:
        self.last = time.monotonic()  # callable from a worker thread too


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


# The largest output a step may return; the full output is stored with the step.
MAX_OUTPUT_BYTES = 16 * 1024 * 1024


def _encode_output(tool: str, output: Any) -> bytes:
    """The output as UTF-8 JSON the controller can store, or a `connector_error`.

    Postgres JSONB rejects NaN and Infinity, NUL characters and unpaired surrogates; such an
    output is a failed step here rather than a report the controller cannot store.
    """
    try:
        text = json.dumps(output, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        encoded = text.encode()  # strict: an unpaired surrogate raises UnicodeEncodeError
    except (TypeError, ValueError, RecursionError):
        raise ConnectorError(
            ErrorCode.CONNECTOR_ERROR,
            f"{tool}: the connector returned an output that is not JSON "
            "(or holds NaN, Infinity or an unpaired surrogate)",
            retryable=False,
        ) from None
    if len(encoded) > MAX_OUTPUT_BYTES:
        raise ConnectorError(
            ErrorCode.CONNECTOR_ERROR,
            f"{tool}: the output is {len(encoded):,} bytes; the limit is {MAX_OUTPUT_BYTES:,}",
            retryable=False,
        )
    if _JSON_NUL.search(text):
        raise ConnectorError(
            ErrorCode.CONNECTOR_ERROR,
            f"{tool}: the connector returned an output holding a NUL character",
            retryable=False,
        )
    return encoded


def _clean_text(value: Any) -> str:
    """A string that protobuf and Postgres text accept: valid UTF-8, no NUL."""
    text = value if isinstance(value, str) else str(value)
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\x00", "\ufffd")


def _seconds(value: Any) -> float:
    """A connector's delay as the wire carries it: odd values (None, NaN, < 0, text) are 0."""
    try:
        seconds = float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0
    if math.isnan(seconds) or seconds < 0:  # +inf is fine: the controller caps it
        return 0.0
    return seconds


def _from_connector_error(exc: ConnectorError) -> StepFailure:
    """The failure as the wire carries it; a connector's odd field values cannot break a report."""
    retry_after = _seconds(exc.retry_after)
    return StepFailure(
        code=_clean_text(exc.code) or str(ErrorCode.CONNECTOR_ERROR),
        message=_clean_text(exc.message),
        retryable=bool(exc.retryable),
        retry_after_s=retry_after,
        maybe_applied=bool(exc.maybe_applied),
    )


def _log_failure(assignment: Assignment, failure: StepFailure, elapsed_ms: int) -> None:
    """One line for a failed attempt: a downstream's refusal or garbage is an expected event, not
    a traceback. Its message is the receipt's (a connector keeps secrets out of it), on one line;
    a permanent failure is a warning."""
    message = " ".join(failure.message.split())[:500]
    log.log(
        logging.INFO if failure.retryable else logging.WARNING,
        "step %s/%s failed: %s %s in %d ms: %s",
        assignment.task_id,
        assignment.step_id,
        assignment.tool,
        failure.code,
        elapsed_ms,
        message,
        extra={
            **assignment.log_extra("step_finished"),
            "outcome": "failed",
            "error_code": failure.code,
            "retryable": failure.retryable,
        },
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
