"""Step and task states and the one table of legal step transitions."""

from __future__ import annotations

from enum import StrEnum


class StepStatus(StrEnum):
    BLOCKED = "blocked"
    READY = "ready"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    OUTCOME_UNKNOWN = "outcome_unknown"


class TaskStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Transition(StrEnum):
    """Why a step moves; each name is also the event kind recorded for it."""

    UNBLOCK = "unblock"  # dependencies done and `when` true
    SKIP = "skip"  # `when` false, or a dependency did not succeed
    LEASE = "lease"  # an executor claimed the step
    SUCCEED = "succeed"
    RETRY = "retry"  # retryable error, timeout or lost lease with attempts left
    FAIL = "fail"  # fatal error, attempts exhausted, or arguments invalid after resolution
    # Queued, and will not run: no executor took it within its schedule_to_start, or its tool's
    # breaker is open and set to fail fast.
    GIVE_UP = "give_up"
    REROUTE = "reroute"  # queued, given up on: queued again on the tool's fallback instead
    REQUIRE_APPROVAL = "require_approval"
    APPROVE = "approve"
    REJECT = "reject"
    CANCEL = "cancel"
    # A fan-out step: every child succeeded (it never runs itself; its output records them).
    GATHER = "gather"
    # A verified write whose check did not hold, its tool asking a person (outcome_unknown).
    DOUBT = "doubt"
    MARK_UNKNOWN = "mark_unknown"  # ambiguous failure of a non-idempotent tool
    RESOLVE_RETRY = "resolve_retry"  # operator: run it again
    RESOLVE_SUCCEEDED = "resolve_succeeded"  # operator: it did happen
    RESOLVE_FAILED = "resolve_failed"  # operator: it did not happen


S = StepStatus
T = Transition

# The step state machine (ARCHITECTURE.md, "Who may change a step's state?"), in one place.
# Every write of a step's status names one of these edges and is a compare-and-set on the source
# state; nothing else may change a status.
STEP_TRANSITIONS: dict[Transition, tuple[frozenset[StepStatus], StepStatus]] = {
    T.UNBLOCK: (frozenset({S.BLOCKED}), S.READY),
    T.SKIP: (frozenset({S.BLOCKED}), S.SKIPPED),
    T.LEASE: (frozenset({S.READY}), S.RUNNING),
    T.SUCCEED: (frozenset({S.RUNNING}), S.SUCCEEDED),
    T.RETRY: (frozenset({S.RUNNING}), S.READY),
    T.FAIL: (frozenset({S.BLOCKED, S.RUNNING}), S.FAILED),
    T.GIVE_UP: (frozenset({S.READY}), S.FAILED),
    T.REROUTE: (frozenset({S.READY}), S.READY),
    T.REQUIRE_APPROVAL: (frozenset({S.READY}), S.AWAITING_APPROVAL),
    T.APPROVE: (frozenset({S.AWAITING_APPROVAL}), S.READY),
    T.REJECT: (frozenset({S.AWAITING_APPROVAL}), S.REJECTED),
    T.CANCEL: (
        frozenset({S.BLOCKED, S.READY, S.RUNNING, S.AWAITING_APPROVAL, S.OUTCOME_UNKNOWN}),
        S.CANCELLED,
    ),
    T.GATHER: (frozenset({S.BLOCKED}), S.SUCCEEDED),
    T.DOUBT: (frozenset({S.BLOCKED}), S.OUTCOME_UNKNOWN),
    T.MARK_UNKNOWN: (frozenset({S.RUNNING}), S.OUTCOME_UNKNOWN),
    T.RESOLVE_RETRY: (frozenset({S.OUTCOME_UNKNOWN}), S.READY),
    T.RESOLVE_SUCCEEDED: (frozenset({S.OUTCOME_UNKNOWN}), S.SUCCEEDED),
    T.RESOLVE_FAILED: (frozenset({S.OUTCOME_UNKNOWN}), S.FAILED),
}

TERMINAL_STEP_STATES: frozenset[StepStatus] = frozenset(
    {S.SUCCEEDED, S.FAILED, S.SKIPPED, S.REJECTED, S.CANCELLED}
)
TERMINAL_TASK_STATES: frozenset[TaskStatus] = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED}
)
# A dependant runs only when every dependency ended in one of these.
SATISFIED_STEP_STATES: frozenset[StepStatus] = frozenset({S.SUCCEEDED})


class IllegalTransitionError(Exception):
    """A transition was asked of a step in a state it cannot leave that way."""


def sources(transition: Transition) -> frozenset[StepStatus]:
    """The states a step may be in for `transition` to apply."""
    return STEP_TRANSITIONS[transition][0]


def target(transition: Transition) -> StepStatus:
    """The state `transition` leads to."""
    return STEP_TRANSITIONS[transition][1]


def apply(status: StepStatus, transition: Transition) -> StepStatus:
    """Return the state after `transition`, or raise IllegalTransitionError."""
    allowed_from, to = STEP_TRANSITIONS[transition]
    if status not in allowed_from:
        raise IllegalTransitionError(f"cannot {transition.value} a step that is {status.value}")
    return to


def is_legal(src: StepStatus, dst: StepStatus) -> bool:
    """Whether some transition moves a step from `src` to `dst`."""
    return any(src in frm and dst == to for frm, to in STEP_TRANSITIONS.values())


def derive_task_status(steps: list[StepStatus], *, cancelled: bool = False) -> TaskStatus:
    """A task's status from its steps: terminal only when every step is."""
    if not all(s in TERMINAL_STEP_STATES for s in steps):
        started = any(s is not S.BLOCKED and s is not S.READY for s in steps)
        return TaskStatus.RUNNING if started else TaskStatus.PENDING
    if cancelled or any(s is S.CANCELLED for s in steps):
        return TaskStatus.CANCELLED
    if any(s in (S.FAILED, S.REJECTED) for s in steps):
        return TaskStatus.FAILED
    return TaskStatus.SUCCEEDED
