"""Leases this replica handed out, remembered until their results come back.

A report reads, under its task's lock, the rows it decides on: the task and its steps. For a
task of one step leased by this replica (handed to a waiting poll, services/handoff.py, or
claimed by a claim that started the task, which gives back the task's row), the replica already
knows both, as the lease left them. A report it takes of that step uses those rows instead, if
they accept it, with no read of its own. Its commit locks the task ahead of any write and checks
that nothing changed the task since (`storage.locks.expect_unchanged`: its version, which every
change of a task's status bumps, and no cancel asked for), as the step's change is checked on
the step's status and attempt. If anything did, nothing is written and the report is decided
again on rows read under the lock (`UnitOfWork.run`), so the verdict is always the one a locked
read would have given. A refusal is always decided on a locked read (see `HeldLeases.take`).

Rows are kept for tasks whose steps no one else adds to (no agent run's round, none of the
model steps an agent run has) and whose end writes nothing but the task (no webhook); they are
forgotten once their report arrives, and a lease never reported (its executor went away) when
`capacity` newer ones push it out. Another replica's report of a step leased here reads under
the lock as always.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_reach.states import StepStatus, TaskStatus
from agent_reach_controller.domain.records import StepRow, TaskRow
from agent_reach_controller.tools.agents import MODEL_CONNECTOR


class HeldRowsChanged(Exception):
    """A task known from its lease changed before the commit of a report decided on it:
    nothing was written (the report is decided again on rows read under the lock)."""


# Leases kept at most. An entry of a small task is ~1.8 KB; entries linger only when reports go
# to another replica or never come, so this bounds what they can hold (~4 MB for small tasks).
CAPACITY = 2048


class HeldLeases:
    """The task and step rows of recent leases of one-step tasks, by step key."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._rows: dict[int, tuple[TaskRow, StepRow]] = {}
        self.taken = 0  # reports that used remembered rows
        self.missed = 0  # reports with rows kept that could not use them
        self.refused = 0  # reports whose commit found a task changed (decided again, locked)

    def __len__(self) -> int:
        return len(self._rows)

    def remember(self, task: TaskRow, step: StepRow) -> None:
        """Keep the rows of a lease just committed: `step` as leased, `task` as that commit
        left it, the task's only step."""
        if (
            task.run_id is not None
            or task.webhook_url is not None
            or task.cancel_requested
            or task.status is not TaskStatus.RUNNING
            or step.status is not StepStatus.RUNNING
            or step.connector == MODEL_CONNECTOR
            or step.task_id != task.task_id
        ):
            return
        rows = self._rows
        rows.pop(step.id, None)
        if len(rows) >= self._capacity:
            del rows[next(iter(rows))]  # the oldest
        rows[step.id] = (task, step)

    def get(self, key: int) -> tuple[TaskRow, StepRow] | None:
        """The rows kept for this step, if any (they stay kept)."""
        return self._rows.get(key)

    def take(
        self, reported: Sequence[tuple[int, int]], holder: str
    ) -> tuple[dict[str, TaskRow], dict[int, StepRow]] | None:
        """The rows of the steps of these (step key, attempt) results, forgotten here; None
        unless each was kept, still at that attempt and leased to `holder`.

        Only results their rows would accept are decided on kept rows: the commit checks what a
        report changes, not what it refuses, so a refusal is always decided on rows read under
        the lock (the step may have been leased again since, to someone else or at a new
        attempt, without its task changing)."""
        found = [self._rows.pop(key, None) for key, _ in reported]
        usable = len({key for key, _ in reported}) == len(reported) and all(
            held is not None and held[1].attempt == attempt and held[1].lease_owner == holder
            for held, (_, attempt) in zip(found, reported, strict=True)
        )
        if not usable:
            self.missed += any(f is not None for f in found)
            return None
        self.taken += 1
        tasks: dict[str, TaskRow] = {}
        steps: dict[int, StepRow] = {}
        for held in found:
            assert held is not None
            task, step = held
            tasks[task.task_id] = task
            steps[step.id] = step
        return tasks, steps
