"""Deciding which blocked steps can move: dependencies, `when` conditions, references, schemas."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from agent_reach.errors import ErrorCode
from agent_reach.states import TERMINAL_STEP_STATES, StepStatus, Transition, target
from agent_reach.times import rfc3339
from agent_reach_controller.decide.outcomes import Budget, start_by, terminal_values
from agent_reach_controller.decide.ratelimits import concurrency_key, step_key
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.planning import argmap, fanout, verify
from agent_reach_controller.planning.conditions import ConditionError, compile_condition, evaluate
from agent_reach_controller.planning.plan import validate_resolved_args
from agent_reach_controller.planning.references import UnresolvedReferenceError, resolve
from agent_reach_controller.receipts import project_output, redact_output
from agent_reach_controller.tools.catalog import ToolSpec, Verify

ToolLookup = Callable[[str, str], ToolSpec]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdvanceInput:
    steps: list[StepRow]
    context: Mapping[str, Any]
    tool_of: ToolLookup
    now: datetime
    budget: Budget = field(default_factory=Budget)


def decide_unblocks(data: AdvanceInput) -> list[StepChange]:
    """Every transition out of `blocked` that the current step states allow, to a fixpoint.

    A skip or failure decided here can unblock (and usually skip) dependants in the same pass, so
    a whole chain settles in one transaction.
    """
    by_id = {s.step_id: s for s in data.steps}
    status: dict[str, StepStatus] = {s.step_id: s.status for s in data.steps}
    changes: list[StepChange] = []
    decided: dict[str, Mapping[str, Any]] = {}  # what this pass set on the steps it ended
    progressed = True
    while progressed:
        progressed = False
        for step in data.steps:
            if status[step.step_id] is not StepStatus.BLOCKED:
                continue
            if any(status[d] not in TERMINAL_STEP_STATES for d in step.depends_on):
                continue
            change = _decide_one(step, by_id=by_id, status=status, decided=decided, data=data)
            changes.append(change)
            decided[step.step_id] = change.values
            status[step.step_id] = target(change.transition)
            progressed = True
    return changes


def _decide_one(
    step: StepRow,
    *,
    by_id: Mapping[str, StepRow],
    status: Mapping[str, StepStatus],
    decided: Mapping[str, Mapping[str, Any]],
    data: AdvanceInput,
) -> StepChange:
    tool = data.tool_of(step.tool, step.tool_version)
    special = _decide_children(step, tool, by_id=by_id, status=status, decided=decided, data=data)
    if special is not None:
        return special
    not_done = [d for d in step.depends_on if status[d] is not StepStatus.SUCCEEDED]
    if not_done:
        first = not_done[0]
        message = f"skipped because step '{first}' {status[first].value}"
        return _end(step, tool, data, Transition.SKIP, (ErrorCode.DEPENDENCY_FAILED, message))
    outputs = {d: by_id[d].output for d in step.depends_on}
    if step.when_expr:
        try:
            go = evaluate(
                compile_condition(step.when_expr),
                steps={d: {"output": outputs[d], "status": status[d].value} for d in outputs},
                context=dict(data.context),
            )
        except ConditionError as exc:
            return _end(step, tool, data, Transition.FAIL, (ErrorCode.CONDITION_ERROR, str(exc)))
        if not go:
            message = f"skipped because its condition is false: {step.when_expr}"
            return _end(step, tool, data, Transition.SKIP, (ErrorCode.CONDITION_FALSE, message))
    return _unblock(step, tool, outputs, data)


def _decide_children(
    step: StepRow,
    tool: ToolSpec,
    *,
    by_id: Mapping[str, StepRow],
    status: Mapping[str, StepStatus],
    decided: Mapping[str, Mapping[str, Any]],
    data: AdvanceInput,
) -> StepChange | None:
    """A step with children (fan-out, verified write) or a link of a verified write's chain,
    decided; None for any other step."""
    if fanout.gathers(step.step_id, tool):
        if tool.verify is not None:
            errors = {d: decided.get(d, {}).get("error", by_id[d].error) for d in step.depends_on}
            return _gather_verified(step, tool, by_id, status, errors, data)
        records = [
            _record(n, by_id[d], status[d], decided.get(d, {}), tool)
            for n, d in enumerate(step.depends_on)
        ]
        return _gather(step, tool, records, data)
    link = verify.link(step.step_id)
    if link is not None and link[1] > 0 and link[0] in by_id:  # the first write is a plain step
        parent = by_id[link[0]]
        check = data.tool_of(parent.tool, parent.tool_version).verify
        if check is not None and all(status[d] is StepStatus.SUCCEEDED for d in step.depends_on):
            return _decide_link(step, tool, check, link, by_id, data)
    return None


def _decide_link(
    step: StepRow,
    tool: ToolSpec,
    check: Verify,
    link: tuple[str, int],
    by_id: Mapping[str, StepRow],
    data: AdvanceInput,
) -> StepChange:
    """A link of a verified write's chain whose dependencies succeeded: a check gets its
    arguments from the write it reads back; a rewrite runs only if the last check did not hold."""
    parent, n = link
    outputs = {d: by_id[d].output for d in step.depends_on}
    if n % 2 == 1:
        write = by_id[fanout.child_id(parent, n - 1)]
        try:
            args = verify.check_args(check, write.resolved_args or write.args, write.output)
        except ConditionError as exc:
            message = f"the check's arguments could not be computed: {exc}"
            return _end(step, tool, data, Transition.FAIL, (ErrorCode.INVALID_ARGUMENTS, message))
        return _unblock(replace(step, args=args), tool, outputs, data)
    if n > 0:
        write = by_id[fanout.child_id(parent, n - 2)]
        read = by_id[fanout.child_id(parent, n - 1)]
        verdict = verify.holds(check, write.resolved_args or write.args, write.output, read.output)
        if verdict.holds is not False:
            message = f"not written again: {verdict.reason}"
            return _end(step, tool, data, Transition.SKIP, (ErrorCode.CONDITION_FALSE, message))
    return _unblock(step, tool, outputs, data)


def _gather_verified(
    step: StepRow,
    tool: ToolSpec,
    by_id: Mapping[str, StepRow],
    status: Mapping[str, StepStatus],
    errors: Mapping[str, Mapping[str, Any] | None],
    data: AdvanceInput,
) -> StepChange:
    """A verified write once its chain has ended, decided by the last write that ran and its
    check: succeeded and verified; failed as the write failed; or, when the check did not
    hold (or could not run), the tool's policy: failed `unverified`, or a person's call."""
    check = tool.verify
    assert check is not None
    chain = list(step.depends_on)
    ran = [n for n in range(0, len(chain), 2) if status[chain[n]] is not StepStatus.SKIPPED]
    if not ran:  # the first write was skipped: its dependencies or condition said so
        error = errors[chain[0]] or {}
        code = error.get("code", ErrorCode.DEPENDENCY_FAILED)
        return _end(step, tool, data, Transition.SKIP, (code, error.get("message", "")))
    write, read = by_id[chain[ran[-1]]], by_id[chain[ran[-1] + 1]]
    writes = len(ran)
    base = replace(step, attempt=writes)  # what the receipt says; the row's guard keeps `step`
    if status[write.step_id] is not StepStatus.SUCCEEDED:
        error = errors[write.step_id] or {}
        code = error.get("code", ErrorCode.INTERNAL)
        said = error.get("message", f"the write {status[write.step_id].value}")
        return replace(_end(base, tool, data, Transition.FAIL, (code, said)), step=step)
    if status[read.step_id] is not StepStatus.SUCCEEDED:
        reason = (errors[read.step_id] or {}).get("message", f"it {status[read.step_id].value}")
        verdict = verify.Verdict(None, f"the check ({check.tool}) did not run to the end: {reason}")
    else:
        args = write.resolved_args or write.args
        verdict = verify.holds(check, args, write.output, read.output)
    if verdict.holds:
        values = terminal_values(
            base, tool=tool, transition=Transition.GATHER, now=data.now, output=write.output
        )
        values["receipt"]["meta"]["verified"] = True
        return StepChange(step=step, transition=Transition.GATHER, values=values)
    tries = f"{writes} write{'s' if writes > 1 else ''}"
    if check.on_mismatch == "ask":
        event = {"reason": f"written ({tries}) but not verified: {verdict.reason}"}
        values = {"output": write.output}
        return StepChange(step=step, transition=Transition.DOUBT, values=values, event_data=event)
    message = f"written ({tries}) but not verified: {verdict.reason}"
    ended = _end(base, tool, data, Transition.FAIL, (ErrorCode.UNVERIFIED, message))
    values = {**ended.values, "output": write.output}
    values["receipt"]["meta"]["verified"] = False
    return StepChange(
        step=step, transition=Transition.FAIL, values=values, event_data=ended.event_data
    )


def _unblock(
    step: StepRow, tool: ToolSpec, outputs: Mapping[str, Any], data: AdvanceInput
) -> StepChange:
    """Ready with resolved, re-validated arguments, within budget; or failed, saying why."""
    try:
        resolved = resolve(step.args, outputs)
    except UnresolvedReferenceError as exc:
        message = f"argument {exc.pointer} could not be resolved: {exc.detail}"
        return _end(step, tool, data, Transition.FAIL, (ErrorCode.INVALID_ARGUMENTS, message))
    problems = validate_resolved_args(
        tool, resolved, child=fanout.parent_of(step.step_id) is not None
    )
    if problems:
        detail = "; ".join(f"{p.pointer}: {p.detail}" for p in problems[:5])
        message = f"arguments are invalid after resolving references: {detail}"
        return _end(step, tool, data, Transition.FAIL, (ErrorCode.INVALID_ARGUMENTS, message))
    try:
        mapped = argmap.apply(tool.map_args, resolved) if tool.map_args is not None else None
    except argmap.ArgMapError as exc:
        return _end(step, tool, data, Transition.FAIL, (ErrorCode.INVALID_ARGUMENTS, str(exc)))
    if not data.budget.take():
        message = "not started: the task's attempt budget is spent"
        return _end(step, tool, data, Transition.FAIL, (ErrorCode.BUDGET_EXHAUSTED, message))
    values: dict[str, Any] = {"resolved_args": resolved}
    if (due_at := _due(step, tool, data.now)) is not None:
        values["not_before"] = due_at
    due = start_by(step, tool, values.get("not_before", data.now))
    if due is not None:
        values["start_by"] = due
    if tool.rate_limit is not None and tool.rate_limit.key is not None:
        values["rate_key"] = step_key(tool, resolved)
    if tool.concurrency_per_key is not None:
        values["concurrency_key"] = concurrency_key(tool, resolved)
    said: dict[str, Any] = {}
    if step.run_at is not None:
        said["run_at"] = rfc3339(step.run_at)
    if mapped is not None:
        said["mapped_args"] = mapped  # what the executor will be given
    return StepChange(
        step=step, transition=Transition.UNBLOCK, values=values, event_data=said or None
    )


def _gather(
    step: StepRow, tool: ToolSpec, records: list[dict[str, Any]], data: AdvanceInput
) -> StepChange:
    """A fan-out step once every child has ended: succeeded when all did, skipped when all were
    (its dependencies or condition said so), else failed saying which did not; its output and
    receipt hold a record of each child either way."""
    assert tool.fan_out is not None
    over = tool.fan_out.over
    done = sum(1 for r in records if r["status"] == StepStatus.SUCCEEDED.value)
    output = {"succeeded": done, "total": len(records), "records": records}
    if done == len(records):
        values = terminal_values(
            step, tool=tool, transition=Transition.GATHER, now=data.now, output=output
        )
        # The records are already as receipts show them; the tool's `output` fields are a child's.
        values["receipt"].update(data=output, targets=records)
        return StepChange(step=step, transition=Transition.GATHER, values=values)
    if all(r["status"] == StepStatus.SKIPPED.value for r in records):
        transition, error = Transition.SKIP, records[0]["error"] or {}
        code, message = error.get("code", ErrorCode.DEPENDENCY_FAILED), error.get("message", "")
    else:
        transition = Transition.FAIL
        missed = [r for r in records if r["status"] != StepStatus.SUCCEEDED.value]
        said = "; ".join(
            f"{over}[{r['target']}] {r['status']}"
            + (f": {r['error']['message']}" if r["error"] else "")
            for r in missed[:5]
        )
        message = f"{done} of {len(records)} {over} succeeded; {said}"
        code = (
            ErrorCode.PARTIALLY_DONE
            if done
            else (missed[0]["error"] or {}).get("code", ErrorCode.INTERNAL)
        )
    error_value = {"code": str(code), "message": message, "retryable": False}
    values = terminal_values(
        step, tool=tool, transition=transition, now=data.now, output=output, error=error_value
    )
    values["receipt"]["targets"] = records
    return StepChange(
        step=step, transition=transition, values=values, event_data={"error": error_value}
    )


def _record(
    n: int,
    child: StepRow,
    status: StepStatus,
    decided: Mapping[str, Any],
    tool: ToolSpec,
) -> dict[str, Any]:
    """One row of a fan-out step's record: what became of its `n`th target (`decided`: what
    this pass set on the child, when it ended it), its output as a receipt shows it."""
    error = decided.get("error", child.error)
    finished_at = decided.get("finished_at", child.finished_at)
    output = None
    if status is StepStatus.SUCCEEDED:
        output = project_output(redact_output(child.output, tool.redact), tool.output)
    done_at = output.get("delivered_at") if isinstance(output, dict) else None
    return {
        "target": n,
        "step_id": child.step_id,
        "status": status.value,
        "attempts": child.attempt,
        "done_at": done_at or (rfc3339(finished_at) if finished_at else None),
        "error": {"code": error.get("code"), "message": error.get("message")} if error else None,
        "output": output,
    }


def _due(step: StepRow, tool: ToolSpec, now: datetime) -> datetime | None:
    """When a step queued now may first run, if not at once."""
    waits = []
    if tool.hold is not None:
        # The undo window: the step is queued but not due, and a cancel still stops it.
        waits.append(now + timedelta(seconds=tool.hold))
    if step.run_at is not None and step.run_at > now:
        waits.append(step.run_at)  # a scheduled step: queued, due at its time
    return max(waits) if waits else None


def _end(
    step: StepRow,
    tool: ToolSpec,
    data: AdvanceInput,
    transition: Transition,
    error: tuple[ErrorCode | str, str],
) -> StepChange:
    code, message = error
    values = terminal_values(
        step,
        tool=tool,
        transition=transition,
        now=data.now,
        error={"code": str(code), "message": message, "retryable": False},
    )
    return StepChange(
        step=step, transition=transition, values=values, event_data={"error": values["error"]}
    )


# A step holds attempts once it is queued or has ever started (its current attempt included).
HOLDS_ATTEMPTS = frozenset(
    {StepStatus.READY, StepStatus.RUNNING, StepStatus.AWAITING_APPROVAL, StepStatus.OUTCOME_UNKNOWN}
)


def attempts_held(steps: list[StepRow]) -> int:
    """Attempts a task's steps have used or reserved, counted against `budget.max_attempts`."""
    return sum(s.attempt for s in steps if s.status in HOLDS_ATTEMPTS or s.started_at is not None)


def budget_for(max_attempts: int | None, steps: list[StepRow]) -> Budget:
    """What is left of a task's attempt budget, given all its steps."""
    if max_attempts is None:
        return Budget()
    return Budget(left=max_attempts - attempts_held(steps))
