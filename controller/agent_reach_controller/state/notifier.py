"""Wake-ups: a new ready step wakes waiting pollers at once, a finished task wakes its waiters.

Locally an asyncio condition; across replicas Postgres LISTEN/NOTIFY (sent inside the
transaction, so it is delivered exactly when the change commits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger(__name__)

READY_CHANNEL = "agent_reach_ready"
TASK_CHANNEL = "agent_reach_task"


class Notifier:
    """In-process wake-ups; the base of the cross-replica variant."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._generation = 0

    async def publish_local(self) -> None:
        async with self._changed:
            self._generation += 1
            self._changed.notify_all()

    async def publish(
        self,
        conn: AsyncConnection,
        *,
        connectors: Iterable[str] = (),
        tasks: Iterable[str] = (),
    ) -> None:
        """Announce changes made in `conn`'s transaction (delivered after commit)."""
        del conn, connectors, tasks

    async def after_commit(self) -> None:
        """Wake local waiters once a transaction that published has committed."""
        await self.publish_local()

    def generation(self) -> int:
        return self._generation

    async def wait(self, since: int, *, within: float) -> None:
        """Return when anything was published after `since`, or after `within` seconds."""
        if within <= 0:
            return
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._generation != since), within
                )

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
        """Connect, subscribe, then call `publish_local` for each message until disconnected."""
        raise NotImplementedError

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
    ) -> None:
        payloads = [(READY_CHANNEL, c) for c in sorted(set(connectors))]
        payloads += [(TASK_CHANNEL, t) for t in sorted(set(tasks))]
        for channel, payload in payloads:
            await conn.execute(
                sa.text("SELECT pg_notify(:channel, :payload)"),
                {"channel": channel, "payload": payload},
            )

    async def _listen_once(self) -> None:
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            await conn.execute(f"LISTEN {READY_CHANNEL}")
            await conn.execute(f"LISTEN {TASK_CHANNEL}")
            # Anything may have happened while we were not listening.
            await self.publish_local()
            async for _ in conn.notifies():
                await self.publish_local()


class RedisNotifier(_ListeningNotifier):
    """Cross-replica wake-ups over Redis pub/sub, published once a transaction has committed.

    Redis holds nothing durable here: a lost message costs one recheck interval, never a step.
    """

    def __init__(self, url: str, *, channel: str) -> None:
        super().__init__()
        import redis.asyncio as aioredis

        self._redis = aioredis.Redis.from_url(url)
        self._channel = channel

    async def after_commit(self) -> None:
        await self.publish_local()
        try:
            await self._redis.publish(self._channel, b"1")
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
            await self.publish_local()
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    await self.publish_local()
