"""The asyncio client: the same operations as `Client`, awaited."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, cast

import httpx

from agent_reach_client import _calls
from agent_reach_client._core import (
    Call,
    Settings,
    SseParser,
    result,
    retry_delay,
    submit_call,
    with_subject,
)
from agent_reach_client._sync import TERMINAL
from agent_reach_client.errors import PendingCalls
from agent_reach_client.types import (
    Agent,
    Dialect,
    Event,
    Memory,
    MemorySubjects,
    MemoryType,
    Run,
    RunInput,
    RunLimits,
    Task,
    ToolFormat,
    Turn,
)


class AsyncClient:
    """The controller's REST API for asyncio. `base_url` and `api_key` default to the
    AGENT_REACH_URL and AGENT_REACH_API_KEY environment variables."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = Settings.of(base_url, api_key, timeout, retries)
        self._http = httpx.AsyncClient(
            base_url=self._settings.base_url,
            headers=self._settings.headers(),
            timeout=timeout,
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call, *, read_timeout: float | None = None) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    headers=call.headers,
                    timeout=read_timeout or self._settings.timeout,
                )
            except httpx.TransportError:
                delay = retry_delay(self._settings, attempt, None) if call.repeatable else None
                if delay is None:
                    raise
            else:
                delay = retry_delay(self._settings, attempt, response)
                if delay is None:
                    return result(response)
            await asyncio.sleep(delay)

    async def submit(  # noqa: PLR0913 - the task's options, all by keyword
        self,
        body: Any,
        *,
        wait: float | None = None,
        dialect: Dialect | None = None,
        atomic: bool = False,
        idempotency_key: str | None = None,
        traceparent: str | None = None,
        subject: str | None = None,
    ) -> Task:
        """See `Client.submit`."""
        call = submit_call(
            body if subject is None else with_subject(body, subject),
            wait=wait,
            dialect=dialect,
            atomic=atomic,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
        )
        return cast(Task, await self._send(call, read_timeout=self._settings.timeout + (wait or 0)))

    async def answer(
        self,
        turn: Any,
        *,
        within: float = 120.0,
        dialect: Dialect | None = None,
        idempotency_key: str | None = None,
    ) -> list[dict[str, Any]]:
        """See `Client.answer`."""
        deadline = time.monotonic() + within
        accepted = await self.submit(
            turn, dialect=dialect, idempotency_key=idempotency_key, wait=min(within, 30.0)
        )
        while True:
            left = deadline - time.monotonic()
            answered = await self.replies(accepted["task_id"], wait=max(0.0, min(left, 30.0)))
            if not answered["pending"]:
                return answered["replies"]
            if left <= 0:
                raise PendingCalls(accepted["task_id"], answered["pending"])

    async def replies(self, task_id: str, *, wait: float | None = None) -> Turn:
        read_timeout = self._settings.timeout + (wait or 0)
        return cast(
            Turn, await self._send(_calls.replies(task_id, wait), read_timeout=read_timeout)
        )

    async def task(self, task_id: str) -> Task:
        return cast(Task, await self._send(_calls.task(task_id)))

    async def wait(self, task_id: str, *, within: float = 120.0) -> Task:
        """See `Client.wait`."""
        deadline = time.monotonic() + within
        async for _ in self.events(task_id, within=within):
            if time.monotonic() > deadline:
                break
        found = await self.task(task_id)
        if found["status"] not in TERMINAL:
            raise TimeoutError(f"task {task_id} is still {found['status']}")
        return found

    async def events(
        self, task_id: str, *, after: int = 0, within: float = 300.0
    ) -> AsyncIterator[Event]:
        """See `Client.events`."""
        last = after
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                async with self._http.stream(
                    "GET", f"/v1/tasks/{task_id}/events", headers=headers, timeout=within
                ) as response:
                    if not response.is_success:
                        await response.aread()
                        result(response)
                    parser = SseParser()
                    async for line in response.aiter_lines():
                        for kind, data, event_id in parser.feed(line):
                            if kind == "end":
                                return
                            event = cast(Event, json.loads(data))
                            last = int(event_id) if event_id else event["id"]
                            yield event
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.5)  # the stream ended without `end`, or broke: resume from `last`

    async def approve(
        self, task_id: str, step_id: str, *, reason: str = "", args: dict[str, Any] | None = None
    ) -> Task:
        body = _calls.approval(reason, args, approve=True)
        return cast(Task, await self._send(_calls.decide(task_id, step_id, body)))

    async def reject(self, task_id: str, step_id: str, *, reason: str) -> Task:
        body = _calls.approval(reason, None, approve=False)
        return cast(Task, await self._send(_calls.decide(task_id, step_id, body)))

    async def resolve(
        self, task_id: str, step_id: str, action: str, *, output: Any = None, reason: str = ""
    ) -> Task:
        body = _calls.verdict(action, output, reason)
        return cast(Task, await self._send(_calls.resolve(task_id, step_id, body)))

    async def cancel(self, task_id: str) -> Task:
        return cast(Task, await self._send(_calls.cancel(task_id)))

    async def tools(self, format: ToolFormat = "native") -> Any:
        return await self._send(_calls.tools(format))

    # --- agents and runs --------------------------------------------------------------------

    async def put_agent(
        self, name: str, profile: dict[str, Any], *, if_revision: int | None = None
    ) -> Agent:
        """See `Client.put_agent`."""
        return cast(Agent, await self._send(_calls.put_agent(name, profile, if_revision)))

    async def get_agent(self, name: str) -> Agent:
        return cast(Agent, await self._send(_calls.agent(name)))

    async def list_agents(self) -> list[Agent]:
        return cast(list[Agent], (await self._send(_calls.agents()))["agents"])

    async def delete_agent(self, name: str, *, if_revision: int | None = None) -> None:
        await self._send(_calls.delete_agent(name, if_revision))

    async def start_run(  # noqa: PLR0913 - the run's parts, all by keyword
        self,
        agent: str,
        input: RunInput,
        *,
        subject: str | None = None,
        context: dict[str, Any] | None = None,
        limits: RunLimits | None = None,
        wait: float | None = None,
        idempotency_key: str | None = None,
    ) -> Run:
        """See `Client.start_run`."""
        body = _calls.run_body(agent, input, subject, context, limits)
        call = _calls.start_run(body, wait, idempotency_key)
        return cast(Run, await self._send(call, read_timeout=self._timeout(wait)))

    async def get_run(self, run_id: str, *, wait: float | None = None) -> Run:
        call = _calls.run(run_id, wait)
        return cast(Run, await self._send(call, read_timeout=self._timeout(wait)))

    async def list_runs(self, *, limit: int = 50, before: str | None = None) -> list[Run]:
        return cast(list[Run], (await self._send(_calls.runs(limit, before)))["runs"])

    async def continue_run(self, run_id: str, input: RunInput, *, wait: float | None = None) -> Run:
        """See `Client.continue_run`."""
        call = _calls.continue_run(run_id, input, wait)
        return cast(Run, await self._send(call, read_timeout=self._timeout(wait)))

    async def cancel_run(self, run_id: str) -> Run:
        return cast(Run, await self._send(_calls.cancel_run(run_id)))

    # --- long-term memory -------------------------------------------------------------------

    async def list_subjects(self, *, limit: int = 100, after: str | None = None) -> MemorySubjects:
        """See `Client.list_subjects`."""
        return cast(MemorySubjects, await self._send(_calls.subjects(limit, after)))

    async def list_memories(
        self, subject: str, *, types: Sequence[MemoryType] = (), limit: int = 100
    ) -> list[Memory]:
        """See `Client.list_memories`."""
        found = await self._send(_calls.memories(subject, types, limit))
        return cast(list[Memory], found["memories"])

    async def search_memory(self, subject: str, query: str, *, limit: int = 10) -> list[Memory]:
        """See `Client.search_memory`."""
        found = await self._send(_calls.search_memory(subject, query, limit))
        return cast(list[Memory], found["memories"])

    async def put_memory(  # noqa: PLR0913 - an entry's fields, all by keyword
        self,
        subject: str,
        type: MemoryType,
        key: str,
        text: str,
        *,
        value: Any = None,
        pinned: bool = False,
        confidence: float | None = None,
        expires_at: str | None = None,
    ) -> Memory:
        """See `Client.put_memory`."""
        body = _calls.memory_body(
            subject,
            type,
            key,
            text,
            value=value,
            pinned=pinned,
            confidence=confidence,
            expires_at=expires_at,
        )
        return cast(Memory, await self._send(_calls.put_memory(body)))

    async def get_memory(self, memory_id: str) -> Memory:
        return cast(Memory, await self._send(_calls.memory(memory_id)))

    async def patch_memory(
        self, memory_id: str, changes: dict[str, Any], *, if_version: int | None = None
    ) -> Memory:
        """See `Client.patch_memory`."""
        call = _calls.patch_memory(memory_id, changes, if_version)
        return cast(Memory, await self._send(call))

    async def forget_memory(self, memory_id: str) -> None:
        """See `Client.forget_memory`."""
        await self._send(_calls.forget_memory(memory_id))

    async def forget_subject(self, subject: str) -> int:
        """See `Client.forget_subject`."""
        return int((await self._send(_calls.forget_subject(subject)))["forgotten"])

    def _timeout(self, wait: float | None) -> float:
        return self._settings.timeout + (wait or 0)
