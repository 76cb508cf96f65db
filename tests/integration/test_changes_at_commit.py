"""Changes that cannot lose, written with the commit (Postgres).

A unit of work begun `certain` that holds every step of its tasks, read under their locks,
writes its changes in the commit statement, as its guard: one round trip fewer for a report.
These check the three things that make that safe: the change really goes with the commit, a
read or a change later in the unit sees it, and a step that moved anyway (a writer that broke
the rule and did not lock the task) makes the unit write nothing, and `UnitOfWork.run` try again
the usual way.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from agent_reach.states import StepStatus, TaskStatus
from agent_reach_controller.decide.outcomes import decide_result
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.services.unit_of_work import TaskWork
from agent_reach_controller.storage.steps import StepMovedError
from tests.integration.stack import components_for, ok, write_tools
from tests.support.pgwire import PgWire

CHAIN = {
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {}},
        {"step_id": "b", "tool": "echo.say", "args": {}, "depends_on": ["a"]},
    ]
}


async def started(c: Components) -> tuple[str, StepRow, StepRow]:
    """A two-step chain: `a` leased (running), `b` blocked on it."""
    submitted = await c.intake.submit(SubmitInput(plan=parse_plan(CHAIN, c.catalog), request=CHAIN))
    (a,) = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5)
    (b,) = [s for s in (await c.queries.get(submitted.task_id)).steps if s.step_id == "b"]
    return submitted.task_id, a, b


async def succeed(tx: TaskWork, step: StepRow) -> set[int]:
    now = tx.steps[step.id]
    return await tx.change([decide_result(now, ok(now, "out"), await tx.decision(now))])


def behind_the_lock(url: str, step: StepRow) -> None:
    """What a writer that does not lock the task could do: re-lease the step, as attempt 2."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE steps SET attempt = attempt + 1 WHERE id = %s", (step.id,))


async def statuses(c: Components, task_id: str) -> dict[str, StepStatus]:
    return {s.step_id: s.status for s in (await c.queries.get(task_id)).steps}


async def test_the_change_goes_in_the_commit_statement(postgres_url: str, tmp_path: Path) -> None:
    server = urlsplit(postgres_url)
    with PgWire((server.hostname or "127.0.0.1", server.port or 5432)) as wire:
        async with components_for(wire.url(postgres_url), write_tools(tmp_path)) as c:
            body = {"steps": [CHAIN["steps"][0]]}
            task_id = (
                await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
            ).task_id
            (a,) = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5)
            mark = wire.mark()
            async with c.work.begin(certain=True) as tx:
                await tx.lock_steps([a.id])  # every step of the task: held whole
                assert await succeed(tx, a) == {a.id}
            journal = wire.since(mark).journal
            view = await c.queries.get(task_id)
    assert [s.sql.split()[0] for s in journal] == ["BEGIN", "SELECT", "SELECT", "WITH", "COMMIT"]
    (commit_statement,) = [s.sql for s in journal if "UPDATE steps" in s.sql]
    assert "UPDATE tasks" in commit_statement  # with the task's status its advance decided
    assert (view.steps[0].status, view.task.status) == (StepStatus.SUCCEEDED, TaskStatus.SUCCEEDED)


async def test_a_change_later_in_the_unit_sends_it_first(postgres_url: str, tmp_path: Path) -> None:
    """The advance that unblocks `b` changes steps before the commit: `a`'s change goes ahead of
    it (in the same round trip), so the rows never disagree."""
    async with components_for(postgres_url, write_tools(tmp_path)) as c:
        task_id, a, b = await started(c)
        async with c.work.begin(certain=True) as tx:
            await tx.lock_steps([a.id, b.id])
            await succeed(tx, a)
        assert await statuses(c, task_id) == {"a": StepStatus.SUCCEEDED, "b": StepStatus.READY}
        (second,) = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5)
        async with c.work.begin(certain=True) as tx:
            await tx.lock_steps([a.id, second.id])
            await succeed(tx, second)
        assert (await c.queries.get(task_id)).task.status is TaskStatus.SUCCEEDED


async def test_a_read_later_in_the_unit_sees_the_change(postgres_url: str, tmp_path: Path) -> None:
    async with components_for(postgres_url, write_tools(tmp_path)) as c:
        task_id, a, b = await started(c)
        async with c.work.begin(certain=True) as tx:
            await tx.lock_steps([a.id, b.id])
            await succeed(tx, a)
            seen = {s.step_id: s.status for s in await tx.steps_of(task_id)}
        assert seen == {"a": StepStatus.SUCCEEDED, "b": StepStatus.BLOCKED}
        assert await statuses(c, task_id) == {"a": StepStatus.SUCCEEDED, "b": StepStatus.READY}


async def test_a_step_moved_without_its_tasks_lock_makes_the_unit_write_nothing(
    postgres_url: str, tmp_path: Path
) -> None:
    async with components_for(postgres_url, write_tools(tmp_path)) as c:
        task_id, a, b = await started(c)
        events = await c.queries.events(task_id)

        async def lose() -> None:
            async with c.work.begin(certain=True) as tx:
                await tx.lock_steps([a.id, b.id])
                behind_the_lock(postgres_url, a)
                assert await succeed(tx, a) == {a.id}  # assumed: the commit checks it

        with pytest.raises(StepMovedError):
            await lose()
        assert await c.queries.events(task_id) == events
        view = await c.queries.get(task_id)
        assert {(s.step_id, s.status, s.attempt) for s in view.steps} == {
            ("a", StepStatus.RUNNING, 2),  # as the other writer left it
            ("b", StepStatus.BLOCKED, 1),
        }
        assert view.task.status is TaskStatus.RUNNING


async def test_run_tries_again_sending_each_change_as_it_is_made(
    postgres_url: str, tmp_path: Path
) -> None:
    async with components_for(postgres_url, write_tools(tmp_path)) as c:
        task_id, a, b = await started(c)
        tries: list[int] = []

        async def body(tx: TaskWork) -> set[int]:
            await tx.lock_steps([a.id, b.id])
            if not tries:
                behind_the_lock(postgres_url, a)  # after the read: the first try loses
            tries.append(tx.steps[a.id].attempt)
            return await succeed(tx, a)  # the result of whatever attempt was read

        assert await c.work.run(body) == {a.id}
        assert tries == [1, 2]
        assert await statuses(c, task_id) == {"a": StepStatus.SUCCEEDED, "b": StepStatus.READY}
        kinds = [e.kind for e in await c.queries.events(task_id) if e.step_id == "a"]
        assert kinds.count("succeed") == 1, kinds
