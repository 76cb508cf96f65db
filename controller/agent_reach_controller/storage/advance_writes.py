"""Where an advance's decided transitions go: the stored rows at once (`Stored`), the stored rows
with the task statuses at commit (`AtCommit`), or a task not stored yet (`NewTask`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import TaskStatus, apply
from agent_reach_controller.domain.records import StepChange, StepRow, TaskRow
from agent_reach_controller.storage import hot
from agent_reach_controller.storage.commit import json_rows
from agent_reach_controller.storage.engine import TX_STATE_PREFIX, before_commit
from agent_reach_controller.storage.events import NewEvent, append_events
from agent_reach_controller.storage.schema import steps, tasks
from agent_reach_controller.storage.steps import change_steps, transition_event
from agent_reach_controller.storage.tasks import (
    finished_at,
    set_task_status,
    set_task_statuses,
    task_status_event,
)

# A transaction's task statuses to write at commit (`AtCommit`), by task.
_TASK_STATUSES = f"{TX_STATE_PREFIX}task_statuses"


class StepWrites(Protocol):
    """Where an advance's decided transitions go: the stored rows, or a task not yet stored."""

    async def change_steps(self, changes: Sequence[StepChange], *, now: datetime) -> set[int]: ...

    async def set_task_status(
        self, task: TaskRow, status: TaskStatus, *, now: datetime
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class Stored:
    """Transitions applied to stored rows: guarded UPDATEs inside the caller's transaction."""

    conn: AsyncConnection

    async def change_steps(self, changes: Sequence[StepChange], *, now: datetime) -> set[int]:
        return await change_steps(self.conn, changes, now=now)

    async def set_task_status(self, task: TaskRow, status: TaskStatus, *, now: datetime) -> bool:
        return await set_task_status(self.conn, task, status, now=now)


class TaskChangedError(Exception):
    """A locked task's row was not at the version it was read at when its status was written."""


@dataclass(frozen=True, slots=True)
class AtCommit(Stored):
    """As `Stored`, but each task's last status is written with the commit (on Postgres in the
    commit statement, no round trip of its own): for the advance a unit of work ends with, after
    which nothing in the transaction reads the task rows. The tasks must be locked."""

    async def set_task_status(self, task: TaskRow, status: TaskStatus, *, now: datetime) -> bool:
        conn = self.conn
        if conn.dialect.name != "postgresql":
            return await set_task_status(conn, task, status, now=now)
        pending: dict[str, dict[str, Any]] | None = conn.info.get(_TASK_STATUSES)
        if pending is None:
            pending = conn.info[_TASK_STATUSES] = {}
            before_commit(conn, _write_task_statuses)
        # The version read under the lock: a later status of the same task replaces this one.
        version = pending[task.task_id]["version"] if task.task_id in pending else task.version
        pending[task.task_id] = {
            "task_id": task.task_id,
            "version": version,
            "status": status,
            "now": now,
            "finished_at": finished_at(status, now),
        }
        await append_events(conn, [task_status_event(task.task_id, task.status, status, now=now)])
        return True


async def _write_task_statuses(conn: AsyncConnection) -> None:
    rows = list(conn.info.pop(_TASK_STATUSES, {}).values())
    set_task_statuses(conn, json_rows(rows), expected=len(rows), refusal=TaskChangedError)


class NewTask:
    """A task being submitted: its first advance is applied to the rows before they are written,
    so a submit inserts each row once, in its decided state, with the same events as an update.

    Steps get provisional keys (-1, -2, …) for the advance to name them by; the database assigns
    the real ones on `write`, and tells those of the steps named in `want_keys` (`keys`, by
    provisional key, once the commit statement has run).
    """

    def __init__(self, task: dict[str, Any], step_rows: Sequence[dict[str, Any]]) -> None:
        self.task = dict(task)
        self._steps = {-(i + 1): dict(row) for i, row in enumerate(step_rows)}
        self._events: list[NewEvent] = []
        self._wanted: set[int] = set()
        self.keys: dict[int, int] = {}

    def want_keys(self, provisional: Iterable[int]) -> None:
        """Learn the real keys of these steps when they are inserted (`keys`)."""
        self._wanted.update(provisional)

    def rows(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
        """Each step as decided so far, by provisional key (cheaper than `step_rows`)."""
        return iter(self._steps.items())

    def step_row(self, provisional: int, **values: Any) -> StepRow:
        """One step as decided, under its real key once known, with `values` on top."""
        blank = dict.fromkeys(steps.c.keys())
        key = self.keys.get(provisional, provisional)
        return StepRow.from_mapping({**blank, **self._steps[provisional], "id": key, **values})

    def task_row(self) -> TaskRow:
        return TaskRow.from_mapping(self.task)

    def step_rows(self) -> list[StepRow]:
        blank = dict.fromkeys(steps.c.keys())
        return [StepRow.from_mapping({**blank, **row, "id": k}) for k, row in self._steps.items()]

    async def change_steps(self, changes: Sequence[StepChange], *, now: datetime) -> set[int]:
        for change in changes:
            row = self._steps[change.step.id]
            if row["status"] != change.step.status:
                raise ValueError(f"step {change.step.step_id} is {row['status']}, not as decided")
            row.update(
                status=apply(change.step.status, change.transition),  # raises if illegal
                updated_at=now,
                **change.values,
            )
            self._events.append(transition_event(change, attempt=row["attempt"], now=now))
        return {c.step.id for c in changes}

    async def set_task_status(self, task: TaskRow, status: TaskStatus, *, now: datetime) -> bool:
        self.task.update(
            status=status,
            version=self.task["version"] + 1,
            updated_at=now,
            finished_at=finished_at(status, now),
        )
        self._events.append(task_status_event(task.task_id, task.status, status, now=now))
        return True

    async def write(self, conn: AsyncConnection) -> None:
        """Insert the task and its steps as decided, with their events, before the commit (on
        Postgres in the same round trip as the transaction's other buffered writes)."""
        before_commit(conn, self._insert)
        await append_events(conn, self._events)

    async def _insert(self, conn: AsyncConnection) -> None:
        rows = [row for key, row in self._steps.items() if key not in self._wanted]
        wanted = {self._steps[key]["step_id"]: key for key in self._wanted}  # by step id
        if conn.dialect.name == "postgresql":
            hot.insert_rows(conn, "tasks", [self.task])
            hot.insert_rows(conn, "steps", rows)
            if wanted:

                def learn(found: list[tuple[str, str, int]]) -> None:
                    self.keys.update((wanted[step_id], key) for _, step_id, key in found)

                hot.insert_steps_keyed(conn, [self._steps[k] for k in wanted.values()], learn)
            return
        await conn.execute(tasks.insert().values(**self.task))
        for group in hot.by_columns(rows).values():  # an advance sets some columns on some rows
            await conn.execute(steps.insert(), list(group))
        for provisional in wanted.values():
            inserted = steps.insert().values(**self._steps[provisional]).returning(steps.c.id)
            self.keys[provisional] = (await conn.execute(inserted)).scalar_one()
