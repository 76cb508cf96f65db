"""Wake-ups: a new ready step wakes the pollers of its connector, a finished task its waiters,
and any event appended to a task's log whoever follows that log (live event streams).

Locally an asyncio condition over per-key counters; across replicas Postgres LISTEN/NOTIFY (one
statement per transaction, sent just before it commits, so delivered exactly when the change
commits) or Redis pub/sub. A replica ignores its own cross-replica messages: it has already woken
its local waiters.

New events cross replicas only for tasks that someone follows: a follower announces its task
(`follows`) when it starts and every `FOLLOW_REFRESH` seconds, and every replica remembers the
announcement for `FOLLOW_TTL`. A NOTIFY makes Postgres serialise the commits that send one, so
event messages for tasks nobody watches would cost every claim and report for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import psycopg
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.storage.engine import (
    TX_STATE_PREFIX,
    Connection,
    before_commit,
    commit_statement,
    on_commit,
)
from agent_reach_controller.storage.events import tasks_with_events

log = logging.getLogger(__name__)

READY_CHANNEL = "agent_reach_ready"
TASK_CHANNEL = "agent_reach_task"
# Task ids of one events message are packed, comma-separated, below NOTIFY's 8,000-byte limit.
_PACKED_BYTES = 7_000
_NOTIFY = f"{TX_STATE_PREFIX}notify"
# A follower announces its task this often; replicas forget an announcement not renewed in time.
FOLLOW_REFRESH = 10.0
FOLLOW_TTL = 3 * FOLLOW_REFRESH


@dataclass(frozen=True, slots=True, kw_only=True)
class Wake:
    """What a transaction changed, announced once it has committed."""

    connectors: frozenset[str] = field(default_factory=frozenset)
    tasks: frozenset[str] = field(default_factory=frozenset)  # that finished
    events: frozenset[str] = field(default_factory=frozenset)  # that have new events
    follows: frozenset[str] = field(default_factory=frozenset)  # followed here: tell the others


def ready_key(connector: str) -> str:
    """The counter pollers of this connector wait on."""
    return f"ready:{connector}"


def task_key(task_id: str) -> str:
    """The counter callers waiting for this task to end wait on."""
    return f"task:{task_id}"


def events_key(task_id: str) -> str:
    """The counter followers of this task's event log wait on (any new event moves it)."""
    return f"events:{task_id}"


def _packed(task_ids: Iterable[str]) -> Iterator[str]:
    """Comma-joined runs of ids, each under `_PACKED_BYTES`."""
    run: list[str] = []
    size = 0
    for task_id in task_ids:
        if run and size + len(task_id) + 1 > _PACKED_BYTES:
            yield ",".join(run)
            run, size = [], 0
        run.append(task_id)
        size += len(task_id) + 1
    if run:
        yield ",".join(run)


class Notifier:
    """In-process wake-ups; the base of the cross-replica variants."""

    def __init__(self) -> None:
        # One future per sleeping waiter; all of this runs on one event loop, so no lock is
        # needed (a Condition shared by waiters that `wait_for` runs in their own tasks lost
        # track of who held it when a waiter was cancelled twice, as at a server's stop).
        self._sleepers: set[asyncio.Future[None]] = set()
        self._counts: Counter[str] = Counter()
        # Task keys are counted only while someone waits on them, so the counters stay bounded.
        self._watched: Counter[str] = Counter()
        # Bumped when anything may have been missed (a listener reconnected): wakes everyone.
        self._epoch = 0
        self.instance = os.urandom(6).hex()
        # How many callers are waiting right now (pollers, ?wait requests).
        self.waiting = 0

    def snapshot(self, keys: Iterable[str]) -> tuple[int, ...]:
        """The counters of `keys` now; pass it to `wait` to sleep until one of them moves."""
        return (self._epoch, *(self._counts[k] for k in keys))

    async def wait(
        self,
        keys: Iterable[str],
        since: tuple[int, ...],
        *,
        within: float,
        until: Callable[[], bool] | None = None,
    ) -> None:
        """Return when a counter of `keys` moved past `since`, when `until()` holds (checked
        whenever `nudge` is called), or after `within` seconds."""
        wanted = list(keys)
        if within <= 0:
            return

        def moved() -> bool:
            return self.snapshot(wanted) != since or (until is not None and until())

        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        self.waiting += 1
        try:
            while not moved():
                left = deadline - loop.time()
                if left <= 0:
                    return
                sleeper: asyncio.Future[None] = loop.create_future()
                self._sleepers.add(sleeper)
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(sleeper, left)
                finally:
                    self._sleepers.discard(sleeper)
        finally:
            self.waiting -= 1

    async def nudge(self) -> None:
        """Make every waiter check its `until` again."""
        self._wake()

    def _wake(self) -> None:
        sleepers, self._sleepers = self._sleepers, set()
        for sleeper in sleepers:
            if not sleeper.done():
                sleeper.set_result(None)

    @contextlib.contextmanager
    def watching(self, keys: Iterable[str]) -> Iterator[None]:
        """Count these (task) keys for the life of the block; call `snapshot` inside it."""
        wanted = list(keys)
        self._watched.update(wanted)
        try:
            yield
        finally:
            self._watched.subtract(wanted)
            for key in wanted:
                if self._watched[key] <= 0:
                    del self._watched[key]
                    self._counts.pop(key, None)

    async def mark(self, *, keys: Iterable[str] = (), everything: bool = False) -> None:
        """Bump counters (or the epoch) and wake the waiters whose keys moved."""
        moved = [k for k in keys if k.startswith("ready:") or k in self._watched]
        if not moved and not everything:
            return  # nobody here waits on these keys: nothing to wake (most event messages)
        self._counts.update(moved)
        if everything:
            self._epoch += 1
        self._wake()

    async def publish(self, conn: AsyncConnection, wake: Wake) -> None:
        """Send what must travel inside `conn`'s transaction (nothing, in process)."""
        del conn, wake

    async def announce(
        self,
        conn: AsyncConnection,
        *,
        connectors: Iterable[str] = (),
        tasks: Iterable[str] = (),
        events: Iterable[str] = (),
        follows: Iterable[str] = (),
    ) -> None:
        """Tell every replica, once `conn`'s transaction commits, what it changed: pollers of
        these connectors, waiters on these tasks, followers of these tasks' events (nothing is
        told if it rolls back)."""
        wake = Wake(
            connectors=frozenset(connectors),
            tasks=frozenset(tasks),
            events=frozenset(events),
            follows=frozenset(follows),
        )
        await self.publish(conn, wake)
        if wake.connectors or wake.tasks or wake.events or wake.follows:

            async def committed() -> None:
                await self.after_commit(wake)

            on_commit(conn, committed)

    async def after_commit(self, wake: Wake) -> None:
        """Wake local waiters for a committed change."""
        keys = [ready_key(c) for c in wake.connectors] + [task_key(t) for t in wake.tasks]
        keys += [events_key(t) for t in wake.events]
        if keys:
            await self.mark(keys=keys)

    async def announce_events(self, conn: AsyncConnection) -> None:
        """A commit observer (`Database.observe_commits`): every event appended wakes followers.

        Every event goes through `store.append_events`, so this one place covers every writer
        (submit, claims, reports, sweeps, caps, approvals) with no change to any of them.
        """
        tasks = tasks_with_events(conn)
        if tasks:
            await self.announce(conn, events=tasks)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class _ListeningNotifier(Notifier):
    """A notifier fed by a listener task that reconnects with capped backoff for ever."""

    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None
        # Tasks followed on other replicas → when that stops counting (loop time).
        self._followed: dict[str, float] = {}

    def followed_elsewhere(self, task_id: str) -> bool:
        """Whether another replica announced a follower of this task recently."""
        return self._followed.get(task_id, 0.0) > asyncio.get_running_loop().time()

    def _remember_follows(self, task_ids: Iterable[str]) -> None:
        now = asyncio.get_running_loop().time()
        if len(self._followed) > 1_000:  # forget expired announcements now and then
            self._followed = {t: until for t, until in self._followed.items() if until > now}
        for task_id in task_ids:
            self._followed[task_id] = now + FOLLOW_TTL

    async def _listen_once(self) -> None:
        """Connect, subscribe, then `receive` each message until disconnected."""
        raise NotImplementedError

    async def receive(self, payload: str) -> None:
        """Handle 'sender:kind:name' from another replica."""
        sender, _, rest = payload.partition(":")
        if sender == self.instance:
            return
        kind, _, name = rest.partition(":")
        if kind == "ready":
            await self.mark(keys=[ready_key(name)])
        elif kind == "events":
            await self.mark(keys=[events_key(t) for t in name.split(",")])
        elif kind == "follow":
            self._remember_follows(name.split(","))
        else:
            await self.mark(keys=[task_key(name)])

    def _payloads(self, wake: Wake) -> list[tuple[str, str]]:
        me = self.instance
        ready = [(READY_CHANNEL, f"{me}:ready:{c}") for c in sorted(wake.connectors)]
        done = [(TASK_CHANNEL, f"{me}:task:{t}") for t in sorted(wake.tasks)]
        followed = sorted(t for t in wake.events if self.followed_elsewhere(t))
        logs = [(TASK_CHANNEL, f"{me}:events:{p}") for p in _packed(followed)]
        follows = [(TASK_CHANNEL, f"{me}:follow:{p}") for p in _packed(sorted(wake.follows))]
        return ready + done + logs + follows

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name=f"{type(self).__name__}-listen")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                await self._listen_once()
                delay = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the listener must outlive any backend failure
                log.warning(
                    "wake-up listener lost its connection (%s); retrying in %.1fs",
                    type(exc).__name__,
                    delay,
                    extra={"event": "listener_reconnect"},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


# A transaction's wake-ups, delivered by Postgres when (and only if) it commits.
NOTIFY = """
SELECT pg_notify(n->>0, n->>1) FROM jsonb_array_elements(%(messages)s::jsonb) AS n
"""


def notify(conn: Connection, messages: Sequence[tuple[str, str]]) -> None:
    commit_statement(conn).select(NOTIFY, {"messages": json.dumps(messages)})


class PostgresNotifier(_ListeningNotifier):
    """Cross-replica wake-ups over LISTEN/NOTIFY on a dedicated autocommit connection."""

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self._conninfo = conninfo

    async def publish(self, conn: AsyncConnection, wake: Wake) -> None:
        """Queue the messages; all of a transaction's go out in one statement before commit."""
        payloads = self._payloads(wake)
        if payloads:
            pending: list[tuple[str, str]] | None = conn.info.get(_NOTIFY)
            if pending is None:
                pending = conn.info[_NOTIFY] = []
                before_commit(conn, _send_notifies)
            pending.extend(payloads)

    async def _listen_once(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            await conn.execute(f"LISTEN {READY_CHANNEL}")
            await conn.execute(f"LISTEN {TASK_CHANNEL}")
            # Anything may have happened while we were not listening.
            await self.mark(everything=True)
            async for notify in conn.notifies():
                await self.receive(notify.payload)


async def _send_notifies(conn: AsyncConnection) -> None:
    pending: list[tuple[str, str]] = conn.info.pop(_NOTIFY, [])
    if pending:
        notify(conn, pending)


class RedisNotifier(_ListeningNotifier):
    """Cross-replica wake-ups over Redis pub/sub, published once a transaction has committed.

    Redis holds nothing durable here: a lost message costs one recheck interval, never a step.
    """

    def __init__(self, url: str, *, channel: str) -> None:
        super().__init__()
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(url)
        self._channel = channel

    async def after_commit(self, wake: Wake) -> None:
        await super().after_commit(wake)
        payloads = [p for _, p in self._payloads(wake)]
        if not payloads:
            return
        try:
            await self._redis.publish(self._channel, json.dumps(payloads))
        except Exception as exc:  # redis.RedisError, OSError: a lost wake-up is only a delay
            log.warning(
                "could not publish a wake-up to Redis: %s",
                type(exc).__name__,
                extra={"event": "redis_unavailable"},
            )

    async def close(self) -> None:
        await super().close()
        await self._redis.aclose()

    async def _listen_once(self) -> None:
        async with self._redis.pubsub() as pubsub:
            await pubsub.subscribe(self._channel)
            await self.mark(everything=True)
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    for payload in json.loads(message["data"]):
                        await self.receive(payload)
