"""Every API operation as a Call (shared by the sync and async clients)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from agent_reach_client._core import Call


def task(task_id: str) -> Call:
    return Call("GET", f"/v1/tasks/{task_id}")


def replies(task_id: str, wait: float | None) -> Call:
    return Call("GET", f"/v1/tasks/{task_id}/replies", params={"wait": wait} if wait else {})


def decide(task_id: str, step_id: str, body: dict[str, Any]) -> Call:
    return Call("POST", f"/v1/tasks/{task_id}/steps/{step_id}/approval", json=body)


def resolve(task_id: str, step_id: str, body: dict[str, Any]) -> Call:
    return Call("POST", f"/v1/tasks/{task_id}/steps/{step_id}/resolve", json=body)


def cancel(task_id: str) -> Call:
    return Call("POST", f"/v1/tasks/{task_id}/cancel")


def tools(format: str) -> Call:
    return Call("GET", "/v1/tools", params={"format": format})


def approval(reason: str, args: dict[str, Any] | None, *, approve: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"decision": "approve" if approve else "reject", "reason": reason}
    if args is not None:
        body["args"] = args
    return body


def verdict(action: str, output: Any, reason: str) -> dict[str, Any]:
    body: dict[str, Any] = {"action": action, "reason": reason}
    if output is not None:
        body["output"] = output
    return body


def _if_match(revision: int | None) -> dict[str, str]:
    return {} if revision is None else {"If-Match": f'"{revision}"'}


def _waiting(wait: float | None) -> dict[str, Any]:
    return {"wait": wait} if wait else {}


def agents() -> Call:
    return Call("GET", "/v1/agents")


def agent(name: str) -> Call:
    return Call("GET", f"/v1/agents/{name}")


def put_agent(name: str, profile: dict[str, Any], if_revision: int | None) -> Call:
    # The same profile again changes nothing: safe to send again.
    return Call("PUT", f"/v1/agents/{name}", json=profile, headers=_if_match(if_revision))


def delete_agent(name: str, if_revision: int | None) -> Call:
    return Call("DELETE", f"/v1/agents/{name}", headers=_if_match(if_revision))


def start_run(body: dict[str, Any], wait: float | None, idempotency_key: str | None) -> Call:
    # With its Idempotency-Key a POST sent again answers the first start's run: safe to repeat.
    headers = {"Idempotency-Key": idempotency_key or f"client-{uuid.uuid4()}"}
    return Call("POST", "/v1/runs", params=_waiting(wait), json=body, headers=headers)


def run_body(
    agent: str, input: Any, subject: str | None, context: Any, limits: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"agent": agent, "input": input}
    if subject is not None:
        body["subject"] = subject
    if context is not None:
        body["context"] = context
    if limits:
        body["limits"] = limits
    return body


def run(run_id: str, wait: float | None) -> Call:
    return Call("GET", f"/v1/runs/{run_id}", params=_waiting(wait))


def runs(limit: int, before: str | None) -> Call:
    params: dict[str, Any] = {"limit": limit}
    if before:
        params["before"] = before
    return Call("GET", "/v1/runs", params=params)


def continue_run(run_id: str, input: Any, wait: float | None) -> Call:
    return Call(
        "POST",
        f"/v1/runs/{run_id}/messages",
        params=_waiting(wait),
        json={"input": input},
        repeatable=False,
    )


def cancel_run(run_id: str) -> Call:
    return Call("POST", f"/v1/runs/{run_id}/cancel")


def subjects(limit: int, after: str | None) -> Call:
    params: dict[str, Any] = {"limit": limit}
    if after is not None:
        params["after"] = after
    return Call("GET", "/v1/memory/subjects", params=params)


def memories(subject: str, types: Sequence[str], limit: int) -> Call:
    params: dict[str, Any] = {"subject": subject, "limit": limit}
    if types:
        params["type"] = ",".join(types)
    return Call("GET", "/v1/memory", params=params)


def search_memory(subject: str, query: str, limit: int) -> Call:
    return Call("GET", "/v1/memory/search", params={"subject": subject, "q": query, "limit": limit})


def put_memory(body: dict[str, Any]) -> Call:
    # The same (subject, type, key) again updates that entry, never a second: safe to repeat.
    return Call("POST", "/v1/memory", json=body)


def memory_body(  # noqa: PLR0913 - an entry's fields, all by keyword at the client
    subject: str,
    type: str,
    key: str,
    text: str,
    *,
    value: Any,
    pinned: bool,
    confidence: float | None,
    expires_at: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"subject": subject, "type": type, "key": key, "text": text}
    if value is not None:
        body["value"] = value
    if pinned:
        body["pinned"] = True
    if confidence is not None:
        body["confidence"] = confidence
    if expires_at is not None:
        body["expires_at"] = expires_at
    return body


def memory(memory_id: str) -> Call:
    return Call("GET", f"/v1/memory/{quote(memory_id, safe='')}")


def patch_memory(memory_id: str, changes: dict[str, Any], if_version: int | None) -> Call:
    # Sent again after a lost connection it would fail its own If-Match (412): not repeated then.
    return Call(
        "PATCH",
        f"/v1/memory/{quote(memory_id, safe='')}",
        json=changes,
        headers=_if_match(if_version),
        repeatable=if_version is None,
    )


def forget_memory(memory_id: str) -> Call:
    return Call("DELETE", f"/v1/memory/{quote(memory_id, safe='')}")


def forget_subject(subject: str) -> Call:
    return Call("DELETE", "/v1/memory", params={"subject": subject})
