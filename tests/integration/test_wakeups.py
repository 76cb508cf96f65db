"""A new ready step wakes a poller on another replica at once, through each notifier.

The pollers' safety-net recheck is set far beyond the poll's wait, so a poll that returns the
step can only have been woken by the notification under test.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.storage.wakeups import Notifier, PostgresNotifier, RedisNotifier
from tests.integration.stack import components_for, write_tools

BODY = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}


def no_recheck(c: Components) -> None:
    c.leasing.timings = replace(c.leasing.timings, recheck=3600.0, max_poll_wait=3600.0)


async def poll_then_submit(poller: Components, submitter: Components) -> list[Any]:
    no_recheck(poller)
    polling = asyncio.create_task(
        poller.leasing.poll(executor_id="p", connectors=["echo"], limit=1, wait=20)
    )
    # The poll found nothing and now waits; only a wake-up can end it before 20 s.
    async with asyncio.timeout(10):
        while poller.notifier.waiting == 0:  # noqa: ASYNC110 (a counter, polled to a deadline)
            await asyncio.sleep(0.005)
    assert not polling.done()
    plan = parse_plan(BODY, submitter.catalog)
    await submitter.intake.submit(SubmitInput(plan=plan, request=BODY))
    return await asyncio.wait_for(polling, 30)


async def test_in_process_wakeup(sqlite_url: str, tmp_path: Path) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c:
        assert type(c.notifier) is Notifier
        claimed = await poll_then_submit(c, c)
        assert [s.step_id for s in claimed] == ["a"]


async def test_postgres_listen_notify_wakes_another_replica(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
    ):
        assert isinstance(one.notifier, PostgresNotifier)
        claimed = await poll_then_submit(one, two)
        assert [s.step_id for s in claimed] == ["a"]


@pytest.mark.redis
async def test_redis_pubsub_wakes_another_replica(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with (
        components_for(postgres_url, tools, redis_url=redis_url) as one,
        components_for(postgres_url, tools, redis_url=redis_url) as two,
    ):
        assert isinstance(one.notifier, RedisNotifier)
        claimed = await poll_then_submit(one, two)
        assert [s.step_id for s in claimed] == ["a"]


HELD = {
    "name": "echo.held",
    "description": "A write with a short undo window: queued, not due for 2 s.",
    "connector": "echo",
    "risk": "write",
    "hold": "2s",
    "idempotent": True,
}


async def test_a_poll_after_a_draining_claim_still_sees_what_comes_and_what_falls_due(
    database_url: str, tmp_path: Path
) -> None:
    # An executor polls again as soon as it is handed steps. When that claim drained the queue
    # and nothing woke since, the next poll waits without claiming; it must still take a step
    # submitted meanwhile (woken) and one that falls due (no wake-up: its time is known).
    from tests.integration.stack import TOOLS

    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, HELD])) as c:
        no_recheck(c)

        async def submit(tool: str, step_id: str) -> None:
            body = {"steps": [{"step_id": step_id, "tool": tool, "args": {}}]}
            await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))

        def poll() -> Any:
            return c.leasing.poll(executor_id="p", connectors=["echo"], limit=5, wait=20)

        # "later" is submitted last, so only one poll runs inside its hold; the hold is long
        # enough (2 s) that a loaded CI machine does not let it fall due first (0.4 s did).
        await submit("echo.say", "now")
        await submit("echo.held", "later")
        assert [s.step_id for s in await poll()] == ["now"]  # drained: "later" is not due
        async with asyncio.timeout(10):  # the poll's own wait is 20 s
            assert [s.step_id for s in await poll()] == ["later"]

        polling = asyncio.create_task(poll())
        async with asyncio.timeout(10):
            while c.notifier.waiting == 0:  # noqa: ASYNC110 (a counter, polled to a deadline)
                await asyncio.sleep(0.005)
        await submit("echo.say", "woken")
        async with asyncio.timeout(10):
            assert [s.step_id for s in await polling] == ["woken"]
