"""Wake-ups: a new ready step wakes the pollers of its connector, a finished task its waiters.

Locally an asyncio condition over per-key counters; across replicas Postgres LISTEN/NOTIFY (sent
inside the transaction, so delivered exactly when the change commits) or Redis pub/sub. A replica
ignores its own cross-replica messages: it has already woken its local waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger(__name__)

READY_CHANNEL = "agent_reach_ready"
TASK_CHANNEL = "agent_reach_task"


@dataclass(frozen=True, slots=True, kw_only=True)
class Wake:
    """What a transaction changed, announced once it has committed."""

    connectors: frozenset[str] = field(default_factory=frozenset)
    tasks: frozenset[str] = field(default_factory=frozenset)


def ready_key(connector: str) -> str:
    """The counter pollers of this connector wait on."""
    return f"ready:{connector}"


def task_key(task_id: str) -> str:
    """The counter callers waiting for this task to end wait on."""
    return f"task:{task_id}"


class Notifier:
    """In-process wake-ups; the base of the cross-replica variants."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
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

    async def wait(self, keys: Iterable[str], since: tuple[int, ...], *, within: float) -> None:
        """Return when a counter of `keys` moved past `since`, or after `within` seconds."""
        wanted = list(keys)
        if within <= 0:
            return
        async with self._changed:
            self.waiting += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: self.snapshot(wanted) != since), within
                    )
            finally:
                self.waiting -= 1

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
        async with self._changed:
            self._counts.update(k for k in keys if k.startswith("ready:") or k in self._watched)
            if everything:
                self._epoch += 1
            self._changed.notify_all()

    async def publish(
        self,
        conn: AsyncConnection,
        *,
        connectors: Iterable[str] = (),
        tasks: Iterable[str] = (),
    ) -> Wake:
        """Record what `conn`'s transaction changed; call `after_commit` with it once committed."""
        del conn
        return Wake(connectors=frozenset(connectors), tasks=frozenset(tasks))

    async def after_commit(self, wake: Wake) -> None:
        """Wake local waiters for a committed change."""
        keys = [ready_key(c) for c in wake.connectors] + [task_key(t) for t in wake.tasks]
        if keys:
            await self.mark(keys=keys)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class _ListeningNotifier(Notifier):
    """A notifier fed by a listener task that reconnects with capped backoff for ever."""

    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None

    async def _listen_once(self) -> None:
        """Connect, subscribe, then `receive` each message until disconnected."""
        raise NotImplementedError

    async def receive(self, payload: str) -> None:
        """Handle 'sender:kind:name' from another replica."""
        sender, _, rest = payload.partition(":")
        if sender == self.instance:
            return
        kind, _, name = rest.partition(":")
        await self.mark(keys=[ready_key(name) if kind == "ready" else task_key(name)])

    def _payloads(self, wake: Wake) -> list[tuple[str, str]]:
        ready = [(READY_CHANNEL, f"{self.instance}:ready:{c}") for c in sorted(wake.connectors)]
        done = [(TASK_CHANNEL, f"{self.instance}:task:{t}") for t in sorted(wake.tasks)]
        return ready + done

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


class PostgresNotifier(_ListeningNotifier):
    """Cross-replica wake-ups over LISTEN/NOTIFY on a dedicated autocommit connection."""

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self._conninfo = conninfo

    async def publish(
        self,
        conn: AsyncConnection,
        *,
        connectors: Iterable[str] = (),
        tasks: Iterable[str] = (),
    ) -> Wake:
        wake = await super().publish(conn, connectors=connectors, tasks=tasks)
        for channel, payload in self._payloads(wake):
            await conn.execute(
                sa.text("SELECT pg_notify(:channel, :payload)"),
                {"channel": channel, "payload": payload},
            )
        return wake

    async def _listen_once(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            await conn.execute(f"LISTEN {READY_CHANNEL}")
            await conn.execute(f"LISTEN {TASK_CHANNEL}")
            # Anything may have happened while we were not listening.
            await self.mark(everything=True)
            async for notify in conn.notifies():
                await self.receive(notify.payload)


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
