"""The unit of work: a change commits with its advance and is announced after, or not at all.

`TaskWork` is the one sequence every step change goes through (lock, apply, advance, announce at
commit). These drive it directly, on both backends: a unit that raises must leave the rows, the
event log and the wake-ups exactly as they were; one that ends must have advanced the tasks it
moved without being asked, and woken the pollers only once committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_reach.states import StepStatus, TaskStatus
from agent_reach_controller.decide.outcomes import decide_result
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.storage.wakeups import ready_key
from tests.integration.stack import components_for, ok, write_tools

CHAIN = {
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {}},
        {"step_id": "b", "tool": "echo.say", "args": {}, "depends_on": ["a"]},
    ]
}
READY = [ready_key("echo")]


class Boom(Exception):
    pass


async def started(c: Components) -> tuple[str, StepRow]:
    """A two-step chain whose first step is leased (running), the second blocked on it."""
    submitted = await c.intake.submit(SubmitInput(plan=parse_plan(CHAIN, c.catalog), request=CHAIN))
    (step,) = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5)
    return submitted.task_id, step


async def finish(c: Components, step: StepRow, *, then_raise: bool = False) -> None:
    """Apply a success for `step` in a unit of work; with `then_raise`, advance and raise."""
    async with c.work.begin() as tx:
        current = await tx.lock_steps([step.id])
        now = current[step.id]
        assert await tx.change([decide_result(now, ok(now, "out"), await tx.decision(now))])
        if then_raise:
            await tx.advance()  # b is ready inside the transaction...
            raise Boom  # ...and never outside it


async def test_a_unit_that_raises_leaves_rows_events_and_wakeups_untouched(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        task_id, step = await started(c)
        events = await c.queries.events(task_id)
        woken = c.notifier.snapshot(READY)

        with pytest.raises(Boom):
            await finish(c, step, then_raise=True)

        view = await c.queries.get(task_id)
        assert {s.step_id: s.status for s in view.steps} == {
            "a": StepStatus.RUNNING,
            "b": StepStatus.BLOCKED,
        }
        assert await c.queries.events(task_id) == events
        assert c.notifier.snapshot(READY) == woken


async def test_a_unit_that_moves_steps_advances_before_commit_and_wakes_after(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        task_id, step = await started(c)
        woken = c.notifier.snapshot(READY)

        await finish(c, step)  # no explicit advance: the unit does it because a step moved

        view = await c.queries.get(task_id)
        assert {s.step_id: s.status for s in view.steps} == {
            "a": StepStatus.SUCCEEDED,
            "b": StepStatus.READY,
        }
        assert c.notifier.snapshot(READY) != woken
        (second,) = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5)
        assert second.step_id == "b"
        await finish(c, second)
        assert (await c.queries.get(task_id)).task.status.value == "succeeded"


WIDE = {
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {}},
        {"step_id": "b", "tool": "echo.say", "args": {}},
        {
            "step_id": "c",
            "tool": "echo.say",
            "depends_on": ["a", "b"],
            "args": {"text": "$a.output.word", "n": "$b.output.n"},
        },
    ]
}


@pytest.mark.parametrize("budget", [3, 2])
async def test_a_unit_holding_every_step_of_a_task_advances_it_as_if_it_read_them(
    database_url: str, tmp_path: Path, budget: int
) -> None:
    """A unit that locked every step of a task advances it on the rows it read, as its changes
    left them (Postgres; SQLite reads the task's steps again): the dependant resolves both
    outputs, and the budget counts both attempts (2 of 3 held: c starts; 2 of 2: it cannot)."""
    body = {**WIDE, "budget": {"max_attempts": budget}}
    async with components_for(database_url, write_tools(tmp_path)) as c:
        plan = parse_plan(body, c.catalog)
        task_id = (await c.intake.submit(SubmitInput(plan=plan, request=body))).task_id
        a, b = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5)
        keys = [s.id for s in (await c.queries.get(task_id)).steps]  # c, blocked, among them
        async with c.work.begin() as tx:
            current = await tx.lock_steps(keys)
            changes = [
                decide_result(now, ok(now, output), await tx.decision(now))
                for now, output in ((current[a.id], {"word": "hi"}), (current[b.id], {"n": 3}))
            ]
            assert len(await tx.change(changes)) == 2

        view = await c.queries.get(task_id)
        third = view.steps[2]
        if budget == 3:
            assert (third.status, third.resolved_args) == (StepStatus.READY, {"text": "hi", "n": 3})
            assert view.task.status is TaskStatus.RUNNING
        else:
            assert third.status is StepStatus.FAILED
            assert third.receipt is not None
            assert third.receipt["error"]["code"] == "budget_exhausted"
            assert view.task.status is TaskStatus.FAILED
