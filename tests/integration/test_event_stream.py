"""`GET /v1/tasks/{id}/events` as Server-Sent Events, over a real listener on 127.0.0.1.

httpx's ASGI transport buffers whole responses, so these tests serve the app with uvicorn on port
0 and read the stream as it arrives. Steps are driven through the dispatch service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn

from agent_reach_cli.plan_tree import SseMessage, SseParser
from agent_reach_controller.api.app import create_app
from agent_reach_controller.domain.records import EventRow
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.feed import EventFeed, FeedTimings, FollowInput, Settling
from agent_reach_controller.storage.wakeups import PostgresNotifier, RedisNotifier
from tests.integration.stack import components_for, failed, key_for, ok, start_task, write_tools

CHAIN = {
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {"text": "one"}},
        {"step_id": "b", "tool": "echo.say", "args": {"text": "two"}, "depends_on": ["a"]},
    ]
}
SSE = {"Accept": "text/event-stream"}


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # the test runner owns the signals
        yield


@contextlib.asynccontextmanager
async def serving(c: Components) -> AsyncIterator[str]:
    """The app of these components on a real socket; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    sock.setblocking(False)
    config = uvicorn.Config(
        create_app(c), log_config=None, access_log=False, lifespan="off", loop="none"
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(10):
            while not server.started:  # noqa: ASYNC110 (a flag, polled to a deadline)
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await c.feed.close()
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


class Follower:
    """Reads one event stream in the background, keeping every message and comment."""

    def __init__(self, client: httpx.AsyncClient, path: str, headers: dict[str, str]) -> None:
        self.messages: list[SseMessage] = []
        self.parser = SseParser()
        self.response: httpx.Response | None = None
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._run(client, path, headers))

    async def _run(self, client: httpx.AsyncClient, path: str, headers: dict[str, str]) -> None:
        try:
            async with client.stream("GET", path, headers=headers) as response:
                self.response = response
                await self._notify()
                async for chunk in response.aiter_text():
                    self.messages += self.parser.feed(chunk)
                    await self._notify()
        finally:
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(self, predicate: Callable[[Follower], Any], *, within: float = 10) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(lambda: predicate(self) or self._task.done())
        if not predicate(self):
            self._task.result()  # raises what ended the stream, if anything did
            raise AssertionError(f"the stream ended first: {self.messages}")

    async def closed(self, *, within: float = 10) -> None:
        await asyncio.wait_for(asyncio.shield(self._task), within)

    async def cancel(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    @property
    def events(self) -> list[SseMessage]:
        return [m for m in self.messages if m.event != "end"]

    @property
    def ended(self) -> dict[str, Any] | None:
        ends = [json.loads(m.data) for m in self.messages if m.event == "end"]
        return ends[-1] if ends else None


@contextlib.asynccontextmanager
async def http(c: Components, **key: Any) -> AsyncIterator[httpx.AsyncClient]:
    headers = await key_for(c, **key)
    timeout = httpx.Timeout(10.0, read=60.0)
    async with (
        serving(c) as base,
        httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout) as client,
    ):
        yield client


async def run_step(c: Components, *, fail: bool = False) -> None:
    [step] = await c.leasing.claim(executor_id="e1", connectors=["echo"], limit=1)
    result = failed(step, "not_found", retryable=False) if fail else ok(step, {"n": 1})
    await c.reporting.report(executor_id="e1", results=[result])


async def listed(client: httpx.AsyncClient, task_id: str, after: int = 0) -> list[dict[str, Any]]:
    page = await client.get(f"/v1/tasks/{task_id}/events", params={"after": after})
    assert page.status_code == 200
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def ids(messages: list[SseMessage]) -> list[int]:
    return [int(m.id or 0) for m in messages]


async def test_the_stream_delivers_every_event_in_order_then_ends(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, http(c) as client:
        task_id = await start_task(client, CHAIN)
        live = Follower(client, f"/v1/tasks/{task_id}/events", SSE)
        # Submitting committed task_created and a's unblock before the stream opened.
        await live.until(lambda f: len(f.events) >= 2)
        assert live.response is not None
        assert live.response.headers["content-type"].startswith("text/event-stream")
        assert live.response.headers["cache-control"] == "no-cache"
        assert live.response.headers["x-accel-buffering"] == "no"
        await run_step(c)
        await live.until(lambda f: any(json.loads(m.data)["step_id"] == "b" for m in f.events))
        await run_step(c)
        await live.closed()

        everything = await listed(client, task_id)
        assert ids(live.events) == [e["id"] for e in everything]
        assert [m.event for m in live.events] == [e["kind"] for e in everything]
        assert [json.loads(m.data) for m in live.events] == everything
        assert live.ended == {"task_id": task_id, "status": "succeeded"}
        assert live.messages[-1].event == "end"
        assert c.feed.followers == 0


async def test_resuming_after_an_event_has_no_gaps_and_no_repeats(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, http(c) as client:
        task_id = await start_task(client, CHAIN)
        path = f"/v1/tasks/{task_id}/events"
        first = Follower(client, path, SSE)
        await first.until(lambda f: len(f.events) >= 2)
        await first.cancel()  # the client goes away mid-task…
        await run_step(c)  # …while the task moves on
        second = Follower(client, path, {**SSE, "Last-Event-ID": first.parser.last_id or ""})
        await second.until(lambda f: any(m.event == "succeed" for m in f.events))
        await run_step(c)
        await second.closed()
        everything = [e["id"] for e in await listed(client, task_id)]
        assert ids(first.events) + ids(second.events) == everything
        assert second.ended == {"task_id": task_id, "status": "succeeded"}

        # Resuming a finished task: what is left, then the end; `?after=` says the same.
        third = everything[2]
        for resume in (
            Follower(client, path, {**SSE, "Last-Event-ID": str(third)}),
            Follower(client, f"{path}?after={third}", SSE),
        ):
            await resume.closed()
            assert ids(resume.events) == everything[3:]
            assert resume.ended == {"task_id": task_id, "status": "succeeded"}
        last = Follower(client, path, {**SSE, "Last-Event-ID": str(everything[-1])})
        await last.closed()
        assert last.events == []
        assert last.ended == {"task_id": task_id, "status": "succeeded"}


async def test_a_failed_task_ends_its_stream_with_its_status(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, http(c) as client:
        task_id = await start_task(client, CHAIN)
        live = Follower(client, f"/v1/tasks/{task_id}/events", SSE)
        await run_step(c, fail=True)
        await live.closed()
        assert live.ended == {"task_id": task_id, "status": "failed"}
        assert [m.event for m in live.events][-3:] == ["fail", "skip", "task_status"]


async def test_another_tenants_task_is_not_found_and_a_key_is_needed(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c, http(c) as client:
        task_id = await start_task(client, CHAIN)
        path = f"/v1/tasks/{task_id}/events"
        other = await key_for(c, tenant="other", name="stranger")
        theirs = await client.get(path, headers={**SSE, **other})
        missing = await client.get("/v1/tasks/no-such-task/events", headers=SSE)
        assert theirs.status_code == missing.status_code == 404
        assert theirs.headers["content-type"] == "application/problem+json"
        assert theirs.json()["code"] == missing.json()["code"] == "not_found"
        anonymous = await client.get(path, headers={**SSE, "Authorization": ""})
        assert anonymous.status_code == 401
        bad_resume = await client.get(path, headers={**SSE, "Last-Event-ID": "x1"})
        assert bad_resume.status_code == 422
        assert c.feed.followers == 0


async def test_streams_beyond_the_cap_are_refused_with_429(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(database_url, write_tools(tmp_path), max_event_streams=1) as c,
        http(c) as client,
    ):
        task_id = await start_task(client, CHAIN)
        path = f"/v1/tasks/{task_id}/events"
        first = Follower(client, path, SSE)
        await first.until(lambda f: f.events)
        refused = await client.get(path, headers=SSE)
        assert refused.status_code == 429
        assert refused.json()["code"] == "too_many_streams"
        assert int(refused.headers["retry-after"]) >= 1
        assert (await client.get(path)).status_code == 200  # the JSON list is not capped
        await first.cancel()
        async with asyncio.timeout(10):
            while c.feed.followers:  # noqa: ASYNC110 (a counter, polled to a deadline)
                await asyncio.sleep(0.01)
        again = Follower(client, path, SSE)
        await again.until(lambda f: f.events)
        await again.cancel()


async def test_a_quiet_stream_sends_heartbeats_and_closes_at_its_duration_limit(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings = {"event_stream_heartbeat_seconds": 0.1, "event_stream_max_seconds": 3.0}
    async with (
        components_for(sqlite_url, write_tools(tmp_path), **settings) as c,
        http(c) as client,
    ):
        task_id = await start_task(client, CHAIN)
        path = f"/v1/tasks/{task_id}/events"
        quiet = Follower(client, path, SSE)
        await quiet.until(lambda f: f.parser.comments >= 2)
        await quiet.closed()  # at the limit, without an end: the client resumes
        assert quiet.ended is None
        assert len(quiet.events) == 2
        await run_step(c)
        await run_step(c)
        resumed = Follower(client, path, {**SSE, "Last-Event-ID": quiet.parser.last_id or ""})
        await resumed.closed()
        assert ids(quiet.events) + ids(resumed.events) == [
            e["id"] for e in await listed(client, task_id)
        ]
        assert resumed.ended == {"task_id": task_id, "status": "succeeded"}


async def test_shutting_down_ends_open_streams_without_an_end(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, http(c) as client:
        task_id = await start_task(client, CHAIN)
        live = Follower(client, f"/v1/tasks/{task_id}/events", SSE)
        await live.until(lambda f: f.events)
        await c.feed.close()
        await live.closed()
        assert live.ended is None
        assert c.feed.followers == 0
        refused = await client.get(f"/v1/tasks/{task_id}/events", headers=SSE)
        assert refused.status_code == 503
        assert refused.json()["code"] == "shutting_down"


@pytest.mark.parametrize("redis", [False, pytest.param(True, marks=pytest.mark.redis)])
async def test_step_events_wake_a_stream_served_by_another_replica(
    postgres_url: str, tmp_path: Path, redis: bool, request: pytest.FixtureRequest
) -> None:
    """The serving replica never re-reads on its own here: only a wake-up can deliver."""
    tools = write_tools(tmp_path)
    extra = {"redis_url": request.getfixturevalue("redis_url")} if redis else {}
    async with (
        components_for(postgres_url, tools, **extra) as serving_replica,
        components_for(postgres_url, tools, **extra) as working_replica,
        http(serving_replica) as client,
    ):
        serving_replica.feed.timings = FeedTimings(recheck=3600.0)
        task_id = await start_task(client, CHAIN)
        live = Follower(client, f"/v1/tasks/{task_id}/events", SSE)
        await live.until(lambda f: len(f.events) >= 2)
        # The stream announced that it follows the task; once the other replica has heard it,
        # that replica's commits for the task send wake-ups (before, only the recheck would).
        notifier = working_replica.notifier
        assert isinstance(notifier, PostgresNotifier | RedisNotifier)
        async with asyncio.timeout(10):
            while not notifier.followed_elsewhere(task_id):  # noqa: ASYNC110 (to a deadline)
                await asyncio.sleep(0.005)
        [step] = await working_replica.leasing.claim(executor_id="e1", connectors=["echo"], limit=1)
        await live.until(lambda f: f.events[-1].event == "task_status")  # lease, then running
        assert [m.event for m in live.events][-2:] == ["lease", "task_status"]
        await working_replica.reporting.report(executor_id="e1", results=[ok(step, {})])
        await live.until(lambda f: any(m.event == "succeed" for m in f.events))
        await live.cancel()


async def test_every_event_wakes_a_stream_in_the_same_process(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Claims publish no wake-up of their own; their events still wake the stream at once."""
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, http(c) as client:
        c.feed.timings = FeedTimings(recheck=3600.0)
        task_id = await start_task(client, CHAIN)
        live = Follower(client, f"/v1/tasks/{task_id}/events", SSE)
        await live.until(lambda f: len(f.events) >= 2)
        await c.leasing.claim(executor_id="e1", connectors=["echo"], limit=1)
        await live.until(lambda f: [m.event for m in f.events][-2:] == ["lease", "task_status"])
        await live.cancel()


def test_settling_holds_events_until_earlier_transactions_have_finished() -> None:
    rows = [_row(10), _row(12)]
    s = Settling()
    # Nothing was running when they were read: final at once.
    assert s.release(rows, xmin=100, xmax=100, now=0.0, limit=2.0) == rows
    # Transactions 100..104 were running: held until all of them have finished.
    assert s.release(rows, xmin=100, xmax=105, now=0.0, limit=2.0) == []
    assert s.release(rows, xmin=103, xmax=107, now=0.1, limit=2.0) == []
    later = [_row(10), _row(11), _row(12), _row(13)]  # 11 committed late; 13 is new
    assert s.release(later, xmin=105, xmax=108, now=0.2, limit=2.0) == later[:3]
    assert not s.settled  # 13 now waits for transactions up to 107
    assert s.release(later[3:], xmin=106, xmax=109, now=2.3, limit=2.0) == later[3:]
    assert s.forced == 1  # let go at the limit
    assert s.release([], xmin=1, xmax=9, now=3.0, limit=2.0) == []
    assert s.settled


async def test_an_event_committed_late_under_a_lower_id_is_not_skipped(
    postgres_url: str, tmp_path: Path
) -> None:
    """A transaction takes event id N and commits after another's N+1: the feed holds N+1
    back until N's transaction has finished, then delivers both, in id order."""
    async with components_for(postgres_url, write_tools(tmp_path)) as c, http(c) as client:
        task_id = await start_task(client, CHAIN)
        feed = EventFeed(db=c.db, notifier=c.notifier, timings=FeedTimings(settle_limit=3600))
        before = await listed(client, task_id)
        async with await psycopg.AsyncConnection.connect(
            postgres_url.replace("postgresql+psycopg", "postgresql")
        ) as slow:
            await slow.execute(
                "INSERT INTO events (task_id, kind, created_at) VALUES (%s, 'late', now())",
                (task_id,),
            )
            await c.leasing.claim(executor_id="e1", connectors=["echo"], limit=1)
            committed = await listed(client, task_id, after=before[-1]["id"])
            assert [e["kind"] for e in committed] == ["lease", "task_status"]
            page = await feed.read_page(task_id, after=before[-1]["id"])
            assert [r.kind for r in page.rows] == ["lease", "task_status"]
            held = Settling()
            now = 0.0
            assert held.release(page.rows, xmin=page.xmin, xmax=page.xmax, now=now, limit=9) == []
            await slow.commit()
        # Released once every transaction open at the first read has finished (on a shared
        # server that may include others', e.g. this controller's background loops).
        async with asyncio.timeout(10):
            while True:
                page = await feed.read_page(task_id, after=before[-1]["id"])
                released = held.release(page.rows, xmin=page.xmin, xmax=page.xmax, now=now, limit=9)
                if released:
                    break
                await asyncio.sleep(0.05)
        assert [r.kind for r in released] == ["late", "lease", "task_status"]
        assert [r.id for r in released] == sorted(r.id for r in released)

        # Through the whole feed: every event once, in id order.
        stream = feed.follow(FollowInput(task_id=task_id, after=before[-1]["id"], duration=5))
        async with asyncio.timeout(10):
            first = await anext(stream)
        assert [e.kind for e in first.events] == ["late", "lease", "task_status"]
        await stream.aclose()


def _row(event_id: int) -> EventRow:
    return EventRow(
        id=event_id,
        task_id="t",
        step_id=None,
        kind="k",
        from_status=None,
        to_status=None,
        attempt=None,
        data=None,
        created_at=datetime.now(UTC),
    )
