"""Deciding what a finished attempt means: success, a retry with a durable backoff, or failure."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach.states import StepStatus, Transition, target
from agent_reach_controller.decide.ratelimits import concurrency_key, step_key
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.planning.plan import validate_resolved_args
from agent_reach_controller.receipts import (
    Receipt,
    ReceiptError,
    ReceiptMeta,
    project_output,
    redact_output,
)
from agent_reach_controller.tools.catalog import RetryPolicy, Timeouts, ToolSpec, backoff_delay
from agent_reach_controller.tools.environments import needs_approval, sandbox_refusal


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptError:
    code: str
    message: str
    retryable: bool
    retry_after_s: float = 0.0
    maybe_applied: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResult:
    """What an executor reported for one attempt, already decoded from the wire."""

    step_key: int
    attempt: int
    output: Any = None
    error: AttemptError | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # Seconds the downstream asked every caller of the tool to hold back (its quota is spent).
    throttle_s: float = 0.0
    # The lease token quoted with the result (checked for a session's leases).
    lease_token: str = ""

    def hold_back(self, cap: float) -> float:
        """How long this answer says the whole tool should wait, at most `cap`; 0.0: not at all."""
        asked = self.throttle_s
        if self.error is not None and self.error.code == ErrorCode.RATE_LIMITED:
            asked = max(asked, self.error.retry_after_s)
        return min(asked, cap) if asked > 0 else 0.0  # NaN is not > 0


def terminal_values(
    step: StepRow,
    *,
    tool: ToolSpec,
    transition: Transition,
    now: datetime,
    output: Any = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Columns set when a step ends: output, error, the receipt, and the released lease."""
    status = target(transition)
    began = step.started_at or step.created_at
    receipt = Receipt(
        status=status.value,
        data=project_output(redact_output(output, tool.redact), tool.output)
        if status is StepStatus.SUCCEEDED
        else None,
        error=ReceiptError(
            code=error["code"], message=error["message"], retryable=bool(error["retryable"])
        )
        if error
        else None,
        meta=ReceiptMeta(
            tool=step.tool,
            step_id=step.step_id,
            attempts=step.attempt,
            duration_ms=max(0, int((now - began).total_seconds() * 1000)),
            idempotency_key=step.idempotency_key,
            trace_id=step.trace_id,
            verified=None,
            fallback_for=step.fallback_from,
            environment=step.environment,
        ),
    )
    return {
        "output": output,
        "error": error,
        "receipt": receipt.to_dict(),
        "finished_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
    }


@dataclass(slots=True, kw_only=True)
class Budget:
    """Attempts a task may still start (None: no budget); each retry decided takes one."""

    left: int | None = None

    def take(self) -> bool:
        if self.left is None:
            return True
        if self.left <= 0:
            return False
        self.left -= 1
        return True


FallbackLookup = Callable[[str], "ToolSpec | None"]


def _no_fallback(_: str) -> ToolSpec | None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What deciding a failure needs besides the step: its tool, the time, and the task's limits."""

    tool: ToolSpec
    now: datetime
    rng: random.Random
    budget: Budget = field(default_factory=Budget)
    tool_named: FallbackLookup = _no_fallback  # finds a fallback tool by name


def decide_result(step: StepRow, result: AttemptResult, ctx: Decision) -> StepChange:
    """The transition a reported attempt leads to (the caller has checked the lease)."""
    if result.error is None:
        values = terminal_values(
            step, tool=ctx.tool, transition=Transition.SUCCEED, now=ctx.now, output=result.output
        )
        return StepChange(step=step, transition=Transition.SUCCEED, values=values)
    return _or_fallback(_decide_failure(step, result.error, ctx), ctx)


def decide_lease_expiry(step: StepRow, ctx: Decision) -> StepChange:
    """A running step whose executor stopped heartbeating: retry it, or fail it if exhausted."""
    error = AttemptError(
        code=ErrorCode.LEASE_LOST.value,
        message=f"the executor running {step.tool} stopped responding",
        retryable=True,
        maybe_applied=True,  # it may have called the downstream before it went away
    )
    change = _or_fallback(_decide_failure(step, error, ctx), ctx)
    data = dict(change.event_data or {})
    data["lease_owner"] = step.lease_owner
    return StepChange(
        step=step, transition=change.transition, values=change.values, event_data=data
    )


def decide_undelivered(step: StepRow, ctx: Decision) -> StepChange:
    """A lease whose poll reply never reached its executor (lost with a controller): the step
    did not run, so it goes back to the queue as a retry that cannot have applied anything."""
    error = AttemptError(
        code=ErrorCode.LEASE_LOST.value,
        message=f"the lease on {step.tool} never reached its executor; it did not run",
        retryable=True,
        maybe_applied=False,
    )
    change = _or_fallback(_decide_failure(step, error, ctx), ctx)
    data = dict(change.event_data or {})
    data["lease_owner"] = step.lease_owner
    return StepChange(
        step=step, transition=change.transition, values=change.values, event_data=data
    )


def _decide_failure(step: StepRow, error: AttemptError, ctx: Decision) -> StepChange:
    if error.maybe_applied and not ctx.tool.idempotent:
        return _mark_unknown(step, error, tool=ctx.tool, now=ctx.now)
    policy = RetryPolicy.model_validate(step.retry) if step.retry else ctx.tool.retry
    retryable = error.retryable and error.code not in policy.non_retryable_error_types
    if retryable and step.attempt < step.max_attempts and not ctx.budget.take():
        spent = {
            "code": ErrorCode.BUDGET_EXHAUSTED.value,
            "message": f"{error.message}; not retried: the task's attempt budget is spent",
            "retryable": False,
        }
        values = terminal_values(
            step, tool=ctx.tool, transition=Transition.FAIL, now=ctx.now, error=spent
        )
        return StepChange(
            step=step,
            transition=Transition.FAIL,
            values=values,
            event_data={"error": spent, "final": "budget"},
        )
    if retryable and step.attempt < step.max_attempts:
        delay = backoff_delay(policy, step.attempt, rng=ctx.rng)
        if error.retry_after_s > 0:
            delay = max(delay, min(error.retry_after_s, policy.maximum_retry_after))
        close_by = closes_at(step, ctx.tool)
        if close_by is not None and ctx.now + timedelta(seconds=delay) >= close_by:
            return _out_of_time(step, error, tool=ctx.tool, now=ctx.now)
        return StepChange(
            step=step,
            transition=Transition.RETRY,
            values={
                "attempt": step.attempt + 1,
                "not_before": ctx.now + timedelta(seconds=delay),
                "start_by": start_by(step, ctx.tool, ctx.now + timedelta(seconds=delay)),
                "lease_owner": None,
                "lease_expires_at": None,
                "error": error.as_dict(),
            },
            event_data={"error": error.as_dict(), "delay_s": round(delay, 3)},
        )
    final = error.as_dict()
    if retryable:
        final["message"] = f"{error.message} (after {step.attempt} attempts)"
    values = terminal_values(
        step, tool=ctx.tool, transition=Transition.FAIL, now=ctx.now, error=final
    )
    return StepChange(
        step=step, transition=Transition.FAIL, values=values, event_data={"error": final}
    )


def _mark_unknown(
    step: StepRow, error: AttemptError, *, tool: ToolSpec, now: datetime
) -> StepChange:
    """An attempt that may have reached a downstream that cannot deduplicate: ask a human.

    Retrying blindly could do it twice (charge twice, send twice); failing could hide that it
    happened. The step waits in `outcome_unknown` until an operator resolves it.
    """
    unknown = {
        "code": ErrorCode.OUTCOME_UNKNOWN.value,
        "message": f"{error.message}; it may have been applied, so it was not retried "
        "and waits for an operator to confirm",
        "retryable": False,
    }
    values = terminal_values(
        step, tool=tool, transition=Transition.MARK_UNKNOWN, now=now, error=unknown
    )
    values["finished_at"] = None  # not over: an operator decides
    return StepChange(
        step=step,
        transition=Transition.MARK_UNKNOWN,
        values=values,
        event_data={"error": error.as_dict(), "maybe_applied": True},
    )


def decide_resolution(
    step: StepRow,
    *,
    action: str,
    tool: ToolSpec,
    now: datetime,
    output: Any = None,
    reason: str = "",
) -> StepChange:
    """An operator's verdict on an `outcome_unknown` step: run it again, it happened, it did not."""
    if action == "retry":
        values: dict[str, Any] = {
            "attempt": step.attempt + 1,
            "max_attempts": max(step.max_attempts, step.attempt + 1),
            "not_before": None,
            "start_by": start_by(step, tool, now),
            "receipt": None,
            "error": None,
        }
        return StepChange(step=step, transition=Transition.RESOLVE_RETRY, values=values)
    if action == "succeeded":
        values = terminal_values(
            step, tool=tool, transition=Transition.RESOLVE_SUCCEEDED, now=now, output=output
        )
        return StepChange(step=step, transition=Transition.RESOLVE_SUCCEEDED, values=values)
    error = {
        "code": ErrorCode.RESOLVED_FAILED.value,
        "message": f"an operator confirmed it did not happen: {reason}".rstrip(": "),
        "retryable": False,
    }
    values = terminal_values(
        step, tool=tool, transition=Transition.RESOLVE_FAILED, now=now, error=error
    )
    return StepChange(step=step, transition=Transition.RESOLVE_FAILED, values=values)


def closes_at(step: StepRow, tool: ToolSpec) -> datetime | None:
    """When the step must be over, retries included (its `schedule_to_close`)."""
    limit = Timeouts.effective(tool, step.timeouts).schedule_to_close
    return None if limit is None else step.created_at + timedelta(seconds=limit)


def start_by(step: StepRow, tool: ToolSpec, due: datetime) -> datetime | None:
    """When an attempt queued to run at `due` fails for want of an executor (schedule_to_start)."""
    limit = Timeouts.effective(tool, step.timeouts).schedule_to_start
    return None if limit is None else due + timedelta(seconds=limit)


def not_started(step: StepRow, ctx: Decision) -> StepChange:
    """A queued attempt no executor took within its `schedule_to_start`: fail, or fall back."""
    limit = Timeouts.effective(ctx.tool, step.timeouts).schedule_to_start
    message = (
        f"{step.tool} was not started within {limit:g}s of being queued "
        f"(schedule_to_start): no executor for connector {step.connector!r} took it"
    )
    return _give_up(step, ctx, ErrorCode.TIMEOUT, message)


def breaker_open(step: StepRow, ctx: Decision) -> StepChange:
    """A queued step of a tool whose breaker is open and set to fail fast: fail, or fall back."""
    message = (
        f"{step.tool} was not called: its downstream has been failing and its circuit "
        "breaker is open"
    )
    return _give_up(step, ctx, ErrorCode.CIRCUIT_OPEN, message)


def not_permitted(
    step: StepRow, ctx: Decision, reason: str, code: ErrorCode = ErrorCode.FORBIDDEN
) -> StepChange:
    """A leased step that may not run after all (its submitter, its tool): it ends, never runs."""
    error = {"code": code.value, "message": reason, "retryable": False}
    values = terminal_values(
        step, tool=ctx.tool, transition=Transition.FAIL, now=ctx.now, error=error
    )
    return StepChange(
        step=step, transition=Transition.FAIL, values=values, event_data={"error": error}
    )


def _give_up(step: StepRow, ctx: Decision, code: ErrorCode, message: str) -> StepChange:
    error = {"code": code.value, "message": message, "retryable": False}
    values = terminal_values(
        step, tool=ctx.tool, transition=Transition.GIVE_UP, now=ctx.now, error=error
    )
    change = StepChange(
        step=step, transition=Transition.GIVE_UP, values=values, event_data={"error": error}
    )
    return _or_fallback(change, ctx)


def _out_of_time(
    step: StepRow, error: AttemptError, *, tool: ToolSpec, now: datetime
) -> StepChange:
    limit = Timeouts.effective(tool, step.timeouts).schedule_to_close
    late = {
        "code": ErrorCode.TIMEOUT.value,
        "message": f"{error.message}; not retried: {step.tool} must finish within "
        f"{limit:g}s of being scheduled (schedule_to_close)",
        "retryable": False,
    }
    values = terminal_values(step, tool=tool, transition=Transition.FAIL, now=now, error=late)
    return StepChange(
        step=step,
        transition=Transition.FAIL,
        values=values,
        event_data={"error": late, "final": "schedule_to_close"},
    )


def _or_fallback(change: StepChange, ctx: Decision) -> StepChange:
    """A step that failed for good tries its tool's fallback, with the same arguments.

    Not after a spent budget or deadline (a fallback is one more attempt), not when the
    arguments do not fit the fallback's schema, and not when the fallback may not run in the
    step's environment as the step stands: it would need an approval the step has not got (for
    this tool), or, in `sandbox`, a sandbox target it does not have.
    """
    if change.transition not in (Transition.FAIL, Transition.GIVE_UP) or ctx.tool.fallback is None:
        return change
    error = change.values.get("error") or {}
    if (change.event_data or {}).get("final"):
        return change
    fallback = ctx.tool_named(ctx.tool.fallback)
    step = change.step
    args = step.resolved_args if step.resolved_args is not None else step.args
    if fallback is None or not fallback.enabled or validate_resolved_args(fallback, args):
        return change
    if needs_approval(fallback, step.environment) or sandbox_refusal(fallback, step.environment):
        return change
    switched = {
        "from": step.tool,
        "to": fallback.name,
        "error": error,
    }
    return StepChange(
        step=step,
        # From the queue the step is re-routed; after an attempt it is retried on the fallback.
        transition=Transition.REROUTE if step.status is StepStatus.READY else Transition.RETRY,
        values={
            "tool": fallback.name,
            "tool_version": fallback.version,
            "connector": fallback.connector,
            "fallback_from": step.fallback_from or step.tool,
            "rate_key": step_key(fallback, args),
            "concurrency_key": concurrency_key(fallback, args),
            "retry": None,
            "attempt": step.attempt + 1,
            "max_attempts": step.attempt + fallback.retry.maximum_attempts,
            "not_before": ctx.now,
            "start_by": start_by(step, fallback, ctx.now),
            "lease_owner": None,
            "lease_expires_at": None,
            "error": error or None,
            "receipt": None,
            "finished_at": None,
        },
        event_data={"fallback": switched},
    )
