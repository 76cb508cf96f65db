"""Every API operation as a Call (shared by the sync and async clients)."""

from __future__ import annotations

from typing import Any

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
