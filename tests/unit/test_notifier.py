"""In-process wake-ups: keyed, and bounded in memory."""

from __future__ import annotations

import asyncio

from agent_reach_controller.state.notifier import Notifier, Wake, ready_key, task_key


async def test_a_ready_step_wakes_only_its_connector() -> None:
    n = Notifier()
    echo, http = [ready_key("echo")], [ready_key("http")]
    since_echo, since_http = n.snapshot(echo), n.snapshot(http)
    woken = asyncio.create_task(n.wait(echo, since_echo, within=30))
    await n.after_commit(Wake(connectors=frozenset({"echo"})))
    await asyncio.wait_for(woken, 5)
    assert n.snapshot(echo) != since_echo
    assert n.snapshot(http) == since_http


async def test_task_keys_are_counted_only_while_watched() -> None:
    n = Notifier()
    keys = [task_key("t1")]
    await n.after_commit(Wake(tasks=frozenset({"t1"})))
    assert n.snapshot(keys) == (0, 0)  # nobody was waiting: nothing kept
    with n.watching(keys):
        since = n.snapshot(keys)
        waiter = asyncio.create_task(n.wait(keys, since, within=30))
        await n.after_commit(Wake(tasks=frozenset({"t1", "t2"})))
        await asyncio.wait_for(waiter, 5)
        assert n.snapshot(keys) != since
    assert n.snapshot(keys) == (0, 0)
    assert n.snapshot([task_key("t2")]) == (0, 0)


async def test_everything_wakes_every_waiter() -> None:
    n = Notifier()
    keys = [ready_key("echo")]
    since = n.snapshot(keys)
    waiter = asyncio.create_task(n.wait(keys, since, within=30))
    await n.mark(everything=True)
    await asyncio.wait_for(waiter, 5)
