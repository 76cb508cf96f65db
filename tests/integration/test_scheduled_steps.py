"""Scheduled steps wait in the database for their time: never leased before it, leased once it
comes, movable until they start, with approvals and schedule-to-start counted from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.integration.stack import (
    TOOLS,
    api_client,
    claim,
    components_for,
    key_for,
    ok,
    post_task,
    start_task,
    steps_shown,
    write_tools,
)
from tests.integration.test_fan_out import NOTIFY, notify
from tests.integration.test_verified_writes import READ_BACK, REFUND, refund_tool

WIPE = {
    "name": "vault.wipe",
    "description": "Wipes a vault.",
    "connector": "echo",
    "risk": "dangerous",
    "input_schema": {"type": "object"},
}


def at(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


async def test_a_step_is_not_leased_before_its_time_and_is_once_it_comes(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        later = {"step_id": "later", "tool": "echo.say", "run_at": at(timedelta(hours=2))}
        soon = {"step_id": "soon", "tool": "echo.say", "delay": "1s"}
        task_id = await start_task(api, {"steps": [later, soon]})
        by_id = await steps_shown(api, task_id)
        assert by_id["later"]["status"] == "ready"
        assert by_id["later"]["not_before"] == by_id["later"]["run_at"]
        # The long poll waits for the next due time and takes `soon` then, not before.
        claimed = await claim(c, wait=10)
        taken_at = datetime.now(UTC)
        assert [s.step_id for s in claimed] == ["soon"]
        run_at = datetime.fromisoformat(by_id["soon"]["run_at"])
        assert taken_at >= run_at
        await c.reporting.report(executor_id="t", results=[ok(s, {}) for s in claimed])
        assert await claim(c) == []
        # Moved to now, `later` is due at once; the event log says who moved it.
        moved = await api.post(f"/v1/tasks/{task_id}/steps/later/schedule", json={"delay": 0})
        assert moved.status_code == 200, moved.text
        [step] = await claim(c, wait=5)
        assert step.step_id == "later"
        events = (await api.get(f"/v1/tasks/{task_id}/events")).json()["events"]
        kinds = [(e["step_id"], e["kind"]) for e in events]
        assert ("later", "reschedule") in kinds
        unblocked = next(e for e in events if e["step_id"] == "later" and e["kind"] == "unblock")
        said = datetime.fromisoformat(unblocked["data"]["run_at"])
        assert said == datetime.fromisoformat(by_id["later"]["run_at"])
        # Started: it cannot move any more.
        again = await api.post(f"/v1/tasks/{task_id}/steps/later/schedule", json={"delay": "1h"})
        assert again.status_code == 409
        assert again.json()["code"] == "not_reschedulable"


async def test_a_blocked_step_keeps_its_time_until_its_dependency_is_done(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        plan = {
            "timezone": "Asia/Shanghai",
            "steps": [
                {"step_id": "first", "tool": "echo.say"},
                {
                    "step_id": "then",
                    "tool": "echo.say",
                    "depends_on": ["first"],
                    "run_at": "2099-01-01T08:00",
                },
            ],
        }
        answer = await post_task(api, plan, expect=422)  # more than a year ahead
        assert answer.json()["errors"][0]["pointer"] == "/steps/1/run_at"
        plan["steps"][1]["run_at"] = at(timedelta(days=2))  # type: ignore[index]
        task_id = await start_task(api, plan)
        [first] = await claim(c)
        await c.reporting.report(executor_id="t", results=[ok(first, {})])
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        then = next(s for s in task["steps"] if s["step_id"] == "then")
        assert then["status"] == "ready"
        assert then["not_before"] == then["run_at"]
        assert await claim(c) == []
        neither = await api.post(f"/v1/tasks/{task_id}/steps/then/schedule", json={})
        assert neither.status_code == 422
        assert neither.json()["errors"][0]["detail"] == "give 'run_at' or 'delay'"


async def test_approval_and_schedule_to_start_count_from_the_time(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, {**WIPE, "schedule_to_start": "10s"}])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        run_at = datetime.now(UTC) + timedelta(hours=5)
        plan = {"steps": [{"step_id": "w", "tool": "vault.wipe", "run_at": run_at.isoformat()}]}
        task_id = await start_task(api, plan)
        view = await c.queries.get(task_id)
        [step] = view.steps
        assert step.status == "awaiting_approval"
        assert step.decide_by is not None
        assert step.decide_by >= run_at + timedelta(hours=1) - timedelta(seconds=1)
        assert step.start_by is not None
        assert step.start_by == step.not_before + timedelta(seconds=10)
        # Only those who may submit the tool move it; another tenant does not see it.
        stranger = await key_for(c, tenant="other", name="stranger")
        hidden = await api.post(
            f"/v1/tasks/{task_id}/steps/w/schedule", json={"delay": 0}, headers=stranger
        )
        assert hidden.status_code == 404


async def test_moving_a_fan_out_step_moves_every_child_that_has_not_started(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, NOTIFY])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        targets = [{"channel": "email", "to": f"{n}@example.org"} for n in range(3)]
        tell = {
            **notify(run_at=at(timedelta(hours=2))),
            "args": {"message": "hi", "targets": targets},
        }
        task_id = await start_task(api, {"steps": [tell]})
        assert await claim(c) == []
        # Moved to now: every child is due at once, and the answer says which moved.
        moved = await api.post(f"/v1/tasks/{task_id}/steps/tell/schedule", json={"delay": 0})
        assert moved.status_code == 200, moved.text
        answer = moved.json()
        assert answer["moved"] == ["tell[0]", "tell[1]", "tell[2]"]
        assert answer["not_moved"] == []
        by_id = {s["step_id"]: s for s in answer["steps"]}
        assert by_id["tell[0]"]["run_at"] == by_id["tell"]["run_at"]  # the time asked, shown
        events = (await api.get(f"/v1/tasks/{task_id}/events")).json()["events"]
        rescheduled = {e["step_id"] for e in events if e["kind"] == "reschedule"}
        assert rescheduled == {"tell", "tell[0]", "tell[1]", "tell[2]"}
        # One child starts; moving the step again moves the two that have not.
        [started] = await claim(c, wait=5, limit=1)
        later = await api.post(f"/v1/tasks/{task_id}/steps/tell/schedule", json={"delay": "1h"})
        assert later.status_code == 200, later.text
        stayed = [{"step_id": started.step_id, "status": "running", "follows": None}]
        assert later.json()["not_moved"] == stayed
        assert len(later.json()["moved"]) == 2
        assert started.step_id not in later.json()["moved"]
        assert await claim(c) == []  # the two that moved wait for their new time
        # Once every child has started, nothing moves: a 409 that says why, child by child.
        await api.post(f"/v1/tasks/{task_id}/steps/tell/schedule", json={"delay": 0})
        rest = await claim(c, wait=5)
        assert len(rest) == 2
        none = await api.post(f"/v1/tasks/{task_id}/steps/tell/schedule", json={"delay": "1h"})
        assert none.status_code == 409
        assert none.json()["code"] == "not_reschedulable"
        assert [n["step_id"] for n in none.json()["not_moved"]] == ["tell[0]", "tell[1]", "tell[2]"]


async def test_a_verified_write_moves_its_chain_and_a_read_back_follows_its_write(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, READ_BACK, refund_tool()])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        write = {**REFUND, "run_at": at(timedelta(hours=2))}
        task_id = await start_task(api, {"steps": [write]})
        moved = await api.post(f"/v1/tasks/{task_id}/steps/pay/schedule", json={"delay": 0})
        assert moved.status_code == 200, moved.text
        assert moved.json()["moved"] == ["pay[0]", "pay[1]"]  # the write and its read-back
        [written] = await claim(c, wait=5)
        assert written.step_id == "pay[0]"
        # The write has started: its read-back follows it, not the clock.
        stays = await api.post(f"/v1/tasks/{task_id}/steps/pay/schedule", json={"delay": "1h"})
        assert stays.status_code == 409
        assert stays.json()["not_moved"] == [
            {"step_id": "pay[0]", "status": "running", "follows": None},
            {"step_id": "pay[1]", "status": "blocked", "follows": "pay[0]"},
        ]
