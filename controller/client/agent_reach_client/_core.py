"""What the sync and async clients share: requests as data, retries, answers, SSE lines."""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from agent_reach_client.errors import ProblemError

DEFAULT_URL = "http://127.0.0.1:8080"
USER_AGENT = "agent-reach-client/0.1"
# Statuses worth trying again: the controller took nothing (429 overloaded, 503 storage down or
# a replica stopping), as its problem documents say.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class Settings:
    base_url: str
    api_key: str | None
    timeout: float
    retries: int
    backoff: float = 0.5

    @classmethod
    def of(
        cls, base_url: str | None, api_key: str | None, timeout: float, retries: int
    ) -> Settings:
        return cls(
            base_url=(base_url or os.environ.get("AGENT_REACH_URL") or DEFAULT_URL).rstrip("/"),
            api_key=api_key or os.environ.get("AGENT_REACH_API_KEY"),
            timeout=timeout,
            retries=retries,
        )

    def headers(self) -> dict[str, str]:
        found = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.api_key:
            found["Authorization"] = f"Bearer {self.api_key}"
        return found


@dataclass(frozen=True, slots=True)
class Call:
    """One API request, as data: built once, sent (and retried) by either client."""

    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    # Safe to send again after a lost connection: reads, and writes with an Idempotency-Key.
    repeatable: bool = True


def submit_call(
    body: Any,
    *,
    wait: float | None,
    dialect: str | None,
    atomic: bool,
    idempotency_key: str | None,
    traceparent: str | None,
) -> Call:
    params: dict[str, Any] = {}
    if wait:
        params["wait"] = wait
    if dialect:
        params["dialect"] = dialect
    if atomic:
        params["atomic"] = "true"
    headers = {"Idempotency-Key": idempotency_key or f"client-{uuid.uuid4()}"}
    if traceparent:
        headers["traceparent"] = traceparent
    return Call("POST", "/v1/tasks", params=params, json=body, headers=headers)


def with_subject(body: Any, subject: str) -> Any:
    """The body with its task's `subject` (the end user it acts for) set: ValueError for a body
    that is not an object, or that names another subject."""
    if not isinstance(body, dict):
        raise ValueError("subject= needs a body that is a JSON object (a plan or a model's turn)")
    named = body.get("subject", subject)
    if named != subject:
        raise ValueError(f"the body names subject {named!r}, not {subject!r}")
    return {**body, "subject": subject}


def retry_delay(settings: Settings, attempt: int, response: httpx.Response | None) -> float | None:
    """Seconds before the next try of a call that got `response` (None: a lost connection), or
    None when it should not be tried again."""
    if attempt > settings.retries:
        return None
    if response is not None and response.status_code not in RETRY_STATUSES:
        return None
    asked = _retry_after(response) if response is not None else None
    if asked is not None:
        return min(asked, MAX_RETRY_AFTER_S)
    return random.uniform(0, settings.backoff * 2 ** (attempt - 1))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def result(response: httpx.Response) -> Any:
    """The JSON of a success; ProblemError for anything else."""
    if response.is_success:
        return response.json() if response.content else None
    try:
        problem = response.json()
    except ValueError:
        problem = {"detail": response.text[:500]}
    if not isinstance(problem, dict):
        problem = {"detail": str(problem)[:500]}
    raise ProblemError(response.status_code, problem)


class SseParser:
    """Server-Sent Events from lines: (event, data, id) for each message."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> Iterator[tuple[str, str, str | None]]:
        if line == "":
            if self._data:
                yield self._event, "\n".join(self._data), self._id
            self._event, self._data, self._id = "message", [], None
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
