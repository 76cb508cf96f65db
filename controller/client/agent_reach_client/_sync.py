"""The blocking client."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
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

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


class Client:
    """The controller's REST API, blocking. `base_url` and `api_key` default to the
    AGENT_REACH_URL and AGENT_REACH_API_KEY environment variables."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._settings = Settings.of(base_url, api_key, timeout, retries)
        self._http = httpx.Client(
            base_url=self._settings.base_url,
            headers=self._settings.headers(),
            timeout=timeout,
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call, *, read_timeout: float | None = None) -> Any:
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._http.request(
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
            time.sleep(delay)

    # --- tasks ------------------------------------------------------------------------------

    def submit(  # noqa: PLR0913 - the task's options, all by keyword
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
        """Submit a plan or a model's turn: `task_id`, `trace_id` and `status`; with `wait`, the
        whole task as it stands when it ended or the wait did (its `turn` for a model's turn).

        `subject` names the end user the task acts for (set in the body's `subject`): memory's
        tools (`memory.save`, `.search`, `.list`, `.forget`) act for it, and a task without one
        may not call them."""
        call = submit_call(
            body if subject is None else with_subject(body, subject),
            wait=wait,
            dialect=dialect,
            atomic=atomic,
            idempotency_key=idempotency_key,
            traceparent=traceparent,
        )
        return cast(Task, self._send(call, read_timeout=self._settings.timeout + (wait or 0)))

    def answer(
        self,
        turn: Any,
        *,
        within: float = 120.0,
        dialect: Dialect | None = None,
        idempotency_key: str | None = None,
    ) -> list[dict[str, Any]]:
        """Run a model's turn and return what to append to the conversation, once every call
        has its reply; PendingCalls if some still wait when `within` seconds end."""
        deadline = time.monotonic() + within
        accepted = self.submit(
            turn, dialect=dialect, idempotency_key=idempotency_key, wait=min(within, 30.0)
        )
        while True:
            left = deadline - time.monotonic()
            answered = self.replies(accepted["task_id"], wait=max(0.0, min(left, 30.0)))
            if not answered["pending"]:
                return answered["replies"]
            if left <= 0:
                raise PendingCalls(accepted["task_id"], answered["pending"])

    def replies(self, task_id: str, *, wait: float | None = None) -> Turn:
        """A turn's replies so far and its pending calls (`wait`: until it ends, at most)."""
        return cast(
            Turn, self._send(_calls.replies(task_id, wait), read_timeout=self._timeout(wait))
        )

    def task(self, task_id: str) -> Task:
        return cast(Task, self._send(_calls.task(task_id)))

    def wait(self, task_id: str, *, within: float = 120.0) -> Task:
        """The task once it ended (TimeoutError after `within` seconds), from its event stream."""
        deadline = time.monotonic() + within
        for _ in self.events(task_id, within=within):
            if time.monotonic() > deadline:
                break
        found = self.task(task_id)
        if found["status"] not in TERMINAL:
            raise TimeoutError(f"task {task_id} is still {found['status']}")
        return found

    def events(self, task_id: str, *, after: int = 0, within: float = 300.0) -> Iterator[Event]:
        """The task's events as they happen, until it ends; a dropped connection is resumed
        from the last event seen (Last-Event-ID)."""
        last = after
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                with self._http.stream(
                    "GET", f"/v1/tasks/{task_id}/events", headers=headers, timeout=within
                ) as response:
                    if not response.is_success:
                        response.read()
                        result(response)
                    parser = SseParser()
                    for line in response.iter_lines():
                        for kind, data, event_id in parser.feed(line):
                            if kind == "end":
                                return
                            event = cast(Event, json.loads(data))
                            last = int(event_id) if event_id else event["id"]
                            yield event
            except httpx.TransportError:
                pass
            time.sleep(0.5)  # the stream ended without `end`, or broke: resume from `last`

    def approve(
        self, task_id: str, step_id: str, *, reason: str = "", args: dict[str, Any] | None = None
    ) -> Task:
        body = _calls.approval(reason, args, approve=True)
        return cast(Task, self._send(_calls.decide(task_id, step_id, body)))

    def reject(self, task_id: str, step_id: str, *, reason: str) -> Task:
        body = _calls.approval(reason, None, approve=False)
        return cast(Task, self._send(_calls.decide(task_id, step_id, body)))

    def resolve(
        self, task_id: str, step_id: str, action: str, *, output: Any = None, reason: str = ""
    ) -> Task:
        body = _calls.verdict(action, output, reason)
        return cast(Task, self._send(_calls.resolve(task_id, step_id, body)))

    def cancel(self, task_id: str) -> Task:
        return cast(Task, self._send(_calls.cancel(task_id)))

    def tools(self, format: ToolFormat = "native") -> Any:
        """The catalogue (native), or the tools list a model API takes (`format`)."""
        return self._send(_calls.tools(format))

    # --- agents and runs --------------------------------------------------------------------

    def put_agent(
        self, name: str, profile: dict[str, Any], *, if_revision: int | None = None
    ) -> Agent:
        """Create or replace an agent's profile (a new revision; the same profile changes
        nothing). `if_revision`: only if the agent is still at that revision (else 412)."""
        return cast(Agent, self._send(_calls.put_agent(name, profile, if_revision)))

    def get_agent(self, name: str) -> Agent:
        return cast(Agent, self._send(_calls.agent(name)))

    def list_agents(self) -> list[Agent]:
        """The agents the key may run or administer."""
        return cast(list[Agent], self._send(_calls.agents())["agents"])

    def delete_agent(self, name: str, *, if_revision: int | None = None) -> None:
        self._send(_calls.delete_agent(name, if_revision))

    def start_run(  # noqa: PLR0913 - the run's parts, all by keyword
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
        """Start an agent run on `input` (text, or messages in the agent's endpoint's shape);
        with `wait`, the run as it stands when it ended or the wait did. It carries an
        Idempotency-Key (`idempotency_key`, else a new one), so a lost connection is retried
        without starting a second run."""
        body = _calls.run_body(agent, input, subject, context, limits)
        call = _calls.start_run(body, wait, idempotency_key)
        return cast(Run, self._send(call, read_timeout=self._timeout(wait)))

    def get_run(self, run_id: str, *, wait: float | None = None) -> Run:
        """A run with its conversation (`wait`: until it ends, at most)."""
        return cast(Run, self._send(_calls.run(run_id, wait), read_timeout=self._timeout(wait)))

    def list_runs(self, *, limit: int = 50, before: str | None = None) -> list[Run]:
        """The tenant's runs, newest first (`before`: older than this run id)."""
        return cast(list[Run], self._send(_calls.runs(limit, before))["runs"])

    def continue_run(self, run_id: str, input: RunInput, *, wait: float | None = None) -> Run:
        """The caller's next message to a run that ended: a new turn of the same conversation."""
        call = _calls.continue_run(run_id, input, wait)
        return cast(Run, self._send(call, read_timeout=self._timeout(wait)))

    def cancel_run(self, run_id: str) -> Run:
        return cast(Run, self._send(_calls.cancel_run(run_id)))

    # --- long-term memory -------------------------------------------------------------------

    def list_subjects(self, *, limit: int = 100, after: str | None = None) -> MemorySubjects:
        """The tenant's subjects by name, with how many memories each holds; `next_after` is
        the next page's `after` (None: no more)."""
        return cast(MemorySubjects, self._send(_calls.subjects(limit, after)))

    def list_memories(
        self, subject: str, *, types: Sequence[MemoryType] = (), limit: int = 100
    ) -> list[Memory]:
        """A subject's memories, the most recently updated first (`types`: only these)."""
        return cast(list[Memory], self._send(_calls.memories(subject, types, limit))["memories"])

    def search_memory(self, subject: str, query: str, *, limit: int = 10) -> list[Memory]:
        """A subject's memories that match `query`, best first, each with its `score`."""
        call = _calls.search_memory(subject, query, limit)
        return cast(list[Memory], self._send(call)["memories"])

    def put_memory(  # noqa: PLR0913 - an entry's fields, all by keyword
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
        """Remember `text` about `subject` (origin user). The same (subject, type, key) updates
        that entry: its `version` moves on, its history is in the audit log. A text or value that
        holds a secret is refused (ProblemError 422, pointer /body/text or /body/value)."""
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
        return cast(Memory, self._send(_calls.put_memory(body)))

    def get_memory(self, memory_id: str) -> Memory:
        return cast(Memory, self._send(_calls.memory(memory_id)))

    def patch_memory(
        self, memory_id: str, changes: dict[str, Any], *, if_version: int | None = None
    ) -> Memory:
        """Change some of text, value, pinned, confidence, expires_at; `{"origin": "user"}`
        confirms an entry a tool's output planted. `if_version`: only if the memory is still at
        that version (else ProblemError 412)."""
        return cast(Memory, self._send(_calls.patch_memory(memory_id, changes, if_version)))

    def forget_memory(self, memory_id: str) -> None:
        """Delete a memory for real: its text and value leave every table and index, and the
        copies its subject's runs made read "[forgotten]"."""
        self._send(_calls.forget_memory(memory_id))

    def forget_subject(self, subject: str) -> int:
        """Delete every memory of a subject; how many there were."""
        return int(self._send(_calls.forget_subject(subject))["forgotten"])

    def _timeout(self, wait: float | None) -> float:
        return self._settings.timeout + (wait or 0)
