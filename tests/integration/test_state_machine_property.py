"""Hypothesis drives random operations through the real store; the event log must stay legal.

Every status change is read back from the append-only event log and checked against the table:
each recorded edge is legal, each step's events chain (from = previous to), nothing follows a
terminal state, and attempts never exceed the policy.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agent_reach.states import TERMINAL_STEP_STATES, StepStatus, is_legal
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components, open_components
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.services.operator import ResolveInput
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.storage import migrate
from agent_reach_controller.storage.schema import events, steps
from tests.conftest import POSTGRES_ADMIN
from tests.integration.stack import failed, ok, write_tools

_SHARED: dict[str, Any] = {}


def _tools() -> Path:
    if "tools" not in _SHARED:
        _SHARED["tools"] = write_tools(Path(tempfile.mkdtemp(prefix="reach-prop-")))
    tools: Path = _SHARED["tools"]
    return tools


class StoreMachine(RuleBasedStateMachine):
    """The rules and the invariant; subclasses say which database each example gets."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.c: Components = self.loop.run_until_complete(
            open_components(ControllerSettings(database_url=self.make_database(), tools=[_tools()]))
        )
        self.held: list[Any] = []
        self.stale: list[Any] = []
        self.tasks: list[str] = []

    def make_database(self) -> str:
        raise NotImplementedError

    def drop_database(self) -> None:
        raise NotImplementedError

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.c.close())
        self.loop.close()
        self.drop_database()

    @rule(
        size=st.integers(1, 4),
        chained=st.booleans(),
        when=st.sampled_from([None, "true", "false"]),
        idempotent=st.booleans(),
    )
    def submit(self, size: int, chained: bool, when: str | None, idempotent: bool) -> None:
        body_steps = []
        for i in range(size):
            step: dict[str, Any] = (
                {"step_id": f"s{i}", "tool": "echo.say", "args": {}}
                if idempotent
                else {"step_id": f"s{i}", "tool": "echo.count", "args": {"n": i}}
            )
            if chained and i:
                step["depends_on"] = [f"s{i - 1}"]
                if when:
                    step["when"] = when
            body_steps.append(step)
        body = {"steps": body_steps}
        submitted = self.run(
            self.c.intake.submit(SubmitInput(plan=parse_plan(body, self.c.catalog), request=body))
        )
        self.tasks.append(submitted.task_id)

    @rule(limit=st.integers(1, 5))
    def claim(self, limit: int) -> None:
        self.run(self._all_due())
        self.held.extend(
            self.run(self.c.leasing.claim(executor_id="e", connectors=["echo"], limit=limit))
        )

    async def _all_due(self) -> None:
        """Wait until every ready step is due (a retry waits out a 10 ms backoff first). What a
        claim leases then depends on the rules drawn, not on how fast they ran: Hypothesis
        replays an example expecting the same rules enabled at each step."""
        async with self.c.db.transaction() as conn:
            latest = await conn.scalar(
                sa.select(sa.func.max(steps.c.not_before)).where(steps.c.status == "ready")
            )
        if latest is None:
            return
        due = latest if latest.tzinfo else latest.replace(tzinfo=UTC)
        wait = (due - datetime.now(UTC)).total_seconds()
        assert wait < 5, f"a ready step is due only in {wait:.1f} s"
        if wait > 0:
            await asyncio.sleep(wait + 0.001)  # until the time it is due, not a guess

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "retryable", "fatal", "ambiguous"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        step = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        if outcome == "ok":
            result = ok(step, {"n": 1})
        elif outcome == "ambiguous":
            result = failed(step, "timeout", retryable=True, maybe_applied=True)
        else:
            result = failed(step, "boom", retryable=outcome == "retryable")
        self.run(self.c.reporting.report(executor_id="e", results=[result]))
        self.stale.append(step)

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def report_again(self, data: st.DataObject) -> None:
        step = self.stale[data.draw(st.integers(0, len(self.stale) - 1))]
        acks = self.run(
            self.c.reporting.report(executor_id="e", results=[ok(step, {"late": True})])
        )
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
                    .values(lease_expires_at=datetime.now(UTC) - timedelta(minutes=1))
                )
            await self.c.expiry.reap_expired()

        self.run(expire())
        self.stale.append(step)

    @rule(data=st.data(), action=st.sampled_from(["retry", "succeeded", "failed"]))
    def resolve(self, data: st.DataObject, action: str) -> None:
        async def unknown() -> list[Any]:
            async with self.c.db.transaction() as conn:
                query = sa.select(steps.c.task_id, steps.c.step_id).where(
                    steps.c.status == "outcome_unknown"
                )
                return list((await conn.execute(query)).all())

        waiting = self.run(unknown())
        if not waiting:
            return
        task_id, step_id = waiting[data.draw(st.integers(0, len(waiting) - 1))]
        verdict = ResolveInput(task_id=task_id, step_id=step_id, action=action, by="prop")
        self.run(self.c.operator.resolve(verdict))

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = self.tasks[data.draw(st.integers(0, len(self.tasks) - 1))]
        self.run(self.c.operator.cancel(task_id))

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


class SqliteStoreMachine(StoreMachine):
    def make_database(self) -> str:
        if "sqlite" not in _SHARED:
            template = Path(tempfile.mkdtemp(prefix="reach-prop-")) / "template.db"
            migrate.upgrade(f"sqlite:///{template}")
            _SHARED["sqlite"] = template
        self.dir = Path(tempfile.mkdtemp(prefix="reach-prop-run-"))
        shutil.copy(_SHARED["sqlite"], self.dir / "run.db")
        return f"sqlite:///{self.dir}/run.db"

    def drop_database(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class PostgresStoreMachine(StoreMachine):
    """The same rules on Postgres, where transitions are applied set-based."""

    template: str = ""

    def make_database(self) -> str:
        self.name = f"reach_prop_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}" TEMPLATE "{self.template}"')
        return POSTGRES_ADMIN.rsplit("/", 1)[0] + f"/{self.name}"

    def drop_database(self) -> None:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


PROPERTY_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSqliteStoreMachine = SqliteStoreMachine.TestCase
TestSqliteStoreMachine.settings = PROPERTY_SETTINGS


def test_postgres_store_machine(postgres_template: str) -> None:
    PostgresStoreMachine.template = postgres_template
    run_state_machine_as_test(PostgresStoreMachine, settings=PROPERTY_SETTINGS)
