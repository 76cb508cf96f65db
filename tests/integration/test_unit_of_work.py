"""The unit of work: a change commits with its advance and is announced after, or not at all.

`TaskWork` is the one sequence every step change goes through (lock, apply, advance, announce at
commit). These drive it directly, on both backends: a unit that raises must leave the rows, the
event log and the wake-ups exactly as they were; one that ends must have advanced the tasks it
moved without being asked, and woken the pollers only once committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_reach.states import StepStatus
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
