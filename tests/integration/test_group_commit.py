"""Group commit: submits that arrive while the replica's transactions are busy share one.

What it must keep: every member gets the answer it would have got alone. One member's refusal (an
Idempotency-Key used with another body, a catalogue that changed under it) never fails the others
in its group; they are created, with their events and audit rows, exactly once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.services.intake import (
    IdempotencyConflictError,
    IntakeService,
    SubmitInput,
    Submitted,
)
from agent_reach_controller.storage.catalog import CatalogChangedError
from tests.integration.stack import components_for, write_tools

N = 6


def _body(i: int) -> dict[str, Any]:
    return {"goal": f"g{i}", "steps": [{"step_id": "a", "tool": "echo.say", "args": {"n": i}}]}


async def _all(intake: IntakeService, inputs: list[SubmitInput]) -> list[Submitted | BaseException]:
    """Submit concurrently: the first runs alone (`group_open=1`) and holds the replica's one
    transaction; the others, started before it can finish, wait and share the next one."""
    return await asyncio.gather(*(intake.submit(d) for d in inputs), return_exceptions=True)


async def test_waiting_submits_share_one_transaction_and_each_gets_its_task(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        intake = IntakeService(work=c.work, group_open=1)
        inputs = [
            SubmitInput(
                plan=parse_plan(_body(i), c.catalog),
                request=_body(i),
                idempotency_key=f"k{i}" if i % 2 else None,
                catalog_revision=c.registry.revision,
            )
            for i in range(N)
        ]
        answers = await _all(intake, inputs)
        assert intake._groups.stats.sizes == {1: 1, N - 1: 1}
        assert c.metrics.total("agent_reach_submit_group_size_count") == 2
        made = [a for a in answers if isinstance(a, Submitted)]
        assert len(made) == N
        assert all(a.created for a in made)
        assert len({a.task_id for a in made}) == N
        for i, answer in enumerate(made):
            view = await c.queries.get(answer.task_id)
            assert view.task.goal == f"g{i}"
            assert [s.args for s in view.steps] == [{"n": i}]
            kinds = [e.kind for e in await c.queries.events(answer.task_id)]
            assert kinds[0] == "task_created"
        # Each key names its own task: submitting one again answers it, creating nothing.
        again = await c.intake.submit(inputs[1])
        assert (again.task_id, again.created) == (made[1].task_id, False)


async def test_one_refused_member_never_fails_the_others(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        intake = IntakeService(work=c.work, group_open=1)
        first = await c.intake.submit(
            SubmitInput(plan=parse_plan(_body(0), c.catalog), request=_body(0), idempotency_key="k")
        )
        stale = c.registry.revision - 1
        inputs = [
            SubmitInput(plan=parse_plan(_body(i), c.catalog), request=_body(i))
            for i in range(1, N + 1)
        ]
        # Member 2 reuses the key with another body (a 409); member 4 was validated against a
        # catalogue that has changed since (the API validates again and retries).
        inputs[2] = SubmitInput(plan=inputs[2].plan, request=inputs[2].request, idempotency_key="k")
        inputs[4] = SubmitInput(
            plan=inputs[4].plan, request=inputs[4].request, catalog_revision=stale
        )
        answers = await _all(intake, inputs)
        assert isinstance(answers[2], IdempotencyConflictError)
        assert answers[2].task_id == first.task_id
        assert isinstance(answers[4], CatalogChangedError)
        made = [a for i, a in enumerate(answers) if i not in (2, 4)]
        assert all(isinstance(a, Submitted) and a.created for a in made)
        assert intake._groups.stats.split == 1
        assert c.metrics.total("agent_reach_submit_groups_split_total") == 1
        goals = set()
        for answer in made:
            assert isinstance(answer, Submitted)
            goals.add((await c.queries.get(answer.task_id)).task.goal)
        assert goals == {"g1", "g2", "g4", "g6"}  # inputs 2 and 4 were g3 and g5
        listed = await c.queries.list_tasks(limit=100)
        assert len(listed) == 1 + len(made)  # nothing of the refused ones, nothing twice


@pytest.mark.parametrize("same_body", [True, False])
async def test_one_key_twice_in_a_group_creates_one_task(
    database_url: str, tmp_path: Path, same_body: bool
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        intake = IntakeService(work=c.work, group_open=1)
        bodies = [_body(0), _body(1), _body(1 if same_body else 2)]
        inputs = [
            SubmitInput(
                plan=parse_plan(b, c.catalog), request=b, idempotency_key=None if i == 0 else "k"
            )
            for i, b in enumerate(bodies)
        ]
        answers = await _all(intake, inputs)
        assert isinstance(answers[1], Submitted)
        assert answers[1].created
        if same_body:
            assert isinstance(answers[2], Submitted)
            assert (answers[2].task_id, answers[2].created) == (answers[1].task_id, False)
        else:
            assert isinstance(answers[2], IdempotencyConflictError)
