"""Replaying a task: its timeline from the event log, and a dry run on its recorded results.

The dry run re-drives the plan with the same code the controller runs (`decide_unblocks`:
dependencies, `when` conditions, `$step.output` references, schema checks) from a fresh start,
using each step's pinned tool version. Where the live task called a tool, the dry run takes the
recorded result instead — no connector is called. It then renders what the model is shown for
every step from what it derived, and compares it, byte for byte, with the rendering of the
receipt that was recorded. Any difference (an argument resolved differently, a step skipped
that ran, a receipt that reads otherwise) is reported; none means the run is reproduced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from agent_reach.states import TERMINAL_STEP_STATES, StepStatus, Transition, target
from agent_reach_controller.decide.advance import AdvanceInput, decide_unblocks
from agent_reach_controller.decide.approvals import args_hash
from agent_reach_controller.decide.outcomes import terminal_values
from agent_reach_controller.domain.records import EventRow, StepRow, TaskRow
from agent_reach_controller.receipts import output_handle, render_receipt_dict
from agent_reach_controller.tools.catalog import ToolSpec

ToolLookup = Callable[[str, str], ToolSpec]
# Event data shown in a timeline (never outputs, which can be large; receipts are shown apart).
_SHOWN = ("executor_id", "by", "reason", "error", "edited", "goal", "steps", "principal")


@dataclass(frozen=True, slots=True, kw_only=True)
class Moment:
    at: datetime
    kind: str
    step_id: str | None
    attempt: int | None
    status: str | None
    detail: dict[str, Any]


def timeline(events: Sequence[EventRow]) -> list[Moment]:
    """What happened, in order: asked, unblocked (with arguments), leased, waited, decided."""
    return [
        Moment(
            at=e.created_at,
            kind=e.kind,
            step_id=e.step_id,
            attempt=e.attempt,
            status=e.to_status,
            detail={k: v for k, v in (e.data or {}).items() if k in _SHOWN},
        )
        for e in events
    ]


@dataclass(slots=True)
class StepReplay:
    step_id: str
    recorded_status: str
    replayed_status: str
    recorded_message: str | None
    replayed_message: str | None
    differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(slots=True)
class DryRun:
    task_id: str
    finished: bool
    steps: list[StepReplay]

    @property
    def identical(self) -> bool:
        return self.finished and not any(s.differences for s in self.steps)


def _fresh(step: StepRow) -> StepRow:
    """The step as it was accepted: blocked, nothing resolved, nothing run."""
    return replace(
        step,
        status=StepStatus.BLOCKED,
        attempt=1,
        resolved_args=None,
        output=None,
        error=None,
        receipt=None,
        not_before=None,
        started_at=None,
        finished_at=None,
        lease_owner=None,
        lease_expires_at=None,
        approval=None,
        decide_by=None,
    )


def _ran(fresh: StepRow, recorded: StepRow, change_values: Mapping[str, Any]) -> StepRow:
    """A step that was queued in the dry run, given the result it had live."""
    return replace(
        fresh,
        **{k: v for k, v in change_values.items() if k in ("resolved_args",)},
        status=recorded.status,
        output=recorded.output,
        error=recorded.error,
        attempt=recorded.attempt,
        started_at=recorded.started_at,
        finished_at=recorded.finished_at,
    )


def _receipt_of(step: StepRow, recorded: StepRow, tool: ToolSpec) -> dict[str, Any] | None:
    """The receipt the dry run derives for a step that ran (from its recorded raw result)."""
    if step.status not in TERMINAL_STEP_STATES:
        return None
    transition = Transition.SUCCEED if step.status is StepStatus.SUCCEEDED else Transition.FAIL
    if step.status is not StepStatus.SUCCEEDED and recorded.receipt is not None:
        # Not a success: what the model read was the recorded error, which the dry run keeps.
        return recorded.receipt
    now = step.finished_at or recorded.updated_at
    values = terminal_values(
        step, tool=tool, transition=transition, now=now, output=step.output, error=step.error
    )
    receipt: dict[str, Any] = values["receipt"]
    return receipt


def dry_run(
    task: TaskRow, recorded: Sequence[StepRow], *, tool_of: ToolLookup, budget: int
) -> DryRun:
    """Re-drive `task`'s plan on its recorded results and compare what the model is told."""
    live = {s.step_id: s for s in recorded}
    sim = {s.step_id: _fresh(s) for s in recorded}
    queued: dict[str, Mapping[str, Any]] = {}
    # Each pass settles at least one more step; a record that does not add up cannot loop.
    for _ in range(len(recorded) + 1):
        changes = decide_unblocks(
            AdvanceInput(
                steps=list(sim.values()),
                context=task.context,
                tool_of=tool_of,
                now=task.created_at,
            )
        )
        for change in changes:
            step_id = change.step.step_id
            if change.transition is Transition.UNBLOCK:
                queued[step_id] = change.values
                sim[step_id] = _ran(sim[step_id], live[step_id], change.values)
            else:
                sim[step_id] = replace(
                    sim[step_id], status=target(change.transition), **_ended(change.values)
                )
        if not changes:
            break
    replays = []
    for step_id, was in live.items():
        now = sim[step_id]
        tool = tool_of(was.tool, was.tool_version)
        handle = output_handle(task.task_id, step_id)  # as the tool messages carry it
        replay = StepReplay(
            step_id=step_id,
            recorded_status=was.status.value,
            replayed_status=now.status.value,
            recorded_message=_render(was.receipt, budget, handle),
            replayed_message=_render(
                now.receipt if step_id not in queued else _receipt_of(now, was, tool),
                budget,
                handle,
            ),
        )
        if was.status is not now.status:
            replay.differences.append(
                f"status: recorded {was.status.value}, replayed {now.status.value}"
            )
        if step_id in queued and queued[step_id].get("resolved_args") != was.resolved_args:
            edited_by = _editor(was)
            if edited_by is None:
                replay.differences.append("resolved arguments differ from the recorded ones")
            else:
                replay.notes.append(f"arguments edited by the approver {edited_by}")
        if replay.recorded_message != replay.replayed_message:
            replay.differences.append("what the model is shown differs")
        replays.append(replay)
    finished = all(s.status in TERMINAL_STEP_STATES for s in recorded)
    return DryRun(task_id=task.task_id, finished=finished, steps=replays)


def _editor(step: StepRow) -> str | None:
    """Who approved the step with arguments of their own, if someone did."""
    approval = step.approval or {}
    resolved = step.resolved_args
    if approval.get("decision") != "approved" or resolved is None:
        return None
    return str(approval.get("by")) if approval.get("args_hash") == args_hash(resolved) else None


def _ended(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: values[k] for k in ("error", "receipt", "output") if k in values}


def _render(receipt: Mapping[str, Any] | None, budget: int, handle: str) -> str | None:
    return None if receipt is None else render_receipt_dict(receipt, budget=budget, handle=handle)
