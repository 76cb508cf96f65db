"""The task view at its top: a failed task says which step failed and why, and every time the API
shows (the view, receipts, events, the event stream) is RFC 3339 in UTC with `Z`, to the ms."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.integration.stack import (
    TOOLS,
    api_client,
    claim,
    components_for,
    failed,
    ok,
    start_task,
    write_tools,
)
from tests.integration.test_fan_out import NOTIFY, notify

# What `agent_reach.times.rfc3339` writes; anything else that looks like a time is a failure.
INSTANT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LOOKS_LIKE_A_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")


def times_in(value: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a JSON document that looks like a time, with where it is."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from times_in(item, f"{where}/{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from times_in(item, f"{where}/{n}")
    elif isinstance(value, str) and LOOKS_LIKE_A_TIME.match(value):
        yield where, value


async def test_a_failed_target_is_named_at_the_top_of_its_task(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, NOTIFY])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        body = {"steps": [{"step_id": "look", "tool": "echo.say"}, notify(depends_on=["look"])]}
        task_id = await start_task(api, body)
        running = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert running["error"] is None  # not failed (yet)
        [look] = await claim(c)
        await c.reporting.report(executor_id="t", results=[ok(look, {})])
        children = {s.step_id: s for s in await claim(c)}
        await c.reporting.report(
            executor_id="t",
            results=[
                ok(children["tell[0]"], {}),
                failed(children["tell[1]"], "downstream_rejected", retryable=False),
            ],
        )
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "failed"
        # The child that failed, with its own code and message, not the step's summary.
        assert task["error"] == {
            "code": "downstream_rejected",
            "message": "notify.send failed: downstream_rejected",
            "step_id": "tell[1]",
        }
        tell = next(s for s in task["steps"] if s["step_id"] == "tell")
        assert tell["receipt"]["error"]["code"] == "partially_done"  # the step still counts


async def test_the_first_failing_step_in_plan_order_is_named_not_what_it_skipped(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, api_client(c) as api:
        body = {
            "steps": [
                {"step_id": "ok", "tool": "echo.say"},
                {"step_id": "bad", "tool": "echo.say"},
                {"step_id": "later", "tool": "echo.say", "depends_on": ["bad"]},
            ]
        }
        task_id = await start_task(api, body)
        claimed = {s.step_id: s for s in await claim(c)}
        await c.reporting.report(
            executor_id="t",
            results=[
                ok(claimed["ok"], {}),
                failed(claimed["bad"], "invalid_arguments", retryable=False),
            ],
        )
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "failed"
        assert task["error"]["step_id"] == "bad"
        assert task["error"]["code"] == "invalid_arguments"
        # A task that succeeded has no error; a cancelled one did not fail either.
        done = await api.post("/v1/tasks", json={"steps": [{"step_id": "x", "tool": "echo.say"}]})
        [x] = await claim(c)
        await c.reporting.report(executor_id="t", results=[ok(x, {})])
        succeeded = (await api.get(f"/v1/tasks/{done.json()['task_id']}")).json()
        assert succeeded["status"] == "succeeded"
        assert succeeded["error"] is None
        waiting = await api.post(
            "/v1/tasks", json={"steps": [{"step_id": "y", "tool": "echo.say"}]}
        )
        cancelled = (await api.post(f"/v1/tasks/{waiting.json()['task_id']}/cancel")).json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"] is None


async def test_every_time_shown_is_rfc3339_utc_with_z_to_the_millisecond(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, NOTIFY])
    async with components_for(database_url, tools) as c, api_client(c) as api:
        body = {
            "steps": [
                {"step_id": "soon", "tool": "echo.say", "delay": "1ms"},
                notify(depends_on=["soon"]),
            ]
        }
        task_id = await start_task(api, body)
        [soon] = await claim(c, wait=10)
        await c.reporting.report(executor_id="t", results=[ok(soon, {})])
        children = await claim(c)
        # No `delivered_at` from these targets: the receipt's `done_at` is the step's end.
        await c.reporting.report(executor_id="t", results=[ok(s, {}) for s in children])
        task = (await api.get(f"/v1/tasks/{task_id}")).json()
        assert task["status"] == "succeeded"
        events = (await api.get(f"/v1/tasks/{task_id}/events")).json()
        stream = await api.get(
            f"/v1/tasks/{task_id}/events", headers={"Accept": "text/event-stream"}
        )
        assert stream.status_code == 200
        streamed = [
            json.loads(line.removeprefix("data: "))
            for line in stream.text.splitlines()
            if line.startswith("data: ")
        ]
        listed = (await api.get("/v1/tasks")).json()
        seen = [
            *times_in(task, "task"),
            *times_in(events, "events"),
            *times_in(streamed, "stream"),
            *times_in(listed, "list"),
        ]
        wrong = [(where, value) for where, value in seen if not INSTANT.fullmatch(value)]
        assert wrong == []
        # Every kind of time was seen: the view's, a step's, a receipt row's, an event's data.
        places = {where.rsplit("/", 1)[-1] for where, _ in seen}
        assert {"created_at", "finished_at", "started_at", "run_at", "done_at"} <= places
        assert any(where.startswith("events/") and "/data/" in where for where, _ in seen)
        assert any(where.startswith("stream/") for where, _ in seen)
