"""In-process wake-ups: keyed, and bounded in memory."""

from __future__ import annotations

import asyncio
import itertools

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


async def test_waiters_woken_and_cancelled_twice_leave_the_notifier_usable() -> None:
    """At a controller's stop every poller's handler is cancelled by its RPC and again by the
    server, maybe just as a wake-up reaches it; seen in a rolling restart as "Lock is not
    acquired" on a waiter's way out (and waiters that never returned)."""
    n = Notifier()
    keys = [ready_key("echo")]
    for woken_after, first, second in itertools.product(range(3), range(4), range(4)):
        waiters = [asyncio.create_task(n.wait(keys, n.snapshot(keys), within=30)) for _ in range(6)]
        await _spin(1)
        marking = asyncio.create_task(n.mark(keys=keys))
        await _spin(woken_after)
        for cancels in (first, second):
            for waiter in waiters:
                waiter.cancel()
            await _spin(cancels)
        done, _ = await asyncio.wait([*waiters, marking], timeout=5)
        assert len(done) == len(waiters) + 1, (woken_after, first, second)
        failed = [w.exception() for w in waiters if not w.cancelled() and w.exception()]
        assert not failed, (woken_after, first, second, failed)
        assert n.waiting == 0
    woken = asyncio.create_task(n.wait(keys, n.snapshot(keys), within=30))
    await _spin(1)
    await n.mark(keys=keys)
    await asyncio.wait_for(woken, 5)


async def _spin(turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)
