"""Error codes: what went wrong, whether trying again can help, and how each edge reports it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ErrorCode(StrEnum):
    # Step outcomes (receipts).
    TIMEOUT = "timeout"
    DOWNSTREAM_UNAVAILABLE = "downstream_unavailable"
    RATE_LIMITED = "rate_limited"
    CONNECTION_ERROR = "connection_error"
    DOWNSTREAM_REJECTED = "downstream_rejected"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    LEASE_LOST = "lease_lost"
    CANCELLED = "cancelled"
    DEPENDENCY_FAILED = "dependency_failed"
    CONDITION_FALSE = "condition_false"
    CONDITION_ERROR = "condition_error"
    CONNECTOR_UNAVAILABLE = "connector_unavailable"
    CONNECTOR_ERROR = "connector_error"
    INTERNAL = "internal"
    OUTCOME_UNKNOWN = "outcome_unknown"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BUDGET_EXHAUSTED = "budget_exhausted"
    RESOLVED_FAILED = "resolved_failed"
    CIRCUIT_OPEN = "circuit_open"
    FORBIDDEN = "forbidden"
    TOOL_UNAVAILABLE = "tool_unavailable"
    CAP_EXCEEDED = "cap_exceeded"
    REJECTED = "rejected"
    DESTINATION_REFUSED = "destination_refused"
    PARTIALLY_DONE = "partially_done"
    UNVERIFIED = "unverified"
    # API problems (submit-time).
    INVALID_PLAN = "invalid_plan"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    STORAGE_UNAVAILABLE = "storage_unavailable"


# What a connector says (with code `tool_unavailable`) when a remote tool's definition is no longer
# the one approved (an MCP server changed it): the controller then disables the tool.
DEFINITION_CHANGED = "definition changed"


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorKind:
    retryable: bool
    http_status: int
    title: str


ERROR_KINDS: dict[ErrorCode, ErrorKind] = {
    ErrorCode.TIMEOUT: ErrorKind(retryable=True, http_status=504, title="The call timed out"),
    ErrorCode.DOWNSTREAM_UNAVAILABLE: ErrorKind(
        retryable=True, http_status=502, title="The downstream service is unavailable"
    ),
    ErrorCode.RATE_LIMITED: ErrorKind(retryable=True, http_status=429, title="Rate limited"),
    ErrorCode.CONNECTION_ERROR: ErrorKind(
        retryable=True, http_status=502, title="Could not reach the downstream service"
    ),
    ErrorCode.DOWNSTREAM_REJECTED: ErrorKind(
        retryable=False, http_status=422, title="The downstream service rejected the request"
    ),
    ErrorCode.INVALID_ARGUMENTS: ErrorKind(
        retryable=False, http_status=422, title="The arguments are invalid"
    ),
    ErrorCode.UNAUTHORIZED: ErrorKind(retryable=False, http_status=403, title="Not authorised"),
    ErrorCode.NOT_FOUND: ErrorKind(retryable=False, http_status=404, title="Not found"),
    ErrorCode.LEASE_LOST: ErrorKind(
        retryable=True, http_status=503, title="The executor running the step was lost"
    ),
    ErrorCode.CANCELLED: ErrorKind(retryable=False, http_status=409, title="Cancelled"),
    ErrorCode.DEPENDENCY_FAILED: ErrorKind(
        retryable=False, http_status=424, title="A step this one depends on did not succeed"
    ),
    ErrorCode.CONDITION_FALSE: ErrorKind(
        retryable=False, http_status=200, title="The step's condition was false"
    ),
    ErrorCode.CONDITION_ERROR: ErrorKind(
        retryable=False, http_status=422, title="The step's condition could not be evaluated"
    ),
    ErrorCode.CONNECTOR_UNAVAILABLE: ErrorKind(
        retryable=True, http_status=503, title="No executor hosts this connector"
    ),
    ErrorCode.CONNECTOR_ERROR: ErrorKind(
        retryable=False, http_status=500, title="The connector failed"
    ),
    ErrorCode.INTERNAL: ErrorKind(retryable=False, http_status=500, title="Internal error"),
    ErrorCode.BUDGET_EXHAUSTED: ErrorKind(
        retryable=False, http_status=429, title="The task's attempt budget is spent"
    ),
    ErrorCode.DEADLINE_EXCEEDED: ErrorKind(
        retryable=False, http_status=504, title="The task's deadline passed"
    ),
    ErrorCode.OUTCOME_UNKNOWN: ErrorKind(
        retryable=False, http_status=409, title="It may or may not have happened"
    ),
    ErrorCode.RESOLVED_FAILED: ErrorKind(
        retryable=False, http_status=409, title="An operator confirmed it did not happen"
    ),
    ErrorCode.CIRCUIT_OPEN: ErrorKind(
        retryable=False, http_status=503, title="Not called: the tool's circuit breaker is open"
    ),
    ErrorCode.FORBIDDEN: ErrorKind(
        retryable=False, http_status=403, title="Not allowed to run this tool"
    ),
    ErrorCode.TOOL_UNAVAILABLE: ErrorKind(
        retryable=False,
        http_status=410,
        title="Not called: the tool was disabled or deleted after the step was accepted",
    ),
    ErrorCode.CAP_EXCEEDED: ErrorKind(
        retryable=False,
        http_status=429,
        title="Not called: it would exceed a cap on side effects (per task or per tenant)",
    ),
    ErrorCode.DESTINATION_REFUSED: ErrorKind(
        retryable=False,
        http_status=403,
        title="Not called: the destination is not allowed for this tool",
    ),
    ErrorCode.PARTIALLY_DONE: ErrorKind(
        retryable=False,
        http_status=502,
        title="Done for some targets of a fan-out step, not all (its record says which)",
    ),
    ErrorCode.UNVERIFIED: ErrorKind(
        retryable=False,
        http_status=502,
        title="Written, but reading it back did not show the write (the tool's check)",
    ),
    ErrorCode.REJECTED: ErrorKind(
        retryable=False, http_status=403, title="A person did not approve it"
    ),
    ErrorCode.INVALID_PLAN: ErrorKind(retryable=False, http_status=422, title="Invalid plan"),
    ErrorCode.IDEMPOTENCY_CONFLICT: ErrorKind(
        retryable=False,
        http_status=409,
        title="This Idempotency-Key was used with a different request",
    ),
    ErrorCode.STORAGE_UNAVAILABLE: ErrorKind(
        retryable=True, http_status=503, title="Storage is unavailable"
    ),
}


class ProblemCode(StrEnum):
    """Codes only the HTTP API answers with (a step's receipt never carries one)."""

    UNAUTHENTICATED = "unauthenticated"
    CSRF_FAILED = "csrf_failed"
    SEPARATION_OF_DUTIES = "separation_of_duties"
    INVALID_REQUEST = "invalid_request"
    INVALID_JSON = "invalid_json"
    TOO_LARGE = "too_large"
    OVERLOADED = "overloaded"
    TOO_MANY_IN_FLIGHT = "too_many_in_flight"
    NOT_A_TURN = "not_a_turn"
    NOT_RESCHEDULABLE = "not_reschedulable"
    NOT_DECIDABLE = "not_decidable"
    NOT_RESOLVABLE = "not_resolvable"
    TOOL_EXISTS = "tool_exists"
    REVISION_MISMATCH = "revision_mismatch"
    CATALOG_CONFLICT = "catalog_conflict"
    INVALID_TOOLS = "invalid_tools"
    # A replica that does not serve this now (another may): retry after the delay given.
    SHUTTING_DOWN = "shutting_down"
    NOT_STARTED = "not_started"
    TOO_MANY_STREAMS = "too_many_streams"
    # Triggers (signed events that start stored plans).
    TRIGGER_ERROR = "trigger_error"
    BAD_SIGNATURE = "bad_signature"
    TRIGGER_DISABLED = "trigger_disabled"
    OWNER_REVOKED = "owner_revoked"
    TRIGGER_CHANGED = "trigger_changed"
    INVALID_SECRET = "invalid_secret"
    INVALID_EVENT_ID = "invalid_event_id"
    # Agent runs.
    RUN_NOT_ENDED = "run_not_ended"
    # Long-term memory.
    MEMORY_QUOTA_EXCEEDED = "memory_quota_exceeded"
    MEMORY_CHANGED = "memory_changed"


PROBLEM_KINDS: dict[ProblemCode, ErrorKind] = {
    ProblemCode.RUN_NOT_ENDED: ErrorKind(
        retryable=True, http_status=409, title="The run has not ended"
    ),
    ProblemCode.MEMORY_QUOTA_EXCEEDED: ErrorKind(
        retryable=False, http_status=409, title="The subject holds as many memories as it may"
    ),
    ProblemCode.MEMORY_CHANGED: ErrorKind(
        retryable=False, http_status=412, title="The memory changed meanwhile"
    ),
    ProblemCode.UNAUTHENTICATED: ErrorKind(
        retryable=False, http_status=401, title="An API key is needed"
    ),
    ProblemCode.CSRF_FAILED: ErrorKind(retryable=False, http_status=403, title="Not allowed"),
    ProblemCode.SEPARATION_OF_DUTIES: ErrorKind(
        retryable=False, http_status=403, title="Not allowed"
    ),
    ProblemCode.INVALID_REQUEST: ErrorKind(
        retryable=False, http_status=422, title="Invalid request"
    ),
    ProblemCode.INVALID_JSON: ErrorKind(
        retryable=False, http_status=400, title="The body is not valid JSON"
    ),
    ProblemCode.TOO_LARGE: ErrorKind(retryable=False, http_status=413, title="Request too large"),
    ProblemCode.OVERLOADED: ErrorKind(
        retryable=True, http_status=429, title="Too much work is queued"
    ),
    ProblemCode.TOO_MANY_IN_FLIGHT: ErrorKind(
        retryable=True, http_status=429, title="Too many of your tasks are unfinished"
    ),
    ProblemCode.NOT_A_TURN: ErrorKind(
        retryable=False, http_status=409, title="The task is a plan, not a model's turn"
    ),
    ProblemCode.NOT_RESCHEDULABLE: ErrorKind(
        retryable=False, http_status=409, title="The step has started"
    ),
    ProblemCode.NOT_DECIDABLE: ErrorKind(
        retryable=False, http_status=409, title="The step is not waiting for a decision"
    ),
    ProblemCode.NOT_RESOLVABLE: ErrorKind(
        retryable=False, http_status=409, title="The step is not awaiting a verdict"
    ),
    ProblemCode.TOOL_EXISTS: ErrorKind(retryable=False, http_status=409, title="The tool exists"),
    ProblemCode.REVISION_MISMATCH: ErrorKind(
        retryable=False, http_status=412, title="The tool changed meanwhile"
    ),
    ProblemCode.CATALOG_CONFLICT: ErrorKind(
        retryable=False, http_status=409, title="The catalogue would not be valid"
    ),
    ProblemCode.INVALID_TOOLS: ErrorKind(
        retryable=False, http_status=422, title="Invalid tool definitions"
    ),
    ProblemCode.SHUTTING_DOWN: ErrorKind(
        retryable=True, http_status=503, title="This replica is stopping"
    ),
    ProblemCode.NOT_STARTED: ErrorKind(
        retryable=True, http_status=503, title="This replica is not serving this yet"
    ),
    ProblemCode.TOO_MANY_STREAMS: ErrorKind(
        retryable=True, http_status=429, title="Too many live event streams"
    ),
    ProblemCode.TRIGGER_ERROR: ErrorKind(
        retryable=False, http_status=400, title="The trigger cannot be used"
    ),
    ProblemCode.BAD_SIGNATURE: ErrorKind(
        retryable=False, http_status=401, title="The event is not signed for this trigger"
    ),
    ProblemCode.TRIGGER_DISABLED: ErrorKind(
        retryable=False, http_status=403, title="The trigger is disabled"
    ),
    ProblemCode.OWNER_REVOKED: ErrorKind(
        retryable=False, http_status=403, title="The trigger's owner may no longer submit"
    ),
    ProblemCode.TRIGGER_CHANGED: ErrorKind(
        retryable=False, http_status=409, title="The trigger changed meanwhile"
    ),
    ProblemCode.INVALID_SECRET: ErrorKind(
        retryable=False, http_status=422, title="Invalid trigger secret"
    ),
    ProblemCode.INVALID_EVENT_ID: ErrorKind(
        retryable=False, http_status=400, title="Invalid event id"
    ),
}


def problem_kind(code: str) -> ErrorKind | None:
    """How the HTTP API answers a code (an error code or one of its own); None: no such code."""
    if code in PROBLEM_KINDS:
        return PROBLEM_KINDS[ProblemCode(code)]
    if code in ERROR_KINDS:
        return ERROR_KINDS[ErrorCode(code)]
    return None


def kind_of(code: str) -> ErrorKind:
    """The classification of a code; unknown codes are treated as internal, non-retryable."""
    try:
        return ERROR_KINDS[ErrorCode(code)]
    except ValueError:
        return ERROR_KINDS[ErrorCode.INTERNAL]
