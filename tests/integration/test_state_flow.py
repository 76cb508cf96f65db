"""The state machine end to end through the use cases, on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_reach.states import StepStatus, TaskStatus
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import IdempotencyConflictError, SubmitInput
from tests.integration.stack import components_for, failed, ok, submit, write_tools
from tests.integration.test_unit_of_work import WIDE

ONE_STEP = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}


def chain_plan(when: str = "steps.a.output.go == true") -> dict:
    return {
        "goal": "two steps",
        "steps": [
            {"step_id": "a", "tool": "echo.say", "args": {"text": "hi"}},
            {
                "step_id": "b",
                "tool": "echo.say",
                "depends_on": ["a"],
                "when": when,
                "args": {"text": "$a.output.word"},
            },
        ],
    }


async def run_all(c: Components, outputs: dict[str, object], *, executor: str = "x1") -> None:
    """Claim and succeed ready steps until none are left, answering with `outputs[step_id]`."""
    for _ in range(20):
        claimed = await c.leasing.claim(executor_id=executor, connectors=["echo"], limit=10)
        if not claimed:
            return
        acks = await c.reporting.report(
            executor_id=executor, results=[ok(s, outputs[s.step_id]) for s in claimed]
        )
        assert all(a.accepted for a in acks)
    raise AssertionError("steps kept coming")


async def test_dependant_runs_with_resolved_reference(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, chain_plan()))
        assert [s.status for s in view.steps] == [StepStatus.READY, StepStatus.BLOCKED]
        claimed = await c.leasing.claim(executor_id="x1", connectors=["echo"], limit=10)
        assert [s.step_id for s in claimed] == ["a"]
        await c.reporting.report(
            executor_id="x1", results=[ok(claimed[0], {"go": True, "word": "yo"})]
        )
        claimed = await c.leasing.claim(executor_id="x1", connectors=["echo"], limit=10)
        assert [s.step_id for s in claimed] == ["b"]
        assert claimed[0].resolved_args == {"text": "yo"}
        await c.reporting.report(executor_id="x1", results=[ok(claimed[0], {"said": "yo"})])
        final = await c.queries.get(view.task.task_id)
        assert final.task.status is TaskStatus.SUCCEEDED
        assert [s.receipt["status"] for s in final.steps] == ["succeeded", "succeeded"]
        assert final.steps[1].receipt["meta"]["idempotency_key"] == f"{view.task.task_id}:b"


async def test_false_condition_skips_and_task_succeeds(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, chain_plan()))
        await run_all(c, {"a": {"go": False, "word": "no"}})
        final = await c.queries.get(view.task.task_id)
        assert [s.status for s in final.steps] == [StepStatus.SUCCEEDED, StepStatus.SKIPPED]
        assert final.steps[1].receipt["error"]["code"] == "condition_false"
        assert final.task.status is TaskStatus.SUCCEEDED


async def test_failure_skips_dependants_and_fails_task(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, chain_plan()))
        claimed = await c.leasing.claim(executor_id="x1", connectors=["echo"], limit=10)
        await c.reporting.report(
            executor_id="x1", results=[failed(claimed[0], "invalid_arguments", retryable=False)]
        )
        final = await c.queries.get(view.task.task_id)
        assert [s.status for s in final.steps] == [StepStatus.FAILED, StepStatus.SKIPPED]
        assert final.steps[1].receipt["error"]["code"] == "dependency_failed"
        assert final.task.status is TaskStatus.FAILED


async def test_reference_to_missing_field_fails_with_receipt(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, chain_plan(when="true")))
        await run_all(c, {"a": {"go": True}})  # no "word": $a.output.word cannot resolve
        final = await c.queries.get(view.task.task_id)
        assert final.steps[1].status is StepStatus.FAILED
        assert final.steps[1].receipt["error"]["code"] == "invalid_arguments"
        assert "word" in final.steps[1].receipt["error"]["message"]


async def test_resolved_arguments_are_checked_against_schema(
    database_url: str, tmp_path: Path
) -> None:
    body = {
        "steps": [
            {"step_id": "a", "tool": "echo.say", "args": {}},
            {"step_id": "b", "tool": "echo.count", "depends_on": ["a"], "args": {"n": "$a.output"}},
        ]
    }
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, body))
        await run_all(c, {"a": "not a number"})
        final = await c.queries.get(view.task.task_id)
        assert final.steps[1].status is StepStatus.FAILED
        assert final.steps[1].receipt["error"]["code"] == "invalid_arguments"


async def test_retryable_error_retries_with_durable_backoff(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, ONE_STEP))
        for attempt in (1, 2, 3):
            claimed = await c.leasing.poll(executor_id="x1", connectors=["echo"], limit=1, wait=5)
            assert [s.attempt for s in claimed] == [attempt]
            await c.reporting.report(
                executor_id="x1",
                results=[failed(claimed[0], "downstream_unavailable", retryable=True)],
            )
        final = await c.queries.get(view.task.task_id)
        step = final.steps[0]
        assert step.status is StepStatus.FAILED
        assert step.receipt["meta"]["attempts"] == 3
        assert "after 3 attempts" in step.receipt["error"]["message"]
        kinds = [e.kind for e in await c.queries.events(view.task.task_id) if e.step_id == "a"]
        assert kinds == ["unblock", "lease", "retry", "lease", "retry", "lease", "fail"]


async def test_stale_result_is_rejected_and_not_applied(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path), lease_seconds=0.2) as c:
        view = await c.queries.get(await submit(c, ONE_STEP))
        first = (await c.leasing.claim(executor_id="slow", connectors=["echo"], limit=1))[0]
        await asyncio.sleep(0.3)  # let the lease run out (the thing under test is expiry)
        assert await c.expiry.reap_expired() == 1
        second = (await c.leasing.poll(executor_id="fast", connectors=["echo"], limit=1, wait=5))[0]
        assert second.attempt == first.attempt + 1
        late = await c.reporting.report(executor_id="slow", results=[ok(first, {"from": "slow"})])
        assert [a.accepted for a in late] == [False]
        assert late[0].reason == "stale_lease"
        fresh = await c.reporting.report(executor_id="fast", results=[ok(second, {"from": "fast"})])
        assert [a.accepted for a in fresh] == [True]
        final = await c.queries.get(view.task.task_id)
        assert final.steps[0].output == {"from": "fast"}
        assert c.metrics.total("agent_reach_results_rejected_total") == 1
        rejected = [
            e for e in await c.queries.events(view.task.task_id) if e.kind == "result_rejected"
        ]
        assert [(e.attempt, e.data) for e in rejected] == [
            (first.attempt, {"executor_id": "slow", "reason": "stale_lease", "call": "report"})
        ]


async def test_heartbeat_extends_and_reports_cancellation(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, ONE_STEP))
        step = (await c.leasing.claim(executor_id="x1", connectors=["echo"], limit=1))[0]
        beat = await c.leasing.heartbeat(executor_id="x1", leases=[(step.id, step.attempt)])
        assert beat.extended == [(step.id, step.attempt)]
        other = await c.leasing.heartbeat(executor_id="x2", leases=[(step.id, step.attempt)])
        assert other.lost == [(step.id, step.attempt)]
        cancelled = await c.operator.cancel(view.task.task_id)
        assert cancelled.task.status is TaskStatus.CANCELLED
        beat = await c.leasing.heartbeat(executor_id="x1", leases=[(step.id, step.attempt)])
        assert beat.cancelled == [(step.id, step.attempt)]
        late = await c.reporting.report(executor_id="x1", results=[ok(step, {})])
        assert [a.accepted for a in late] == [False]
        assert (await c.queries.get(view.task.task_id)).steps[0].receipt["status"] == "cancelled"


async def test_idempotency_key_same_body_same_task(database_url: str, tmp_path: Path) -> None:
    body = chain_plan()
    async with components_for(database_url, write_tools(tmp_path)) as c:
        plan = parse_plan(body, c.catalog)
        first = await c.intake.submit(SubmitInput(plan=plan, request=body, idempotency_key="k-1"))
        again = await c.intake.submit(SubmitInput(plan=plan, request=body, idempotency_key="k-1"))
        assert first.created
        assert not again.created
        assert again.task_id == first.task_id
        other = chain_plan(when="true")
        with pytest.raises(IdempotencyConflictError) as info:
            await submit(c, other, key="k-1")
        assert info.value.task_id == first.task_id
        assert len(await c.queries.list_tasks()) == 1


async def test_wait_returns_when_terminal(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, ONE_STEP))
        waiter = asyncio.create_task(c.queries.wait(view.task.task_id, within=10))
        await run_all(c, {"a": {"ok": True}})
        done = await asyncio.wait_for(waiter, 10)
        assert done.task.status is TaskStatus.SUCCEEDED


async def test_deadline_ends_the_task_with_receipts(database_url: str, tmp_path: Path) -> None:
    body = {**chain_plan(), "deadline_seconds": 2}
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, body))
        deadline = view.task.deadline
        assert deadline is not None
        [running] = await c.leasing.claim(executor_id="x1", connectors=["echo"], limit=1)
        assert await c.expiry.expire_deadlines() == 0  # not yet
        # (A loaded machine could take the whole 2 s to get here: then "not yet" proved nothing.)
        assert datetime.now(UTC) < deadline, "the check above ran after the deadline"
        # The deadline itself is what is under test: ended once it passes, not before.
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 20
        while (ended := await c.expiry.expire_deadlines()) == 0:
            assert loop.time() < give_up, "the deadline passed and the task was not ended"
            await asyncio.sleep(0.05)
        assert ended == 1
        assert datetime.now(UTC) >= deadline
        final = await c.queries.get(view.task.task_id)
        assert final.task.status is TaskStatus.CANCELLED
        assert [s.status for s in final.steps] == [StepStatus.CANCELLED, StepStatus.CANCELLED]
        assert {s.receipt["error"]["code"] for s in final.steps} == {"deadline_exceeded"}
        beat = await c.leasing.heartbeat(executor_id="x1", leases=[(running.id, running.attempt)])
        assert beat.cancelled == [(running.id, running.attempt)]  # the executor is told to stop
        assert await c.expiry.expire_deadlines() == 0  # ended once


async def test_attempt_budget_caps_starts_and_retries(database_url: str, tmp_path: Path) -> None:
    three = {"steps": [{"step_id": s, "tool": "echo.say", "args": {}} for s in "abc"]}
    async with components_for(database_url, write_tools(tmp_path)) as c:
        small = await c.queries.get(await submit(c, {**three, "budget": {"max_attempts": 2}}))
        assert [s.status for s in small.steps] == [
            StepStatus.READY,
            StepStatus.READY,
            StepStatus.FAILED,
        ]
        assert small.steps[2].receipt["error"]["code"] == "budget_exhausted"

        view = await c.queries.get(await submit(c, {**three, "budget": {"max_attempts": 4}}))
        mine = view.task.task_id

        async def fail_a() -> None:
            ready = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=10, wait=5)
            [a] = [s for s in ready if s.task_id == mine and s.step_id == "a"]
            await c.reporting.report(
                executor_id="x", results=[failed(a, "downstream_unavailable", retryable=True)]
            )

        await fail_a()  # the 4th attempt of the budget goes to a's retry
        assert (await c.queries.get(mine)).steps[0].status is StepStatus.READY
        await fail_a()  # no attempt left for another retry
        a = (await c.queries.get(mine)).steps[0]
        assert a.status is StepStatus.FAILED
        assert a.receipt["error"]["code"] == "budget_exhausted"
        assert "downstream_unavailable" in a.receipt["error"]["message"]


async def test_a_step_may_override_its_tools_retry_policy(
    database_url: str, tmp_path: Path
) -> None:
    body = {
        "steps": [
            {"step_id": "a", "tool": "echo.say", "args": {}, "retry": {"maximum_attempts": 2}},
            {
                "step_id": "b",
                "tool": "echo.say",
                "args": {},
                "retry": {"non_retryable_error_types": ["downstream_unavailable"]},
            },
        ]
    }
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, body))
        assert [s.max_attempts for s in view.steps] == [2, 3]  # the tool allows 3
        for _ in range(2):
            ready = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=5, wait=5)
            await c.reporting.report(
                executor_id="x",
                results=[failed(s, "downstream_unavailable", retryable=True) for s in ready],
            )
        final = await c.queries.get(view.task.task_id)
        assert [(s.status, s.attempt) for s in final.steps] == [
            (StepStatus.FAILED, 2),
            (StepStatus.FAILED, 1),
        ]
        assert "after 2 attempts" in final.steps[0].receipt["error"]["message"]


async def test_schedule_to_close_bounds_the_whole_step(database_url: str, tmp_path: Path) -> None:
    from agent_reach_controller.rpc.convert import assignment_to_proto
    from tests.integration.stack import TOOLS

    tight = {
        "name": "echo.tight",
        "description": "Must be done within 1 s of being scheduled.",
        "connector": "echo",
        "timeout": "30s",
        "schedule_to_close": "1s",
        "retry": {"initial_interval": "5s", "maximum_attempts": 5, "jitter": False},
        "idempotent": True,
    }
    body = {"steps": [{"step_id": "a", "tool": "echo.tight", "args": {}}]}
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, tight])) as c:
        view = await c.queries.get(await submit(c, body))
        [step] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
        timeout_ms = assignment_to_proto(step, c.catalog["echo.tight"]).timeout_ms
        assert 1 <= timeout_ms <= 1000  # the attempt gets what is left, not the tool's 30 s
        # The executor learns whether a second delivery is harmless (its transport may resend).
        spec = c.catalog["echo.tight"]
        assert assignment_to_proto(step, spec).idempotent is True
        unsafe = spec.model_copy(update={"idempotent": False})
        assert assignment_to_proto(step, unsafe).idempotent is False
        await c.reporting.report(
            executor_id="x", results=[failed(step, "downstream_unavailable", retryable=True)]
        )
        final = (await c.queries.get(view.task.task_id)).steps[0]
        assert final.status is StepStatus.FAILED  # a 5 s backoff would pass the 1 s bound
        assert final.attempt == 1
        assert final.receipt["error"]["code"] == "timeout"
        assert "schedule_to_close" in final.receipt["error"]["message"]


async def test_a_failed_step_tries_its_tools_fallback(database_url: str, tmp_path: Path) -> None:
    from tests.integration.stack import TOOLS

    primary = {
        "name": "quote.primary",
        "description": "Primary quote service.",
        "connector": "echo",
        "retry": {"maximum_attempts": 1},
        "fallback": "quote.backup",
    }
    backup = {
        "name": "quote.backup",
        "description": "Backup quote service.",
        "connector": "script",
        "retry": {"maximum_attempts": 2, "initial_interval": "10ms", "jitter": False},
    }
    body = {"steps": [{"step_id": "q", "tool": "quote.primary", "args": {"sku": "A1"}}]}
    tools = write_tools(tmp_path, [*TOOLS, primary, backup])
    async with components_for(database_url, tools) as c:
        view = await c.queries.get(await submit(c, body))
        [first] = await c.leasing.claim(executor_id="x", connectors=["echo", "script"], limit=1)
        assert first.tool == "quote.primary"
        await c.reporting.report(
            executor_id="x", results=[failed(first, "downstream_rejected", retryable=False)]
        )
        [second] = await c.leasing.poll(executor_id="x", connectors=["script"], limit=1, wait=5)
        assert (second.tool, second.connector, second.attempt) == ("quote.backup", "script", 2)
        assert second.idempotency_key == first.idempotency_key
        await c.reporting.report(executor_id="x", results=[ok(second, {"price": 3})])
        final = await c.queries.get(view.task.task_id)
        step = final.steps[0]
        assert (step.status, final.task.status) == (StepStatus.SUCCEEDED, TaskStatus.SUCCEEDED)
        assert step.receipt["meta"]["tool"] == "quote.backup"
        assert step.receipt["meta"]["fallback_for"] == "quote.primary"
        switched = [e.data for e in await c.queries.events(view.task.task_id) if e.kind == "retry"]
        assert switched[0]["fallback"]["from"] == "quote.primary"


async def test_a_step_waits_for_every_dependency_and_reads_each_output(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        view = await c.queries.get(await submit(c, WIDE))
        a, b = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        await c.reporting.report(executor_id="x", results=[ok(a, {"word": "hi"})])
        assert (await c.queries.get(view.task.task_id)).steps[2].status is StepStatus.BLOCKED
        await c.reporting.report(executor_id="x", results=[ok(b, {"n": 3})])
        [third] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
        assert third.resolved_args == {"text": "hi", "n": 3}
        await c.reporting.report(executor_id="x", results=[ok(third, {})])
        assert (await c.queries.get(view.task.task_id)).task.status is TaskStatus.SUCCEEDED
