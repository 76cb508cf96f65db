"""Hypothesis drives random operations through the real store; the event log must stay legal.

Every status change is read back from the append-only event log and checked against the table:
each recorded edge is legal, each step's events chain (from = previous to), nothing follows a
terminal state, and attempts never exceed the policy.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent_reach.states import TERMINAL_STEP_STATES, StepStatus, is_legal
from agent_reach_controller.db import migrate
from agent_reach_controller.db.schema import events, steps
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components, open_components
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.state.tasks import SubmitInput
from tests.integration.stack import failed, ok, write_tools

_TEMPLATE: dict[str, Path] = {}


def _template_db() -> Path:
    if "db" not in _TEMPLATE:
        directory = Path(tempfile.mkdtemp(prefix="reach-prop-"))
        path = directory / "template.db"
        migrate.upgrade(f"sqlite:///{path}")
        _TEMPLATE["db"] = path
        _TEMPLATE["tools"] = write_tools(directory)
    return _TEMPLATE["db"]


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        template = _template_db()
        self.dir = Path(tempfile.mkdtemp(prefix="reach-prop-run-"))
        db = self.dir / "run.db"
        shutil.copy(template, db)
        self.loop = asyncio.new_event_loop()
        self.c: Components = self.loop.run_until_complete(
            open_components(
                ControllerSettings(database_url=f"sqlite:///{db}", tools=[_TEMPLATE["tools"]])
            )
        )
        self.held: list[Any] = []
        self.stale: list[Any] = []
        self.tasks: list[str] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.c.close())
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        size=st.integers(1, 4), chained=st.booleans(), when=st.sampled_from([None, "true", "false"])
    )
    def submit(self, size: int, chained: bool, when: str | None) -> None:
        body_steps = []
        for i in range(size):
            step: dict[str, Any] = {"step_id": f"s{i}", "tool": "echo.say", "args": {}}
            if chained and i:
                step["depends_on"] = [f"s{i - 1}"]
                if when:
                    step["when"] = when
            body_steps.append(step)
        body = {"steps": body_steps}
        view, _ = self.run(
            self.c.tasks.submit(SubmitInput(plan=parse_plan(body, self.c.catalog), request=body))
        )
        self.tasks.append(view.task.task_id)

    @rule(limit=st.integers(1, 5))
    def claim(self, limit: int) -> None:
        self.held.extend(
            self.run(self.c.dispatch.claim(executor_id="e", connectors=["echo"], limit=limit))
        )

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "retryable", "fatal"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        step = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        result = (
            ok(step, {"n": 1})
            if outcome == "ok"
            else failed(step, "boom", retryable=outcome == "retryable")
        )
        self.run(self.c.dispatch.report(executor_id="e", results=[result]))
        self.stale.append(step)

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def report_again(self, data: st.DataObject) -> None:
        step = self.stale[data.draw(st.integers(0, len(self.stale) - 1))]
        acks = self.run(self.c.dispatch.report(executor_id="e", results=[ok(step, {"late": True})]))
        assert not acks[0].accepted

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def expire_lease(self, data: st.DataObject) -> None:
        step = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))

        async def expire() -> None:
            async with self.c.db.transaction() as conn:
                await conn.execute(
                    sa.update(steps)
                    .where(steps.c.id == step.id, steps.c.status == "running")
                    .values(lease_expires_at=sa.func.datetime("now", "-1 minute"))
                )
            await self.c.dispatch.reap_expired()

        self.run(expire())
        self.stale.append(step)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = self.tasks[data.draw(st.integers(0, len(self.tasks) - 1))]
        self.run(self.c.tasks.cancel(task_id))

    @invariant()
    def event_log_is_legal(self) -> None:
        async def read() -> tuple[list[Any], dict[Any, Any]]:
            async with self.c.db.transaction() as conn:
                rows = (
                    (
                        await conn.execute(
                            sa.select(events)
                            .where(events.c.step_id.is_not(None), events.c.to_status.is_not(None))
                            .order_by(events.c.id)
                        )
                    )
                    .mappings()
                    .all()
                )
                limits = {
                    (r["task_id"], r["step_id"]): (r["attempt"], r["max_attempts"], r["status"])
                    for r in (await conn.execute(sa.select(steps))).mappings()
                }
            return list(rows), limits

        rows, limits = self.run(read())
        last: dict[tuple[str, str], str] = defaultdict(lambda: "blocked")
        for row in rows:
            key = (row["task_id"], row["step_id"])
            src, dst = StepStatus(row["from_status"]), StepStatus(row["to_status"])
            assert StepStatus(last[key]) not in TERMINAL_STEP_STATES, f"event after terminal: {row}"
            assert src.value == last[key], f"broken chain for {key}: {row}"
            assert is_legal(src, dst), f"illegal edge {src} -> {dst}"
            last[key] = dst.value
        for key, (attempt, max_attempts, status) in limits.items():
            assert attempt <= max_attempts
            assert status == last[key]


StoreMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStoreMachine = StoreMachine.TestCase
