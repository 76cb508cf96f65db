"""Replay: the timeline from the event log, a dry run that re-drives the plan on the recorded
results (no connector called) and reproduces what the model was told byte for byte, a dry run
that notices when the record does not add up, and a live re-run in the same trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from agent_reach_cli.replay_commands import format_dry_run, format_timeline
from agent_reach_controller.runtime import Components
from agent_reach_controller.storage.schema import steps
from tests.integration.stack import api_client, components_for, failed, ok, write_tools

PLAN = {
    "goal": "look up, then echo, maybe count",
    "steps": [
        {"step_id": "look", "tool": "echo.say", "args": {"text": "hi"}},
        {
            "step_id": "echo",
            "tool": "echo.say",
            "args": {"text": "$look.output.text"},
            "depends_on": ["look"],
        },
        {
            "step_id": "maybe",
            "tool": "echo.count",
            "args": {"n": 1},
            "depends_on": ["look"],
            "when": "size(steps.look.output.items) > 100",
        },
        {"step_id": "count", "tool": "echo.count", "args": {"n": 2}},
    ],
}
LOOK = {"text": "hello", "items": list(range(40))}


async def run_to_the_end(c: Components) -> None:
    """look: a retry then success; echo: success; count: a fatal error; maybe is skipped."""
    outputs: dict[str, Any] = {"look": LOOK, "echo": {"text": "hello"}}
    retried = False
    for _ in range(20):  # each round waits for the next step (a retry's backoff is 10 ms)
        leased = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=10, wait=5)
        results = []
        for step in leased:
            if step.step_id == "look" and not retried:
                retried = True
                results.append(failed(step, "timeout", retryable=True))
            elif step.step_id == "count":
                results.append(failed(step, "downstream_rejected", retryable=False))
            else:
                results.append(ok(step, outputs[step.step_id]))
        if results:
            await c.reporting.report(executor_id="x", results=results)
        view = await c.queries.get(
            (await c.queries.list_tasks(tenant="default", limit=1))[0].task_id
        )
        if view.task.status.value in ("succeeded", "failed"):
            return
    raise AssertionError("the task did not end")


async def test_a_finished_task_replays_identically_and_its_timeline_says_what_happened(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        task_id = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        await run_to_the_end(c)
        replay = (await api.get(f"/v1/tasks/{task_id}/replay")).json()

    assert replay["request"] == PLAN
    kinds = [(m["step_id"], m["kind"]) for m in replay["timeline"]]
    assert kinds[0] == (None, "task_created")
    for expected in [
        ("look", "lease"),
        ("look", "retry"),
        ("look", "succeed"),
        ("echo", "unblock"),
        ("maybe", "skip"),
        ("count", "fail"),
    ]:
        assert expected in kinds
    assert [m["attempt"] for m in replay["timeline"] if m["kind"] == "lease"].count(2) == 1
    run = replay["dry_run"]
    assert (run["finished"], run["identical"]) == (True, True)
    by_step = {s["step_id"]: s for s in run["steps"]}
    assert {s: v["replayed_status"] for s, v in by_step.items()} == {
        "look": "succeeded",
        "echo": "succeeded",
        "maybe": "skipped",
        "count": "failed",
    }
    for step in run["steps"]:
        assert step["replayed_message"] == step["recorded_message"] is not None
        assert step["differences"] == []
    assert "(first 5 of 40)" in by_step["look"]["recorded_message"]
    lines, same = format_dry_run(replay)
    assert same
    assert lines[-1].startswith("reproduced")
    shown = "\n".join(format_timeline(replay))
    assert "look#2" in shown
    assert "timeout" in shown


async def test_a_record_that_does_not_add_up_is_not_reproduced(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        task_id = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        await run_to_the_end(c)
        # Someone rewrote look's stored output: echo's arguments no longer follow from it.
        async with c.db.transaction() as conn:
            await conn.execute(
                sa.update(steps)
                .where(steps.c.task_id == task_id, steps.c.step_id == "look")
                .values(output={"text": "rewritten", "items": []})
            )
        run = (await api.get(f"/v1/tasks/{task_id}/replay")).json()["dry_run"]
    assert run["identical"] is False
    by_step = {s["step_id"]: s for s in run["steps"]}
    assert "what the model is shown differs" in by_step["look"]["differences"]
    assert "resolved arguments differ from the recorded ones" in by_step["echo"]["differences"]
    _, same = format_dry_run({"dry_run": run})
    assert not same


async def test_a_rerun_is_a_new_live_task_in_the_same_trace(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        first = (await api.post("/v1/tasks", json=PLAN)).json()
        again = await api.post(f"/v1/tasks/{first['task_id']}/rerun")
        assert again.status_code == 202, again.text
        second = again.json()
        assert second["task_id"] != first["task_id"]
        assert second["trace_id"] == first["trace_id"]
        view = (await api.get(f"/v1/tasks/{second['task_id']}")).json()
        assert [s["step_id"] for s in view["steps"]] == ["look", "echo", "maybe", "count"]
        assert view["status"] in ("pending", "running")
        assert (await api.post("/v1/tasks/nope/rerun")).status_code == 404
        assert (await api.get("/v1/tasks/nope/replay")).status_code == 404


async def test_a_dry_run_reproduces_the_tool_messages_the_model_was_given(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A cut receipt carries a handle to the full output; the dry run renders it the same."""
    args = json.dumps({"text": "x" * 1000})
    calls = {
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "echo_say", "arguments": args}}
        ]
    }
    tools = write_tools(tmp_path)
    async with (
        components_for(sqlite_url, tools, receipt_budget_chars=200) as c,
        api_client(c) as api,
    ):
        task_id = (await api.post("/v1/tasks", json=calls)).json()["task_id"]
        [leased] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        await c.reporting.report(executor_id="x", results=[ok(leased, {"echo": "y" * 1000})])
        [message] = (await api.get(f"/v1/tasks/{task_id}")).json()["tool_messages"]
        [step] = (await api.get(f"/v1/tasks/{task_id}/replay")).json()["dry_run"]["steps"]
    assert "full_output" in message["content"]
    assert step["recorded_message"] == step["replayed_message"] == message["content"]
