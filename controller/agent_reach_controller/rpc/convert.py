"""Conversion between protobuf messages and domain values (only at this edge)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from agent_reach.ids import make_traceparent
from agent_reach.telemetry import dispatch_span_id
from agent_reach.v1 import executor_pb2 as pb
from agent_reach_controller.decide.outcomes import AttemptError, AttemptResult, closes_at
from agent_reach_controller.domain.jsontext import compact
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning import argmap
from agent_reach_controller.tools.catalog import Timeouts, ToolSpec
from agent_reach_controller.tools.environments import connector_config


def to_ms(value: datetime | None) -> int:
    return int(value.timestamp() * 1000) if value is not None else 0


def from_ms(value: int) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=UTC) if value > 0 else None


def _dumps(value: Any) -> bytes:
    return compact(value)


def call_args(step: StepRow, tool: ToolSpec) -> Any:
    """The arguments an executor is given: the step's, as the tool's `map_args` wants them
    (checked when the step was queued, and when an approver edited them)."""
    args = step.resolved_args if step.resolved_args is not None else step.args
    return argmap.apply(tool.map_args, args) if tool.map_args is not None else args


def _attempt_timeout_ms(step: StepRow, timeouts: Timeouts, tool: ToolSpec) -> int:
    """The per-attempt timeout, cut to what is left of `schedule_to_close` (at least 1 ms)."""
    timeout = timeouts.timeout or tool.timeout
    close_by = closes_at(step, tool)
    if close_by is not None:
        timeout = min(timeout, (close_by - datetime.now(UTC)).total_seconds())
    return max(1, int(timeout * 1000))


def assignment_to_proto(
    step: StepRow, tool: ToolSpec, *, lease_token: str = "", expires_at: datetime | None = None
) -> pb.StepAssignment:
    """`lease_token` and `expires_at` for a session's lease (whose expiry is the session's).
    The connector config is the one for the step's environment (in `sandbox`, the tool's sandbox
    target)."""
    timeouts = Timeouts.effective(tool, step.timeouts)
    return pb.StepAssignment(
        lease=pb.LeaseRef(step_key=step.id, attempt=step.attempt, token=lease_token),
        task_id=step.task_id,
        step_id=step.step_id,
        tool=step.tool,
        connector=step.connector,
        config_json=_dumps(connector_config(tool, step.environment)),
        args_json=_dumps(call_args(step, tool)),
        idempotency_key=step.idempotency_key,
        trace_id=step.trace_id,
        # The executor's span is a child of the dispatch span (see agent_reach.telemetry).
        traceparent=make_traceparent(
            step.trace_id, dispatch_span_id(step.task_id, step.step_id, step.attempt)
        ),
        timeout_ms=_attempt_timeout_ms(step, timeouts, tool),
        heartbeat_timeout_ms=int((timeouts.heartbeat or 0) * 1000),
        lease_expires_at_ms=to_ms(expires_at or step.lease_expires_at),
        max_attempts=step.max_attempts,
        idempotent=tool.idempotent,
        environment=step.environment,
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} cannot be stored")


def _loads_storable(raw: bytes) -> Any:
    """JSON that Postgres JSONB accepts: no NaN/Infinity, no NUL, no unpaired surrogate."""
    text = raw.decode("utf-8")
    if "\\u0000" in text.replace("\\\\", ""):
        raise ValueError("NUL character")
    value = json.loads(text, parse_constant=_reject_constant)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # raises on an unpaired surrogate
    return value


class BadResultError(ValueError):
    """A result message that cannot be decoded."""


def result_from_proto(message: pb.StepResult) -> AttemptResult:
    result = _result_from_proto(message)
    return replace(result, lease_token=message.lease.token[:64])


def _result_from_proto(message: pb.StepResult) -> AttemptResult:
    key, attempt = message.lease.step_key, message.lease.attempt
    started, finished = from_ms(message.started_at_ms), from_ms(message.finished_at_ms)
    if message.outcome == pb.OUTCOME_SUCCEEDED:
        try:
            output = _loads_storable(message.output_json) if message.output_json else None
        except (ValueError, RecursionError):
            # One bad output fails its own step; it must not reject (and jam) the whole batch.
            return AttemptResult(
                step_key=key,
                attempt=attempt,
                error=AttemptError(
                    code="connector_error",
                    message="the tool's output is not storable JSON "
                    "(invalid, NaN or Infinity, or a NUL character)",
                    retryable=False,
                ),
                started_at=started,
                finished_at=finished,
            )
        return AttemptResult(
            step_key=key,
            attempt=attempt,
            output=output,
            started_at=started,
            finished_at=finished,
            throttle_s=message.throttle_s,
        )
    if message.outcome == pb.OUTCOME_FAILED:
        err = message.error
        return AttemptResult(
            error=AttemptError(
                code=err.code or "connector_error",
                message=err.message[:2000] or "the tool failed without a message",
                retryable=err.retryable,
                retry_after_s=max(0.0, err.retry_after_s),
                maybe_applied=err.maybe_applied,
            ),
            step_key=key,
            attempt=attempt,
            started_at=started,
            finished_at=finished,
            throttle_s=message.throttle_s,
        )
    raise BadResultError("outcome must be OUTCOME_SUCCEEDED or OUTCOME_FAILED")
