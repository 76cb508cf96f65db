"""In-process wake-ups: keyed, and bounded in memory."""

from __future__ import annotations

import asyncio

from agent_reach_controller.storage.wakeups import (
    Notifier,
    PostgresNotifier,
    Wake,
    events_key,
    ready_key,
    task_key,
)


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


async def test_new_events_wake_followers_of_their_task_but_not_its_waiters() -> None:
    n = Notifier()
    follow, finish = [events_key("t1")], [task_key("t1")]
    with n.watching(follow + finish):
        since_follow, since_finish = n.snapshot(follow), n.snapshot(finish)
        woken = asyncio.create_task(n.wait(follow, since_follow, within=30))
        await n.after_commit(Wake(events=frozenset({"t1", "t2"})))
        await asyncio.wait_for(woken, 5)
        assert n.snapshot(follow) != since_follow
        assert n.snapshot(finish) == since_finish  # ?wait callers re-read only when it ends
    assert n.snapshot(follow) == (0, 0)


async def test_events_cross_replicas_only_for_tasks_followed_elsewhere() -> None:
    writer, follower = PostgresNotifier("postgresql://unused"), PostgresNotifier("postgresql://x")
    tasks = [f"0190{i:032x}" for i in range(400)]
    assert writer._payloads(Wake(events=frozenset(tasks))) == []  # nobody follows: no NOTIFY
    # The follower announces its tasks (packed, like events) and the writer remembers them.
    for _, payload in follower._payloads(Wake(follows=frozenset(tasks[:300]))):
        await writer.receive(payload)
    payloads = writer._payloads(Wake(events=frozenset(tasks)))
    assert 1 < len(payloads) < 10  # a few messages, not 300
    assert all(len(p.encode()) < 8000 for _, p in payloads)
    assert sum(p.count(",") + 1 for _, p in payloads) == 300  # only the followed ones
    keys = [events_key(tasks[0]), events_key(tasks[299])]
    with follower.watching(keys):
        since = follower.snapshot(keys)
        for _, payload in payloads:
            await follower.receive(payload)
        assert all(a > b for a, b in zip(follower.snapshot(keys)[1:], since[1:], strict=True))
