"""Following a task's event log live: every event once, in id order, woken by the notifier.

Event ids come from one sequence when a transaction inserts its events, just before it commits,
so on Postgres two transactions writing to the same task (a claim and a report of the same task
need not lock each other) can become visible out of id order: id 41 may commit after id 42. A
reader that moved its cursor past 42 would never see 41. So on Postgres a page is read with the
snapshot's bounds (`pg_current_snapshot()`: every transaction id below `xmin` has finished, every
one at or above `xmax` started after the snapshot), and the events it shows are delivered only
once every transaction that was running when they were first seen has finished: a transaction
that took an id below theirs was running then (it wrote before taking the id, so it had a
transaction id below that `xmax`). With nothing running at all the page is final at once, which
is the common case; otherwise the delivery waits for a re-read `settle` seconds later. SQLite has
one writer, whose ids commit in order.

Wake-ups: every event committed by this replica wakes its followers at once (the notifier's
commit observer). Events committed by another replica wake them through LISTEN/NOTIFY or Redis
once this replica has announced that it follows the task (at the first read, renewed every
`FOLLOW_REFRESH` s); an event the other replica commits before it has heard the announcement, or
a message lost with a listener's connection, is picked up by the re-read every `recheck` s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from agent_reach.states import TERMINAL_TASK_STATES, TaskStatus
from agent_reach_controller.domain.records import EventRow
from agent_reach_controller.services.queries import TaskNotFoundError
from agent_reach_controller.storage import feed as store
from agent_reach_controller.storage.engine import Connection, Database
from agent_reach_controller.storage.wakeups import FOLLOW_REFRESH, Notifier, events_key

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class FeedTimings:
    """How often a follower re-reads, and how long it may hold events back."""

    # Re-read this often without a wake-up: what a lost wake-up message costs at most.
    recheck: float = 1.0
    # Re-read this soon while the newest events wait for earlier transactions to finish.
    settle: float = 0.02
    # Deliver held-back events after this long anyway (a transaction that stays open longer,
    # anywhere on the Postgres server, would otherwise stall every stream).
    settle_limit: float = 2.0
    page: int = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowInput:
    task_id: str
    after: int = 0  # deliver events with a larger id
    idle: float = 15.0  # after this much silence, an empty batch (the caller's heartbeat)
    duration: float = 3600.0  # stop after this long, without `ended` (the caller resumes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """New events in order; or none (a heartbeat); or, last, the task's final status."""

    events: list[EventRow] = field(default_factory=list)
    ended: TaskStatus | None = None


@dataclass(slots=True)
class Settling:
    """Which of the visible events are final (see the module docstring); pure, no I/O."""

    held: int | None = None  # events up to this id wait for...
    until: int = 0  # ...every transaction id below this to have finished
    since: float = 0.0  # when they were first held
    forced: int = 0  # how many times the settle limit released events early

    @property
    def settled(self) -> bool:
        return self.held is None

    def release(
        self, rows: list[EventRow], *, xmin: int, xmax: int, now: float, limit: float
    ) -> list[EventRow]:
        """The prefix of `rows` (events after the cursor, in id order) that may be delivered.

        `xmin`, `xmax` bound the snapshot the rows were read in (equal: nothing was running).
        """
        if not rows or xmin >= xmax:
            self.held = None
            return rows
        ready: list[EventRow] = []
        if self.held is not None:
            if xmin < self.until and now - self.since < limit:
                return []
            if xmin < self.until:
                self.forced += 1
            ready = [r for r in rows if r.id <= self.held]
            self.held = None
        rest = rows[len(ready) :]
        if rest:
            self.held, self.until, self.since = rest[-1].id, xmax, now
        return ready


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    status: TaskStatus
    rows: list[EventRow]
    xmin: int = 0
    xmax: int = 0


class EventFeed:
    """Live followers of task event logs in this replica, and how many there are."""

    def __init__(
        self, *, db: Database, notifier: Notifier, timings: FeedTimings | None = None
    ) -> None:
        self._db = db
        self._notifier = notifier
        self.timings = timings or FeedTimings()
        self.followers = 0
        self._closing = False

    def reserve(self, limit: int) -> bool:
        """Take one of `limit` follower slots; False when all are taken. `release` gives it back."""
        if self.followers >= limit or self._closing:
            return False
        self.followers += 1
        return True

    def release(self) -> None:
        self.followers -= 1

    @property
    def closing(self) -> bool:
        return self._closing

    async def close(self) -> None:
        """End every follower now (a replica shutting down); their clients resume elsewhere."""
        self._closing = True
        await self._notifier.mark(everything=True)

    async def follow(self, data: FollowInput) -> AsyncIterator[Batch]:
        """The task's events after `data.after` as they commit; `ended` once it is terminal."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        quiet_since = start
        keys = [events_key(data.task_id)]
        settling = Settling()
        cursor = data.after
        t = self.timings
        announced = -FOLLOW_REFRESH
        with self._notifier.watching(keys):
            while not self._closing:
                since = self._notifier.snapshot(keys)
                announce = loop.time() - announced >= FOLLOW_REFRESH
                page = await self.read_page(data.task_id, after=cursor, announce=announce)
                now = loop.time()
                announced = now if announce else announced
                forced = settling.forced
                fresh = settling.release(
                    page.rows, xmin=page.xmin, xmax=page.xmax, now=now, limit=t.settle_limit
                )
                if settling.forced != forced:
                    log.warning(
                        "events of task %s were held back %.1fs for an open transaction; "
                        "delivered anyway",
                        data.task_id,
                        t.settle_limit,
                        extra={"event": "event_feed_unsettled"},
                    )
                whole = len(fresh) == len(page.rows)
                if fresh:
                    cursor = fresh[-1].id
                    quiet_since = now
                    yield Batch(events=fresh)
                    if whole and len(page.rows) >= t.page:
                        continue  # a full page: read the next one at once
                if page.status in TERMINAL_TASK_STATES and whole and settling.settled:
                    yield Batch(ended=page.status)
                    return
                if now - start >= data.duration:
                    return
                if now - quiet_since >= data.idle:
                    quiet_since = now
                    yield Batch()
                pause = min(
                    t.recheck if settling.settled else t.settle,
                    start + data.duration - now,
                    quiet_since + data.idle - now,
                )
                await self._notifier.wait(keys, since, within=pause)

    async def read_page(self, task_id: str, *, after: int, announce: bool = False) -> Page:
        """The task's status, then its events after `after` (a terminal status read first
        guarantees its last events are visible to the second read); with `announce`, tell the
        other replicas that this one follows the task."""
        async with self._db.transaction() as conn:
            if announce:
                await self._notifier.announce(conn, follows=[task_id])
            return await self._read(conn, task_id, after=after)

    async def _read(self, conn: Connection, task_id: str, *, after: int) -> Page:
        status = await store.task_status(conn, task_id)
        if status is None:
            raise TaskNotFoundError(task_id)
        rows, xmin, xmax = await store.events_page(
            conn, task_id, after=after, limit=self.timings.page
        )
        return Page(status=TaskStatus(status), rows=rows, xmin=xmin, xmax=xmax)
