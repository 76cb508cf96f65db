"""Intake: a validated plan becomes a task, its steps, its first events and an audit row, in one
transaction (on Postgres one pipelined round trip and one commit, guards included).

An Idempotency-Key makes a submit safe to send again: the key is claimed with the task, so of
concurrent submits with one key exactly one creates the task and the others answer it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from agent_reach.ids import new_task_id, new_trace_id, step_idempotency_key
from agent_reach.states import StepStatus, TaskStatus, Transition
from agent_reach_controller.decide.outcomes import terminal_values
from agent_reach_controller.domain.records import StepChange, StepRow
from agent_reach_controller.planning.plan import Plan, RefusedCall
from agent_reach_controller.services.groups import GroupCommit, GroupFailed
from agent_reach_controller.services.handoff import HandOff, HandOffRefused
from agent_reach_controller.services.queries import read_view
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.unit_of_work import TaskWork, UnitOfWork
from agent_reach_controller.settings import DEFAULT_ENVIRONMENT, Environment
from agent_reach_controller.storage import advance_writes as writes_to
from agent_reach_controller.storage import catalog, idempotency
from agent_reach_controller.storage import events as event_log
from agent_reach_controller.storage.catalog import CatalogChangedError


class IdempotencyConflictError(Exception):
    """The Idempotency-Key was already used with a different request body."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"Idempotency-Key already used for task {task_id} with a different body")
        self.task_id = task_id


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitInput:
    plan: Plan
    request: dict[str, Any]
    principal: str = "anonymous"
    tenant: str = "default"
    key_id: str | None = None  # the API key that submitted it, checked again at dispatch
    idempotency_key: str | None = None
    trace_id: str | None = None
    parent_span_id: str | None = None
    task_id: str | None = None  # chosen by the caller (the API names its spans after it)
    # The catalogue revision the plan was validated against: if another replica changed the
    # catalogue since, the submit stores nothing and raises CatalogChangedError.
    catalog_revision: int | None = None
    # Where the task runs, as the plan was validated for it; None: the tenant's (the service's
    # `environment_of`).
    environment: Environment | None = None
    # Whose Idempotency-Keys `idempotency_key` is one of (the principal's unless given: a
    # trigger's events are `trigger:<name>`'s), and what a repeat must match (the request's
    # hash unless given: a trigger's run matches on the event, whatever its template became).
    key_scope: str | None = None
    fingerprint: str | None = None
    run_id: str | None = None  # the agent run this task is a round of (services/runs.py)

    @property
    def scope(self) -> str:
        return self.key_scope or self.principal

    def request_fingerprint(self) -> str:
        return self.fingerprint or request_hash(self.request)


@dataclass(frozen=True, slots=True, kw_only=True)
class Submitted:
    """The answer to a submit: which task, and whether this call created it."""

    task_id: str
    trace_id: str
    status: TaskStatus
    created: bool


def request_hash(body: Any) -> str:
    """A stable fingerprint of a request body (key order and spacing do not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# How many times a submit retries when the first holder of its Idempotency-Key vanishes between
# the conflict and the look-up (only if the key's record is deleted meanwhile).
_KEY_RACES = 3


# Group commit (see services/groups.py): transactions a replica's submits may have in flight
# before newcomers wait to share the next one, and how many may share it.
GROUP_OPEN = 1
GROUP_SIZE = 32


class IntakeService:
    """Creates tasks from validated plans."""

    def __init__(
        self,
        *,
        work: UnitOfWork,
        hand_off: HandOff | None = None,
        group_open: int = GROUP_OPEN,
        group_size: int = GROUP_SIZE,
        environment_of: Callable[[str], Environment] | None = None,
    ) -> None:
        self._work = work
        self._hand_off = hand_off
        # Where a tenant's tasks run (the policy's word, else the controller's); every submit
        # that does not say is stored with it.
        self._environment_of = environment_of or _everywhere_dev
        self._groups: GroupCommit[SubmitInput, Submitted] = GroupCommit(
            self._create,
            self._create_together,
            open=group_open,
            size=group_size,
            observe=work.metrics.submit_group,
            split=work.metrics.submit_group_split,
        )

    async def submit(self, data: SubmitInput) -> Submitted:
        """Persist a validated plan and make its first steps ready, in one transaction.

        With an Idempotency-Key another submit already holds, nothing is stored and the task
        of that first submit is answered (or IdempotencyConflictError for another body).
        """
        for _ in range(_KEY_RACES):
            try:
                return await self._groups(data)
            except idempotency.KeyTakenError:
                pass
            replayed = await self._replay(data)
            if replayed is not None:
                return replayed
        raise RuntimeError("an Idempotency-Key kept appearing and vanishing")  # pragma: no cover

    async def _replay(self, data: SubmitInput) -> Submitted | None:
        """The first submit's task for a key already used (None if that record is gone)."""
        assert data.idempotency_key is not None
        async with self._work.db.transaction() as conn:
            stored = await idempotency.load_idempotency_key(conn, data.scope, data.idempotency_key)
            if stored is None:
                return None
            stored_hash, stored_task = stored
            if stored_hash != data.request_fingerprint():
                raise IdempotencyConflictError(stored_task)
            existing = await read_view(conn, stored_task)
        return Submitted(
            task_id=stored_task,
            trace_id=existing.task.trace_id,
            status=existing.task.status,
            created=False,
        )

    async def _create(self, data: SubmitInput) -> Submitted:
        try:
            async with self._work.begin() as tx:
                made = await self._add(tx, data, hand_off=True)
        except HandOffRefused:  # a session ended, a tool paused, a claim left older steps: queue
            async with self._work.begin() as tx:
                made = await self._add(tx, data, hand_off=False)
        return made.submitted()

    async def _create_together(self, group: Sequence[SubmitInput]) -> list[Submitted]:
        """Create several tasks in one transaction. A refusal at commit, or any failure before
        it, wrote nothing: GroupFailed says each may run alone for its own answer."""
        keys = [(d.scope, d.idempotency_key) for d in group if d.idempotency_key is not None]
        if len(set(keys)) < len(keys):  # one of them answers the others: not in one transaction
            raise GroupFailed(ValueError("one Idempotency-Key twice in a group"))
        made: list[_Made] = []
        committing = False
        try:
            async with self._work.begin() as tx:
                for data in group:
                    made.append(await self._add(tx, data, hand_off=True))
                committing = True
        except (idempotency.KeyTakenError, CatalogChangedError, HandOffRefused) as refused:
            raise GroupFailed(refused) from refused
        except Exception as failed:
            if not committing:
                raise GroupFailed(failed) from failed
            raise  # the COMMIT may have landed: every member hears of it
        return [m.submitted() for m in made]

    async def add(self, tx: TaskWork, data: SubmitInput) -> str:
        """Add one task to a unit of work another use case opened (an agent run's round);
        returns its id."""
        return (await self._add(tx, data, hand_off=False)).task_id

    async def _add(self, tx: TaskWork, data: SubmitInput, *, hand_off: bool) -> _Made:
        """One task's rows, events and audit entry, added to the unit of work `tx` (its ready
        steps leased to waiting pollers, if `hand_off` and there are any)."""
        if data.environment is None:
            data = replace(data, environment=self._environment_of(data.tenant))
        task_id = data.task_id or new_task_id()
        now, conn = tx.now, tx.conn
        if data.idempotency_key is not None:
            await idempotency.claim_idempotency_key(
                conn,
                {
                    "principal": data.scope,
                    "key": data.idempotency_key,
                    "request_hash": data.request_fingerprint(),
                    "task_id": task_id,
                    "created_at": now,
                },
            )
        if data.catalog_revision is not None:
            await catalog.expect_revision(conn, data.catalog_revision)
        trace_id = data.trace_id or new_trace_id()
        await event_log.append_events(
            conn,
            [
                event_log.NewEvent(
                    task_id=task_id,
                    kind="task_created",
                    to_status=TaskStatus.PENDING,
                    data={
                        "goal": data.plan.goal,
                        "source": data.plan.source,
                        "steps": len(data.plan.steps),
                        "principal": data.principal,
                        "tenant": data.tenant,
                        "environment": data.environment,
                    },
                    created_at=now,
                )
            ],
        )
        await tx.audit(
            actor=data.principal,
            tenant=data.tenant,
            action="task.submit",
            target=f"task:{task_id}",
            data={
                "steps": len(data.plan.steps),
                "source": data.plan.source,
                "environment": data.environment,
            },
        )
        new = writes_to.NewTask(
            _task_row(data, task_id=task_id, trace_id=trace_id, now=now),
            step_rows(data, task_id, trace_id, now, self._work.registry),
        )
        if data.plan.refused:
            inserted = (new.step_row(key) for key, _ in new.rows())
            await new.change_steps(refusals(inserted, data.plan, self._work.registry, now), now=now)
        advanced = await tx.create(
            new, hand_off=self._hand_off.offer if hand_off and self._hand_off else None
        )
        return _Made(task_id, trace_id, advanced.task_status.get(task_id, TaskStatus.PENDING))


@dataclass(frozen=True, slots=True)
class _Made:
    task_id: str
    trace_id: str
    status: TaskStatus

    def submitted(self) -> Submitted:
        return Submitted(
            task_id=self.task_id, trace_id=self.trace_id, status=self.status, created=True
        )


def _task_row(data: SubmitInput, *, task_id: str, trace_id: str, now: datetime) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "trace_id": trace_id,
        "parent_span_id": data.parent_span_id,
        "status": TaskStatus.PENDING,
        "principal": data.principal,
        "tenant": data.tenant,
        "goal": data.plan.goal,
        "source": data.plan.source,
        # The webhook URL may carry a token: it is kept in its own column, not in the request
        # that replay and rerun show.
        "request": _without_webhook(data.request),
        "webhook_url": data.plan.webhook_url,
        "context": data.plan.context,
        "cancel_requested": False,
        "version": 1,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
        "deadline": now + timedelta(seconds=data.plan.deadline_s) if data.plan.deadline_s else None,
        "max_attempts": data.plan.max_attempts,
        "caps": data.plan.caps,
        "environment": data.environment,
    } | _unless_none(run_id=data.run_id, subject=data.plan.subject)


def _unless_none(**values: Any) -> dict[str, Any]:
    """Columns most tasks leave NULL, set only when given: a submit's INSERT keeps the columns
    (and the prepared statement) it had before they existed."""
    return {name: value for name, value in values.items() if value is not None}


def refusals(
    inserted: Iterable[StepRow], plan: Plan, registry: ToolRegistry, now: datetime
) -> list[StepChange]:
    """Each refused call's step (blocked, as inserted) failed, its receipt saying why."""
    refused = {r.step_id: r for r in plan.refused}
    changes = []
    for step in inserted:
        call = refused.get(step.step_id)
        if call is None:
            continue
        error = {"code": call.code.value, "message": call.reason(), "retryable": False}
        values = terminal_values(
            step,
            tool=registry.get(call.tool, call.tool_version),
            transition=Transition.FAIL,
            now=now,
            error=error,
        )
        problems = [
            {"pointer": p.pointer, "code": p.code, "detail": p.detail} for p in call.problems
        ]
        changes.append(
            StepChange(
                step=step,
                transition=Transition.FAIL,
                values=values,
                event_data={"error": error, "problems": problems},
            )
        )
    return changes


def step_rows(
    data: SubmitInput, task_id: str, trace_id: str, now: datetime, registry: ToolRegistry
) -> list[dict[str, Any]]:
    """The rows of a plan's steps (refused calls first, each about to fail), all blocked."""
    rows = [_refused_row(call, data, task_id, trace_id, now) for call in data.plan.refused]
    for step in data.plan.steps:
        tool = registry.get(step.tool, step.tool_version)
        rows.append(
            {
                "task_id": task_id,
                "step_id": step.step_id,
                "position": step.position,
                "trace_id": trace_id,
                "tool": step.tool,
                "tool_version": step.tool_version,
                "connector": tool.connector,
                "args": step.args,
                "depends_on": list(step.depends_on),
                "when_expr": step.when,
                "status": StepStatus.BLOCKED,
                "priority": step.priority,
                "tenant": data.tenant,
                "key_id": data.key_id,
                "environment": data.environment,
                "attempt": 1,
                "max_attempts": (step.retry or tool.retry).maximum_attempts,
                "retry": step.retry.model_dump(mode="json") if step.retry else None,
                "timeouts": (
                    step.timeouts.model_dump(mode="json", exclude_none=True)
                    if step.timeouts
                    else None
                ),
                "idempotency_key": step_idempotency_key(task_id, step.key_of or step.step_id),
                "run_at": step.run_at
                if step.delay_s is None
                else now + timedelta(seconds=step.delay_s),
                "created_at": now,
                "updated_at": now,
            }
        )
    return rows


def _refused_row(
    call: RefusedCall, data: SubmitInput, task_id: str, trace_id: str, now: datetime
) -> dict[str, Any]:
    """A refused call's step as inserted: blocked, about to fail (see `refusals`)."""
    return {
        "task_id": task_id,
        "step_id": call.step_id,
        "position": call.position,
        "trace_id": trace_id,
        "tool": call.tool,
        "tool_version": call.tool_version,
        "connector": call.connector,
        "args": call.args,
        "depends_on": [],
        "when_expr": None,
        "status": StepStatus.BLOCKED,
        "priority": 0,
        "tenant": data.tenant,
        "key_id": data.key_id,
        "environment": data.environment,
        "attempt": 1,
        "max_attempts": 1,
        "retry": None,
        "timeouts": None,
        "idempotency_key": step_idempotency_key(task_id, call.step_id),
        "created_at": now,
        "updated_at": now,
    }


def _everywhere_dev(_tenant: str) -> Environment:
    return DEFAULT_ENVIRONMENT


def _without_webhook(request: Any) -> Any:
    if isinstance(request, dict) and "webhook" in request:
        return {k: v for k, v in request.items() if k != "webhook"}
    return request
