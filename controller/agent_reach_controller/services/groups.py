"""Group commit: calls that arrive while the database is busy share their next transaction.

A call runs at once, in a transaction of its own, while fewer than `open` are in flight, so a
lone caller never waits for company. Calls that arrive while `open` transactions are in flight
wait for one of them to end and then run together, up to `size` of them in one transaction: one
BEGIN, one commit statement, one COMMIT (and one WAL flush) for the lot.

A group is all or nothing, so one member's refusal (an Idempotency-Key another submit holds, a
catalogue that changed under it) would fail the others. When a group fails before its COMMIT was
sent, or its commit was refused by a guard, nothing of it was written: each member then runs
again alone and gets its own answer. Any other failure at commit leaves the outcome unknown (the
COMMIT may have landed), so every member gets that error, as a lone call would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class GroupFailed(Exception):
    """Raised by a `together` callable: nothing of the group was written, so each member may run
    again alone (`cause` is what stopped the group)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(slots=True)
class _Waiting(Generic[T, R]):
    item: T
    answer: asyncio.Future[R] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(slots=True)
class GroupStats:
    """What the groups did, for metrics: transactions by size, and groups run again alone."""

    sizes: dict[int, int] = field(default_factory=dict)
    split: int = 0


class GroupCommit(Generic[T, R]):
    """Runs `alone(item)` while fewer than `open` calls are in flight, else queues the item for
    the next `together(items)`, which returns one answer per item, in order, or raises
    `GroupFailed` when each item should run alone instead."""

    def __init__(
        self,
        alone: Callable[[T], Awaitable[R]],
        together: Callable[[Sequence[T]], Awaitable[list[R]]],
        *,
        open: int = 1,
        size: int = 32,
        observe: Callable[[int], None] | None = None,
        split: Callable[[], None] | None = None,
    ) -> None:
        if open < 1 or size < 1:
            raise ValueError("a group commit needs open >= 1 and size >= 1")
        self._alone, self._together = alone, together
        self._open, self._size = open, size
        self._observe, self._split = observe, split
        self._in_flight = 0
        self._queue: list[_Waiting[T, R]] = []
        self._running: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    async def __call__(self, item: T) -> R:
        if self._in_flight < self._open and not self._queue:
            self._in_flight += 1
            try:
                self._count(1)
                return await self._alone(item)
            finally:
                self._in_flight -= 1
                self._next()
        waiting: _Waiting[T, R] = _Waiting(item)
        self._queue.append(waiting)
        self._next()
        return await waiting.answer

    def _next(self) -> None:
        while self._queue and self._in_flight < self._open:
            batch = [w for w in self._queue[: self._size] if not w.answer.done()]
            del self._queue[: self._size]
            if not batch:
                continue
            self._in_flight += 1
            task = asyncio.create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[_Waiting[T, R]]) -> None:
        try:
            if len(batch) == 1:
                self._count(1)
                await _settle(batch[0], self._alone(batch[0].item))
                return
            try:
                self._count(len(batch))
                answers = await self._together([w.item for w in batch])
            except GroupFailed:
                self.stats.split += 1
                if self._split is not None:
                    self._split()
                await asyncio.gather(*(_settle(w, self._alone(w.item)) for w in batch))
            except BaseException as exc:  # the outcome is unknown: every member hears of it
                for w in batch:
                    _answer(w, exc=exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                for w, answer in zip(batch, answers, strict=True):
                    _answer(w, answer=answer)
        finally:
            self._in_flight -= 1
            self._next()

    def _count(self, size: int) -> None:
        self.stats.sizes[size] = self.stats.sizes.get(size, 0) + 1
        if self._observe is not None:
            self._observe(size)


async def _settle(waiting: _Waiting[T, R], call: Awaitable[R]) -> None:
    try:
        answer = await call
    except BaseException as exc:
        _answer(waiting, exc=exc)
        if not isinstance(exc, Exception):
            raise
    else:
        _answer(waiting, answer=answer)


def _answer(
    waiting: _Waiting[T, R], *, answer: R | None = None, exc: BaseException | None = None
) -> None:
    if waiting.answer.done():  # its caller went away (a dropped request)
        return
    if isinstance(exc, asyncio.CancelledError):
        waiting.answer.cancel()
    elif exc is not None:
        waiting.answer.set_exception(exc)
    else:
        waiting.answer.set_result(answer)  # type: ignore[arg-type]
